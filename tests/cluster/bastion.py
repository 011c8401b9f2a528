"""A bastion in front of training hosts the controller cannot reach, from network namespaces.

    root namespace (controller)       namespace <tag>_h1 (the bastion)
    bridge <tag>_br 10.233.1.1/24 ──── eth0 10.233.1.10
                                      bridge br1 10.233.2.1/24 ──── <tag>_h2: eth0 10.233.2.11
                                                               └─── <tag>_h3: eth0 10.233.2.12

The second bridge lives inside the bastion's own namespace, and that namespace forwards
nothing (ip_forward is 0 in a new namespace): the root namespace has no route to 10.233.2.0/24
and no way to it but an SSH jump through the bastion. Each namespace runs its own sshd.

`ssh_config` (in base_dir) names the bastion `bastion` and the training hosts `train1`,
`train2`, each with `ProxyJump bastion`: `ssh -F base_dir/ssh_config train1` works.

While it exists, the root namespace holds `unreachable 10.233.2.0/24`: a connection attempt
from the controller straight to a training host fails at once, and no packet for that subnet
can leave through a default route to a real network.

The subnets 10.233.1.0/24 and 10.233.2.0/24 are this topology's own (the plain cluster uses
10.231.0.0/24, so both can exist at once); `start()` refuses when either is in use in the root
namespace. Everything is torn down by `stop()`, as for NamespaceCluster, whose machinery (keys,
sshd, teardown, leftovers by prefix) this reuses.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

from tests.cluster import netns
from tests.cluster.netns import ClusterError, ClusterHost, NamespaceCluster

OUTER = ipaddress.IPv4Network("10.233.1.0/24")
INNER = ipaddress.IPv4Network("10.233.2.0/24")
OUTER_BRIDGE = "10.233.1.1"
BASTION = "10.233.1.10"
INNER_BRIDGE = "10.233.2.1"
FIRST_TRAINER = ipaddress.IPv4Address("10.233.2.11")
PREFIX = "orchb"
_PROBE = (
    "import socket,sys\n"
    "try:\n"
    "    s=socket.create_connection((sys.argv[1],22),timeout=0.5); s.settimeout(0.5)\n"
    "    sys.exit(0 if s.recv(4).startswith(b'SSH-') else 1)\n"
    "except OSError:\n"
    "    sys.exit(1)\n"
)


def subnets_in_use() -> list[str]:
    users = []
    for link in netns._ip_json("-4", "addr", "show"):
        for info in link.get("addr_info", []):
            network = ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network
            if network.overlaps(OUTER) or network.overlaps(INNER):
                users.append(f"address {info['local']}/{info['prefixlen']} on {link['ifname']}")
    for route in netns._ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "")
        if dst not in ("", "default"):
            network = ipaddress.ip_network(dst, strict=False)
            if network.overlaps(OUTER) or network.overlaps(INNER):
                users.append(f"route {dst} dev {route.get('dev', '?')}")
    return users


def remove_guard_route() -> None:
    netns._run([netns._tool("ip"), "route", "del", "unreachable", str(INNER)], check=False)


def remove_leftovers() -> list[str]:
    """What a crashed run left: its namespaces and links (by prefix), then the guard route."""
    removed = netns.cleanup_leftovers(PREFIX)
    ours = any(ns.startswith(f"{PREFIX}-") for ns in netns.list_namespaces())
    routes = netns._ip_json("-4", "route", "show")
    guard = any(r.get("dst") == str(INNER) and r.get("type") == "unreachable" for r in routes)
    if guard and not ours:
        remove_guard_route()
        removed.append(f"route unreachable {INNER}")
    return removed


class BastionCluster(NamespaceCluster):
    """hosts[0] is the bastion; hosts[1:] are the training hosts behind it."""

    def __init__(self, trainers: int = 2, *, base_dir: Path, prefix: str = PREFIX) -> None:
        super().__init__(trainers + 1, prefix, base_dir=base_dir)

    guard_route = False

    def stop(self, *, verify: bool = True) -> None:
        try:
            super().stop(verify=verify)
        finally:
            if self.guard_route:
                remove_guard_route()
                self.guard_route = False

    @property
    def bastion(self) -> ClusterHost:
        return self.hosts[0]

    @property
    def trainers(self) -> list[ClusterHost]:
        return self.hosts[1:]

    def _plan_host(self, index: int) -> ClusterHost:
        host = super()._plan_host(index)
        if index == 1:
            host.name, host.address = "bastion", BASTION
        else:
            host.name, host.address = f"train{index - 1}", str(FIRST_TRAINER + (index - 2))
        host.workdir = self.base_dir / host.name / "work"
        host.sshd_dir = self.base_dir / host.name / "sshd"
        return host

    def start(self) -> BastionCluster:
        reason = netns.unavailable_reason()
        if reason:
            raise ClusterError(reason)
        self._ip = netns._tool("ip")
        netns._check_root_account_unlocked()
        used = subnets_in_use()
        if used:
            raise ClusterError(
                f"{OUTER} or {INNER} is in use here ({'; '.join(used)}); a crashed run's "
                "leftovers go with tests.cluster.bastion.remove_leftovers()"
            )
        try:
            netns._run([self._ip, "route", "add", "unreachable", str(INNER)])
            self.guard_route = True
            self._prepare_files()
            self._create_network()
            self._start_all_sshd()
            self._write_known_hosts()
            self._write_ssh_config()
            self.write_state()
        except BaseException:
            self.stop(verify=False)
            raise
        return self

    def _create_network(self) -> None:
        ip = self._ip
        netns._run([ip, "link", "add", "name", self.bridge, "type", "bridge"])
        netns._run([ip, "addr", "add", f"{OUTER_BRIDGE}/24", "dev", self.bridge])
        netns._run([ip, "link", "set", "dev", self.bridge, "up"])
        if netns._bridge_netfilter_needs_rule():
            netns._run([netns._tool("iptables"), "-w", "-I",
                        *netns._forward_rule(self.bridge, self.tag)])  # fmt: skip
            self.iptables_rule = True
        self._create_host_network(self.bastion)
        inside = self.bastion.namespace
        batch = ["link add name br1 type bridge", f"addr add {INNER_BRIDGE}/24 dev br1",
                 "link set dev br1 up"]  # fmt: skip
        netns._run([ip, "-n", inside, "-batch", "-"], stdin="\n".join(batch) + "\n")
        for host in self.trainers:
            netns._run([ip, "netns", "add", host.namespace])
            peer = ["peer", "name", "eth0", "netns", host.namespace]
            netns._run([ip, "link", "add", "name", host.veth, "type", "veth", *peer])
            # The host's end goes into the bastion's namespace, onto its private bridge.
            netns._run([ip, "link", "set", "dev", host.veth, "netns", inside])
            netns._run([ip, "-n", inside, "link", "set", "dev", host.veth, "master", "br1", "up"])
            commands = ["link set dev lo up", f"addr add {host.address}/24 dev eth0",
                        "link set dev eth0 up"]  # fmt: skip
            netns._run([ip, "-n", host.namespace, "-batch", "-"], stdin="\n".join(commands) + "\n")

    def _finish_sshd_start(self, host: ClusterHost, proc: subprocess.Popen[str]) -> None:
        if host is self.bastion:
            super()._finish_sshd_start(host, proc)
            return
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise ClusterError(f"sshd for {host.name} exited {proc.returncode}: {out.strip()}")

        def answers() -> bool:  # probed from the bastion: the root namespace cannot reach it
            probe = [sys.executable, "-c", _PROBE, host.address]
            return self.exec_in(self.bastion, probe, capture_output=True).returncode == 0

        if not netns._wait_until(answers, 15.0):
            raise ClusterError(f"sshd for {host.name} did not answer; "
                               f"{netns._log_tail(host.sshd_log_path)}")  # fmt: skip
        if not netns._wait_until(host.sshd_pid_path.exists, 15.0):
            raise ClusterError(f"sshd for {host.name} wrote no pid file")
        host.sshd_pid = int(host.sshd_pid_path.read_text().strip())

    def _write_ssh_config(self) -> None:
        common = [
            "    User root",
            f"    IdentityFile {self.client_key_path}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {self.known_hosts_path}",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
        ]
        blocks = [["Host bastion", f"    HostName {self.bastion.address}", *common]]
        for host in self.trainers:
            blocks.append(
                [
                    f"Host {host.name}",
                    f"    HostName {host.address}",
                    "    ProxyJump bastion",
                    *common,
                ]
            )
        self.ssh_config_path.write_text("\n\n".join("\n".join(b) for b in blocks) + "\n")
