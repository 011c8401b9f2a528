"""Try `orchestrate` on a multi-host cluster made of network namespaces on this one Linux box.

Run as root from the repository root (needs iproute2 and openssh-server:
scripts/ci-system-deps.sh installs them):

    python -m tests.cluster up --hosts 3 --dir /tmp/orch-cluster
    ssh -F /tmp/orch-cluster/ssh_config host1 hostname -I
    python -m tests.cluster down --dir /tmp/orch-cluster

`up` builds the hosts (10.231.0.11, .12, ...; the bridge is 10.231.0.1), starts one sshd per
host, prints how to log in and exits: the sshd daemons keep running. The state goes to
DIR/cluster.json, which `down` reads. `cleanup --prefix P` removes what a crashed run left
behind (namespaces, bridge, veths, sshd) when the state file is gone.

Only one cluster can exist at a time: 10.231.0.0/24 is fixed and must be unused on this box.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tests.cluster.netns import (
    STATE_FILE,
    ClusterError,
    NamespaceCluster,
    cleanup_leftovers,
    list_links,
)

# A different default from the tests' "orch": a test run's leftover cleanup never removes a
# cluster someone brought up by hand.
CLI_PREFIX = "orup"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster",
        description="Network-namespace hosts with their own sshd, on this Linux machine.",
        epilog="Example: python -m tests.cluster up --hosts 3 --dir /tmp/orch-cluster",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create the hosts and start their sshd, then exit")
    up.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    up.add_argument("--dir", type=Path, required=True, help="directory for keys, configs, state")
    up.add_argument("--prefix", default=CLI_PREFIX, help=f"name prefix (default {CLI_PREFIX})")
    down = sub.add_parser("down", help="tear down the cluster recorded in DIR/cluster.json")
    down.add_argument("--dir", type=Path, required=True)
    cleanup = sub.add_parser("cleanup", help="remove leftovers of clusters with this prefix")
    cleanup.add_argument("--prefix", default=CLI_PREFIX, help=f"(default {CLI_PREFIX})")
    return parser


def _up(hosts: int, base_dir: Path, prefix: str) -> None:
    if (base_dir / STATE_FILE).exists():
        old = NamespaceCluster.from_state(base_dir)
        if old.bridge in list_links():
            raise ClusterError(
                f"a cluster is already up in {base_dir} (bridge {old.bridge}); "
                f"run: python -m tests.cluster down --dir {base_dir}"
            )
    cluster = NamespaceCluster(hosts, prefix, base_dir=base_dir).start()
    print(f"cluster {cluster.tag}: bridge {cluster.bridge}, {len(cluster.hosts)} hosts")
    for host in cluster.hosts:
        print(f"  {host.name:8} {host.address:14} netns {host.namespace:16} workdir {host.workdir}")
    print(f"client key:   {cluster.client_key_path}")
    print(f"known_hosts:  {cluster.known_hosts_path}")
    print(f"ssh_config:   {cluster.ssh_config_path}")
    first = cluster.hosts[0]
    example = [
        "ssh",
        "-i",
        str(cluster.client_key_path),
        "-o",
        f"UserKnownHostsFile={cluster.known_hosts_path}",
        "-o",
        "StrictHostKeyChecking=yes",
        f"root@{first.address}",
        "true",
    ]
    print(f"try:          {shlex.join(example)}")
    print(f"or:           ssh -F {cluster.ssh_config_path} {first.name} hostname -I")
    print(f"in a host:    ip netns exec {first.namespace} bash")
    print(f"tear down:    python -m tests.cluster down --dir {base_dir}")


def _down(base_dir: Path) -> None:
    cluster = NamespaceCluster.from_state(base_dir)
    cluster.stop()
    print(f"cluster {cluster.tag} removed (files in {base_dir} kept: keys, configs, sshd logs)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "up":
            _up(args.hosts, args.dir, args.prefix)
        elif args.command == "down":
            _down(args.dir)
        else:
            removed = cleanup_leftovers(args.prefix, include_live=True)
            print("removed: " + (", ".join(removed) if removed else "nothing"))
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
