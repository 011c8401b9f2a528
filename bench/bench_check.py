"""Preflight check (issue 4): how long `orchestrate check` takes on N hosts, N² port probes too.

One 16-host network-namespace cluster (tests/cluster/netns.py, prefix `bcheck`, always removed) is
built, then for N = 1, 4, 16 an inventory of the first N hosts with a trivial script job is written
and every method runs once per repeat, in an order that rotates from repeat to repeat so that all
methods share the machine's noise:

    orchestrate check  `python -m orchestrator check INVENTORY` as a user runs it: a new process,
                       so Python start-up and imports (Fabric/paramiko, click, rich) are included
    run_preflight      in-process run_preflight(load_inventory(INVENTORY), HostBackend()): the work
                       itself, three rounds over fresh connections (inspect / connect / cleanup);
                       no blocking finding, and every host reachable from all others when N > 1
    OpenSSH parallel   `xargs -P N -I{} ssh -F ssh_config {} true` (bench_fanout's floor: the cost
                       of reaching the hosts at all)

Target: at 16 hosts, check's median at most 2x the floor's median; judged for both check methods.
After the last repeat, every namespace must listen on :22 only (no probe listener left behind).
A split of run_preflight's rounds at the largest size follows the table.

Run as root from the repository root (about 2 minutes):

    .venv/bin/python -m bench.bench_check [--repeats 5]

Only the cluster's own 10.231.0.x addresses are ever contacted; the cluster is always removed.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.bench_fanout import (
    COMMAND_TIMEOUT_S,
    FLOOR,
    SETTLE_S,
    BenchError,
    Target,
    header,
    import_cost_s,
    login_shells_s,
    make_target,
    parse_args,
    rotated,
    ssh_parallel,
    timed,
)
from orchestrator.backends.hosts.backend import HostBackend
from orchestrator.backends.hosts.checks import run_preflight
from orchestrator.backends.registry import load_inventory
from orchestrator.machines.runner import LineSession
from orchestrator.model.findings import PreflightReport, Status
from orchestrator.model.inventory import Inventory, WorkerSlot
from tests.cluster.inventories import host_entries, write_inventory
from tests.cluster.netns import NamespaceCluster, unavailable_reason
from tests.conftest import clean_env

SIZES = (1, 4, 16)
PREFIX = "bcheck"
TARGET_RATIO = 2.0
TARGET_SIZE = 16
CLI = "orchestrate check"
INPROCESS = "run_preflight"
JOB = {"name": "bench", "script": "train.py"}
ROUNDS = ("inspect", "connect", "cleanup")
SPLIT_REPEATS = 3  # runs of the round split, after the table (keeps the total near 3 minutes)

Samples = dict[tuple[int, str], list[float]]


@dataclass(frozen=True)
class Setup:
    """One size: the inventory of the first n hosts, and the cluster target for OpenSSH."""

    n: int
    inventory: Path
    target: Target


# --------------------------------------------------------------------------- the methods


def verify(report: PreflightReport, inventory: Inventory) -> None:
    n = len(inventory.hosts)
    if report.blocking:
        lines = "; ".join(f"{f.host} {f.check}: {f.detail}" for f in report.blocking)
        raise BenchError(f"preflight on {n} host(s) found blocking problems: {lines}")
    if n > 1:
        ok = {f.host for f in report.findings if f.check == "reachable" and f.status is Status.OK}
        missing = [host.name for host in inventory.hosts if host.name not in ok]
        if missing:
            raise BenchError(f"no 'reachable' ok finding for {', '.join(missing)}")


def check_cli(setup: Setup) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "check", str(setup.inventory)],
        cwd=setup.inventory.parent,
        env=clean_env(ORCHESTRATE_STATE_DIR=str(setup.inventory.parent / "state")),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0 or "preflight passed" not in result.stderr + result.stdout:
        raise BenchError(
            f"orchestrate check on {setup.n} host(s) exited {result.returncode}:\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )


def check_inprocess(setup: Setup, machines: HostBackend | None = None) -> None:
    inventory = load_inventory(setup.inventory)
    with machines or HostBackend() as opened:
        report = run_preflight(inventory, opened)
    verify(report, inventory)


METHODS: dict[str, Callable[[Setup], None]] = {
    CLI: check_cli,
    INPROCESS: check_inprocess,
    FLOOR: lambda setup: ssh_parallel(setup.target, setup.n),
}


# --------------------------------------------------------------------------- where the time goes


class _TimedSession(LineSession):
    """Records (verb, start, end) of each request it serves."""

    def __init__(self, session: LineSession, spans: list[tuple[str, float, float]]) -> None:
        self.__dict__.update(session.__dict__)
        self._spans = spans

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            return super().request(message, timeout)
        finally:
            self._spans.append((message["verb"], start, time.perf_counter()))  # atomic append


class TimedMachines(HostBackend):
    """A backend whose preflight sessions record (verb, start, end) of each request."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[tuple[str, float, float]] = []

    def preflight_session(self, host: WorkerSlot) -> LineSession:
        return _TimedSession(super().preflight_session(host), self.spans)


def round_split(setup: Setup, repeats: int) -> dict[str, float]:
    """Median wall time of each round (first call started to last call ended), plus the total.
    The inspect round includes opening the SSH connections (they open lazily on first use)."""
    split: dict[str, list[float]] = {name: [] for name in (*ROUNDS, "total")}
    for _ in range(min(repeats, SPLIT_REPEATS)):
        time.sleep(SETTLE_S)
        machines = TimedMachines()
        split["total"].append(timed(partial(check_inprocess, setup, machines)))
        for verb in ROUNDS:
            mine = [span for span in machines.spans if span[0] == verb]
            split[verb].append(max(e for _, _, e in mine) - min(s for _, s, _ in mine))
    return {name: statistics.median(values) for name, values in split.items()}


# --------------------------------------------------------------------------- measuring


def measure(setups: Sequence[Setup], repeats: int) -> Samples:
    names = list(METHODS)
    for name in names:  # warm-up, not recorded: page cache, first-import and ARP costs
        METHODS[name](setups[-1])
    samples: Samples = {(s.n, name): [] for s in setups for name in names}
    for setup in setups:
        for repeat in range(repeats):
            for name in rotated(names, repeat):
                time.sleep(SETTLE_S)
                samples[setup.n, name].append(timed(partial(METHODS[name], setup)))
        print(f"  {setup.n:2d} host(s) done", file=sys.stderr, flush=True)
    return samples


def leftover_listeners(cluster: NamespaceCluster) -> dict[str, list[str]]:
    """Per host, every listening TCP socket other than sshd's :22 (empty when all is clean)."""
    found = {}
    for host in cluster.hosts:
        out = cluster.exec_in(host, ["ss", "-Hltn"], capture_output=True, text=True, check=True)
        local = [line.split()[3] for line in out.stdout.splitlines() if line.strip()]
        extra = [address for address in local if address.rsplit(":", 1)[1] != "22"]
        if extra:
            found[host.name] = extra
    return found


# --------------------------------------------------------------------------- reporting


def median(samples: Samples, n: int, name: str) -> float:
    return statistics.median(samples[n, name])


def ratio(samples: Samples, n: int, name: str) -> float:
    return median(samples, n, name) / median(samples, n, FLOOR)


def table(samples: Samples, sizes: Sequence[int]) -> str:
    names = list(METHODS)
    lines = [
        "| hosts | port probes | " + " | ".join(names) + " |",
        "|---:|---:|" + "---:|" * len(names),
    ]
    for n in sizes:
        cells = [
            f"{median(samples, n, name):.3f} ({min(samples[n, name]):.3f}) "
            f"x{ratio(samples, n, name):.2f}"
            for name in names
        ]
        lines.append(f"| {n} | {n * (n - 1)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(samples: Samples, sizes: Sequence[int]) -> list[str]:
    if TARGET_SIZE not in sizes:
        return [f"target not evaluated: {TARGET_SIZE} hosts were not measured"]
    lines = []
    for name in (CLI, INPROCESS):
        value = ratio(samples, TARGET_SIZE, name)
        met = "MET" if value <= TARGET_RATIO else "MISSED"
        lines.append(
            f"target at {TARGET_SIZE} hosts ({name} median <= {TARGET_RATIO:g}x {FLOOR} median): "
            f"{met}, ratio {value:.2f}"
        )
    return lines


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    sizes = sorted(args.sizes)
    with (
        tempfile.TemporaryDirectory(prefix="bench-check-") as base,
        NamespaceCluster(max(sizes), PREFIX, base_dir=Path(base) / "cluster") as cluster,
    ):
        print(f"cluster of {len(cluster.hosts)} hosts up", file=sys.stderr, flush=True)
        target = make_target(cluster)
        entries = host_entries(cluster)
        setups = []
        for n in sizes:
            directory = Path(base) / f"n{n}"
            directory.mkdir()
            (directory / "train.py").write_text("print('trained')\n")
            inventory = write_inventory(directory / "inv.yaml", cluster, JOB, hosts=entries[:n])
            setups.append(Setup(n, inventory, target))
        samples = measure(setups, args.repeats)
        split = round_split(setups[-1], args.repeats)
        leftovers = leftover_listeners(cluster)
    print(header(args.repeats))
    print()
    print(table(samples, sizes))
    print()
    print("\n".join(verdicts(samples, sizes)))
    print(
        f"run_preflight rounds at {sizes[-1]} hosts (median s): "
        + ", ".join(f"{name} {split[name]:.3f}" for name in (*ROUNDS, "total"))
        + " (inspect includes opening the SSH connections)"
    )
    print(
        f"once per orchestrate process, not in {INPROCESS}: import orchestrator.machines.ssh "
        f"{import_cost_s():.3f} s"
    )
    rc_s = login_shells_s(sizes[-1], as_sshd=True)
    bare_s = login_shells_s(sizes[-1], as_sshd=False)
    print(
        f"{sizes[-1]} remote login shells at once, as sshd starts them: {rc_s:.3f} s "
        f"({bare_s:.3f} s without ~/.bashrc); check pays this 3 times (one command per round), "
        "the floor once"
    )
    if leftovers:
        print(f"LEFT LISTENING after the runs: {leftovers}")
    else:
        print(f"no listener left: every one of the {len(cluster.hosts)} hosts listens on :22 only")
    print(
        f"total benchmark time {time.perf_counter() - started:.0f} s; 1-minute load average "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after (other work on this machine "
        "shifts every column)"
    )
    return 1 if leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
