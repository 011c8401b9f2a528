"""Fan-out over SSH (issue 3): how long `orchestrate` takes to reach N hosts and start a command.

One 16-host network-namespace cluster (tests/cluster/netns.py) is built, then for N = 1, 4, 16
(the first N hosts) every method runs once per repeat, in an order that rotates from repeat to
repeat so that all methods share the machine's noise:

    orchestrate       a fresh Machines() (new connections, like a new `orchestrate` command),
                      fan_out(hosts, runner.run(["true"])), all ok, then close()
    orchestrate agent the same with HostAgent.info(): Python starts on each host (`up` does this)
    OpenSSH serial    `ssh -F ssh_config hostN true`, one host after the other
    OpenSSH parallel  `xargs -P N -I{} ssh -F ssh_config {} true`, the floor to compare with
    ... curve25519    the same with KexAlgorithms=curve25519-sha256, the key exchange paramiko gets
    OpenSSH agent     reference: every `ssh host python -c AGENT info` started at once (Popen all,
                      then wait), to tell the agent's Python start-up from orchestrate's overhead

Each time covers connecting, running and closing. Run as root from the repository root:

    .venv/bin/python -m bench.bench_fanout [--repeats 5]

Only the cluster's own 10.231.0.x addresses are ever contacted; the cluster is always removed.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import platform
import pwd
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from orchestrator.backends.hosts.backend import HostBackend
from orchestrator.fanout import fan_out
from orchestrator.machines.hostclient import agent_source
from orchestrator.machines.runner import CommandResult
from orchestrator.machines.sshsettings import SshSettings
from orchestrator.model.inventory import WorkerSlot
from tests.cluster.netns import BRIDGE_ADDRESS, SUBNET, NamespaceCluster, unavailable_reason

SIZES = (1, 4, 16)
PREFIX = "bench"
TARGET_RATIO = 1.2
TARGET_SIZE = 16
FLOOR = "OpenSSH parallel"
CURVE25519_FLOOR = "OpenSSH parallel curve25519"
SETTLE_S = 0.2  # lets the previous method's sshd children exit before the next one starts
COMMAND_TIMEOUT_S = 60.0
# OpenSSH 9.x picks the post-quantum sntrup761x25519 by default; paramiko (no sntrup) gets
# curve25519. This variant shows how much of the gap is the key exchange alone.
CURVE25519 = ("-o", "KexAlgorithms=curve25519-sha256")

Samples = dict[tuple[int, str], list[float]]


class BenchError(RuntimeError):
    """A method failed on some host: its time would be meaningless."""


@dataclass(frozen=True)
class Target:
    """The cluster as each method needs it: inventory hosts for orchestrate, names for ssh."""

    hosts: tuple[WorkerSlot, ...]
    names: tuple[str, ...]
    ssh_config: Path

    def ssh(self, name: str, *command: str, options: Sequence[str] = ()) -> list[str]:
        # -F replaces ~/.ssh/config and /etc/ssh/ssh_config; the options repeat what the
        # generated file already says, so a changed generator can't loosen the checks silently.
        return [
            "ssh",
            "-F",
            str(self.ssh_config),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "ControlMaster=no",
            *options,
            name,
            *command,
        ]


def make_target(cluster: NamespaceCluster) -> Target:
    for host in cluster.hosts:
        if ipaddress.IPv4Address(host.address) not in SUBNET:
            raise BenchError(f"{host.name} has {host.address}, outside the cluster's {SUBNET}")
    hosts = tuple(
        WorkerSlot(
            name=host.name,
            address=host.address,
            port=20000,
            settings=SshSettings(
                ssh_user="root",
                ssh_key=str(cluster.client_key_path),
                ssh_known_hosts=str(cluster.known_hosts_path),
            ),
            python=sys.executable,
        )
        for host in cluster.hosts
    )
    names = tuple(host.name for host in cluster.hosts)
    return Target(hosts, names, cluster.ssh_config_path)


# --------------------------------------------------------------------------- the methods


def _check_ok(result: CommandResult) -> CommandResult:
    if not result.ok:
        raise BenchError(f"{result.host}: 'true' exited {result.exit_code}: {result.tail(3)}")
    return result


def orchestrate(
    hosts: Sequence[WorkerSlot], action: Callable[[HostBackend, WorkerSlot], object]
) -> None:
    machines = HostBackend()
    try:
        fan_out(hosts, lambda host: action(machines, host)).raise_if_failed("benchmark")
    finally:
        machines.close()


def orchestrate_true(target: Target, n: int) -> None:
    def action(machines: HostBackend, host: WorkerSlot) -> object:
        return _check_ok(machines.runner(host).run(["true"], timeout=COMMAND_TIMEOUT_S))

    orchestrate(target.hosts[:n], action)


def orchestrate_agent(target: Target, n: int) -> None:
    orchestrate(target.hosts[:n], lambda machines, host: machines.agent(host).info())


def ssh_serial(target: Target, n: int) -> None:
    for name in target.names[:n]:
        result = subprocess.run(
            target.ssh(name, "true"),
            check=False,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        if result.returncode != 0:
            raise BenchError(f"ssh {name} true exited {result.returncode}: {result.stderr}")


def ssh_parallel(target: Target, n: int, options: Sequence[str] = ()) -> None:
    argv = ["xargs", "-P", str(n), "-I{}", *target.ssh("{}", "true", options=options)]
    result = subprocess.run(
        argv,
        check=False,
        input="\n".join(target.names[:n]) + "\n",
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    if result.returncode != 0:
        raise BenchError(f"xargs ssh exited {result.returncode}: {result.stderr}")


def ssh_parallel_agent(target: Target, n: int) -> None:
    # Popen rather than xargs: xargs -I would substitute the "{}" inside the agent's source.
    # The request travels on stdin, as orchestrate sends it.
    remote = shlex.join([sys.executable, "-c", agent_source()]) + ' <<< \'{"verb": "info"}\''
    pipe = subprocess.PIPE
    procs = [
        (name, subprocess.Popen(target.ssh(name, remote), stdout=pipe, stderr=pipe, text=True))
        for name in target.names[:n]
    ]
    for name, proc in procs:
        out, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        if proc.returncode != 0:
            raise BenchError(f"ssh {name} agent info exited {proc.returncode}: {err}")
        json.loads(out.strip().splitlines()[-1])


METHODS: dict[str, Callable[[Target, int], None]] = {
    "orchestrate": orchestrate_true,
    "orchestrate agent": orchestrate_agent,
    "OpenSSH serial": ssh_serial,
    FLOOR: ssh_parallel,
    CURVE25519_FLOOR: partial(ssh_parallel, options=CURVE25519),
    "OpenSSH agent": ssh_parallel_agent,
}


# --------------------------------------------------------------------------- measuring


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def rotated(names: Sequence[str], shift: int) -> list[str]:
    shift %= len(names)
    return [*names[shift:], *names[:shift]]


def measure(target: Target, sizes: Sequence[int], repeats: int) -> Samples:
    names = list(METHODS)
    for name in names:  # warm-up, not recorded: page cache, first-import and ARP costs
        METHODS[name](target, max(sizes))
    samples: Samples = {(n, name): [] for n in sizes for name in names}
    for n in sizes:
        for repeat in range(repeats):
            for name in rotated(names, repeat):
                time.sleep(SETTLE_S)
                samples[n, name].append(timed(partial(METHODS[name], target, n)))
        print(f"  {n:2d} host(s) done", file=sys.stderr, flush=True)
    return samples


def import_cost_s() -> float:
    """What a real `orchestrate` process pays once before connecting: importing Fabric/paramiko."""

    def run(code: str) -> float:
        return timed(lambda: subprocess.run([sys.executable, "-c", code], check=True))

    bare = min(run("pass") for _ in range(3))
    return min(run("import orchestrator.machines.ssh") for _ in range(3)) - bare


def login_shells_s(n: int, *, as_sshd: bool) -> float:
    """n of this user's login shells running `true` at once. sshd runs every command through
    that shell with SSH_CLIENT set, which makes bash read ~/.bashrc; the namespace hosts share
    this machine's home directory, so whatever that file does, every method pays per command."""
    user = pwd.getpwuid(os.getuid())
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "PATH": "/usr/bin:/bin"}
    if as_sshd:
        env["SSH_CLIENT"] = f"{BRIDGE_ADDRESS} 50000 22"

    def run_all() -> None:
        argv = [user.pw_shell, "-c", "true"]
        devnull = subprocess.DEVNULL
        procs = [subprocess.Popen(argv, env=env, stdout=devnull, stderr=devnull) for _ in range(n)]
        for proc in procs:
            proc.wait(timeout=COMMAND_TIMEOUT_S)

    return min(timed(run_all) for _ in range(3))


# --------------------------------------------------------------------------- reporting


def cell(samples: Samples, n: int, name: str) -> str:
    median = statistics.median(samples[n, name])
    return f"{median:.3f} ({min(samples[n, name]):.3f}) x{ratio(samples, n, name):.2f}"


def table(samples: Samples, sizes: Sequence[int]) -> str:
    names = list(METHODS)
    lines = [
        "| hosts | " + " | ".join(names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    for n in sizes:
        lines.append(f"| {n} | " + " | ".join(cell(samples, n, name) for name in names) + " |")
    return "\n".join(lines)


def ratio(samples: Samples, n: int, name: str, floor: str = FLOOR) -> float:
    return statistics.median(samples[n, name]) / statistics.median(samples[n, floor])


def verdict(samples: Samples, sizes: Sequence[int]) -> str:
    if TARGET_SIZE not in sizes:
        return f"target not evaluated: {TARGET_SIZE} hosts were not measured"
    main = ratio(samples, TARGET_SIZE, "orchestrate")
    same_kex = ratio(samples, TARGET_SIZE, "orchestrate", CURVE25519_FLOOR)
    met = "MET" if main <= TARGET_RATIO else "MISSED"
    return (
        f"target at {TARGET_SIZE} hosts (orchestrate median <= {TARGET_RATIO}x parallel "
        f"OpenSSH median): {met}, ratio {main:.2f} ({same_kex:.2f} against {CURVE25519_FLOOR})"
    )


def header(repeats: int) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{now}; {os.cpu_count()} CPUs, {platform.platform()}, Python "
        f"{platform.python_version()}; {repeats} repeats; cells: median s (min s) xratio "
        f"to the {FLOOR} median"
    )


def notes(n: int) -> list[str]:
    """Costs outside the table that explain it: measured after the cluster is gone."""
    rc_s, bare_s = login_shells_s(n, as_sshd=True), login_shells_s(n, as_sshd=False)
    return [
        f"once per orchestrate process, not in the table: import orchestrator.machines.ssh "
        f"{import_cost_s():.3f} s",
        f"{n} remote login shells at once, as sshd starts them: {rc_s:.3f} s "
        f"({bare_s:.3f} s without SSH_CLIENT, i.e. without ~/.bashrc); every method pays this",
    ]


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per method and size")
    parser.add_argument(
        "--sizes",
        type=lambda text: tuple(int(word) for word in text.split(",")),
        default=SIZES,
        help="host counts, comma-separated (default 1,4,16)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or min(args.sizes) < 1:
        parser.error("--repeats and every size must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="bench-fanout-") as base,
        NamespaceCluster(max(args.sizes), PREFIX, base_dir=Path(base)) as cluster,
    ):
        print(f"cluster of {len(cluster.hosts)} hosts up", file=sys.stderr, flush=True)
        samples = measure(make_target(cluster), args.sizes, args.repeats)
    print(header(args.repeats))
    print()
    print(table(samples, args.sizes))
    print()
    print(verdict(samples, args.sizes))
    print("\n".join(notes(max(args.sizes))))
    print(f"total benchmark time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
