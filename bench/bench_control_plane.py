"""The control plane at 1, 4, 16 and 64 hosts (issue 18): check, up --detach, a status poll, down.

One network-namespace cluster of max(--sizes) hosts (tests/cluster/netns.py, prefix `bcp`, always
removed) runs a trivial script job (train.py sleeps until SIGTERM). For each size N (the first N
hosts, one inventory and one state directory per size) every repeat runs three methods, in an
order that rotates from repeat to repeat so that they share the machine's noise:

    floor      `xargs -P N -I{} ssh -F ssh_config {} true` (bench_fanout's parallel OpenSSH floor)
    check      `python -m orchestrator check INVENTORY` as a new process: N*(N-1) port probes
    lifecycle  `python -m orchestrator up --detach INVENTORY` (preflight included, as a user runs
               it) until it returned: every worker launched and a detached supervisor polling;
               then, in this process, the supervisor's poll over open sessions: a HostBackend
               whose first collect_status opened one agent session per host (not timed), then
               POLLS timed polls (collect_status + the snapshot's JSON, what the supervisor does
               at each poll); then `python -m orchestrator down`, which returns once the workers
               and the supervisor have stopped

In the first repeat of each size, before this process opens its own sessions, the detached
supervisor's CPU is sampled over --cpu-window seconds from /proc/PID/stat: the supervisor, its
agent sessions on the hosts (`python -c <agent>`) and the sshd processes serving them; polls are
counted from the status snapshot the supervisor rewrites at each poll.

Every remote command of every method starts bash on the host, which reads the shared
/root/.bashrc (pyenv init, about 0.2 s of CPU): all methods pay it per command; the line after
the table says how much that costs at the largest size.

Run as root from the repository root, serialized with the other namespace users:

    flock /tmp/orchestrate-netns.lock .venv/bin/python -m bench.bench_control_plane \
        --repeats 3 --sizes 1,4,16,64

Only the cluster's own 10.231.0.x addresses are ever contacted; the cluster is always removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.bench_fanout import (
    COMMAND_TIMEOUT_S,
    SETTLE_S,
    BenchError,
    Target,
    header,
    login_shells_s,
    make_target,
    rotated,
    ssh_parallel,
    timed,
)
from orchestrator.backends.hosts.backend import HostBackend
from orchestrator.engine.observe.status import collect_status
from orchestrator.engine.store.runstore import RunStore
from orchestrator.model.vocabulary import WorkerState
from tests.cluster.inventories import host_entries, write_inventory
from tests.cluster.netns import NamespaceCluster, namespace_pids, unavailable_reason
from tests.conftest import clean_env

SIZES = (1, 4, 16, 64)
PREFIX = "bcp"
POLLS = 5
CPU_WINDOW_S = 10.0
TARGET_SIZE = 64
TARGETS = {"check": 1.3, "down": 1.2}  # x the floor's median
POLL_TARGET_S = 0.5
JOB = {"name": "bcp", "script": "train.py"}
# The product's default connect timeout, not the tests' 3 s: 64 handshakes at once on a loaded
# 2-core machine can take longer than 3 s, and a user would not have lowered it.
DEFAULTS = {"ssh_connect_timeout": 10}
SCRIPT = """\
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("started", flush=True)
while True:
    time.sleep(60)
"""
AGENT_MARK = '"""The host-side agent'
COLUMNS = ("floor", "check", "up --detach", "supervisor ready", "poll", "down")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Samples = dict[tuple[int, str], list[float]]


@dataclass(frozen=True)
class Setup:
    """One size: the inventory of the first n hosts, its own state directory, the cluster."""

    n: int
    inventory: Path
    target: Target
    cluster: NamespaceCluster

    @property
    def state_dir(self) -> Path:
        return self.inventory.parent / "state"


@dataclass
class CpuSample:
    polls: int
    seconds: float
    supervisor_s: float
    agents_s: float
    sshd_s: float


# --------------------------------------------------------------------------- the methods


def orchestrate(setup: Setup, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=setup.inventory.parent,
        env=clean_env(ORCHESTRATE_STATE_DIR=str(setup.state_dir), COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S * 3,
        check=False,
    )
    out = result.stdout + result.stderr
    if result.returncode != 0:
        raise BenchError(
            f"orchestrate {' '.join(args)} on {setup.n} host(s) exited {result.returncode}:\n"
            f"{out[-3000:]}"
        )
    return out


def check(setup: Setup) -> float:
    return timed(lambda: _expect(orchestrate(setup, "check", str(setup.inventory)), "passed"))


def floor(setup: Setup) -> float:
    return timed(lambda: ssh_parallel(setup.target, setup.n))


def _expect(out: str, word: str) -> str:
    if word not in out:
        raise BenchError(f"expected {word!r} in the output:\n{out[-3000:]}")
    return out


def supervisor_pid(out: str) -> int:
    found = re.search(r"supervisor \(pid (\d+)\)", out)
    if not found:
        raise BenchError(f"up --detach printed no supervisor pid:\n{out[-2000:]}")
    return int(found.group(1))


def lifecycle(setup: Setup, polls: int, cpu_window: float) -> dict[str, float | CpuSample]:
    """up --detach, [the supervisor's CPU], the poll over open sessions, down."""
    started = time.perf_counter()
    out = orchestrate(setup, "up", "--detach", str(setup.inventory))
    times: dict[str, float | CpuSample] = {"up --detach": time.perf_counter() - started}
    supervisor = supervisor_pid(out)
    try:
        # Its first poll opens one session per host (a login shell and a Python each); this
        # process's own sessions open after that, not in the same queue of login shells.
        started = time.perf_counter()
        wait_for_supervisor_sessions(setup)
        times["supervisor ready"] = time.perf_counter() - started
        if cpu_window > 0:
            times["cpu"] = supervisor_cpu(setup, supervisor, cpu_window)
        times["poll"] = poll_over_sessions(setup, polls)
    finally:
        started = time.perf_counter()
        _expect(orchestrate(setup, "down"), "is down")
        times["down"] = time.perf_counter() - started
    # `down` returns once the supervisor let go of the run; it then closes its sessions and
    # exits. Waited for (not timed) so that it does not overlap the next method.
    try:
        psutil.Process(supervisor).wait(timeout=60)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired as exc:
        raise BenchError(f"the supervisor (pid {supervisor}) outlived 'down' by 60 s") from exc
    return times


def wait_for_supervisor_sessions(setup: Setup, timeout: float = 180.0) -> None:
    """Until the supervisor's status snapshot shows every worker answering."""
    store = RunStore(setup.state_dir)
    snapshot = store.snapshot_path(store.load().run_id)
    deadline = time.monotonic() + timeout
    states: list[str] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            workers = json.loads(snapshot.read_text())["status"]["workers"]
            states = [w["state"] for w in workers]
            if len(states) == setup.n and set(states) <= {"starting", "running"}:
                return
        time.sleep(0.1)
    raise BenchError(f"the supervisor's hosts did not all answer within {timeout:g} s: {states}")


def poll_over_sessions(setup: Setup, polls: int) -> float:
    """Median time of the supervisor's poll (collect_status through sessions opened by a first,
    untimed poll, plus the snapshot's JSON) over `polls` polls."""
    record = RunStore(setup.state_dir).load()
    with HostBackend() as backend:
        first = collect_status(record, backend, backend.scheduler)
        started = (WorkerState.STARTING, WorkerState.RUNNING)  # a script reports no steps
        if any(w.state not in started for w in first.workers):
            states = {w.name: f"{w.state.value} {w.reason or ''}" for w in first.workers}
            raise BenchError(f"not every worker runs after up --detach: {states}")
        samples = []
        for _ in range(polls):
            start = time.perf_counter()
            status = collect_status(record, backend, backend.scheduler)
            json.dumps(status.to_json())
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# --------------------------------------------------------------------------- the supervisor's CPU


def _cpu_s(pid: int) -> float:
    """user + system CPU seconds of one process (children not included)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _poll_processes(setup: Setup) -> tuple[list[int], list[int]]:
    """The agent sessions (python -c <agent>) and the sshd session processes in the hosts."""
    agents, sshds = [], []
    for host in setup.cluster.hosts[: setup.n]:
        for pid in namespace_pids(host.namespace):
            try:
                proc = psutil.Process(pid)
                cmdline = proc.cmdline()
                name = proc.name()
            except psutil.Error:
                continue
            if len(cmdline) >= 3 and cmdline[1] == "-c" and AGENT_MARK in cmdline[2]:
                agents.append(pid)
            elif name == "sshd" and pid != host.sshd_pid:
                sshds.append(pid)
    return agents, sshds


def supervisor_cpu(setup: Setup, supervisor: int, window: float) -> CpuSample:
    snapshot = RunStore(setup.state_dir).snapshot_path(RunStore(setup.state_dir).load().run_id)
    deadline = time.monotonic() + 30
    agents: list[int] = []
    while time.monotonic() < deadline:  # the supervisor's sessions exist after its first poll
        agents, sshds = _poll_processes(setup)
        if len(agents) >= setup.n and snapshot.exists():
            break
        time.sleep(0.2)
    if len(agents) < setup.n:
        raise BenchError(f"found {len(agents)} agent sessions for {setup.n} hosts")
    time.sleep(1.0)  # past the first polls' start-up (psutil's first 0.2 s CPU sample)
    agents, sshds = _poll_processes(setup)
    groups = {"supervisor": [supervisor], "agents": agents, "sshd": sshds}
    before = {name: sum(map(_cpu_s, pids)) for name, pids in groups.items()}
    seen: set[float] = set()
    start = time.monotonic()
    while time.monotonic() - start < window:
        with contextlib.suppress(OSError, ValueError, KeyError):
            seen.add(json.loads(snapshot.read_text())["written_at"])
        time.sleep(0.05)
    seconds = time.monotonic() - start
    after = {name: sum(map(_cpu_s, pids)) for name, pids in groups.items()}
    used = {name: after[name] - before[name] for name in groups}
    return CpuSample(
        len(seen) - 1, seconds, used["supervisor"], used["agents"], used["sshd"]
    )  # the first snapshot seen was written before the window


# --------------------------------------------------------------------------- measuring


def measure(
    setups: Sequence[Setup], repeats: int, polls: int, cpu_window: float
) -> tuple[Samples, dict[int, CpuSample], list[str]]:
    methods = ("floor", "check", "lifecycle")
    samples: Samples = {(s.n, name): [] for s in setups for name in COLUMNS}
    cpu: dict[int, CpuSample] = {}
    loads: list[str] = []
    for setup in setups:  # warm-up, not recorded: page cache, imports, ARP
        floor(setup)
    lifecycle(setups[-1], 1, 0)
    for setup in setups:
        for repeat in range(repeats):
            for name in rotated(list(methods), repeat):
                time.sleep(SETTLE_S)
                if name == "lifecycle":
                    window = cpu_window if repeat == 0 else 0
                    times = lifecycle(setup, polls, window)
                    for column, value in times.items():
                        if isinstance(value, CpuSample):
                            cpu[setup.n] = value
                        else:
                            samples[setup.n, column].append(value)
                else:
                    samples[setup.n, name].append(check(setup) if name == "check" else floor(setup))
            loads.append(f"{setup.n}:{os.getloadavg()[0]:.1f}")
        print(f"  {setup.n:2d} host(s) done (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    return samples, cpu, loads


# --------------------------------------------------------------------------- reporting


def median(samples: Samples, n: int, name: str) -> float:
    return statistics.median(samples[n, name])


def table(samples: Samples, sizes: Sequence[int]) -> str:
    lines = [
        "| hosts | port probes | " + " | ".join(COLUMNS) + " |",
        "|---:|---:|" + "---:|" * len(COLUMNS),
    ]
    for n in sizes:
        cells = []
        for name in COLUMNS:
            cell = f"{median(samples, n, name):.3f} ({min(samples[n, name]):.3f})"
            if name in ("check", "up --detach", "down"):
                cell += f" x{median(samples, n, name) / median(samples, n, 'floor'):.2f}"
            cells.append(cell)
        lines.append(f"| {n} | {n * (n - 1)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_table(cpu: dict[int, CpuSample]) -> str:
    lines = [
        "| hosts | polls | window s | supervisor ms/poll | per host | agents ms/poll/host | "
        "sshd ms/poll/host |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, sample in sorted(cpu.items()):
        polls = max(sample.polls, 1)
        lines.append(
            f"| {n} | {sample.polls} | {sample.seconds:.1f} | "
            f"{sample.supervisor_s / polls * 1e3:.2f} | "
            f"{sample.supervisor_s / polls / n * 1e3:.3f} | "
            f"{sample.agents_s / polls / n * 1e3:.3f} | {sample.sshd_s / polls / n * 1e3:.3f} |"
        )
    return "\n".join(lines)


def verdicts(samples: Samples, sizes: Sequence[int]) -> list[str]:
    if TARGET_SIZE not in sizes:
        return [f"targets not evaluated: {TARGET_SIZE} hosts were not measured"]
    lines = []
    base = median(samples, TARGET_SIZE, "floor")
    for name, limit in TARGETS.items():
        ratio = median(samples, TARGET_SIZE, name) / base
        met = "MET" if ratio <= limit else "MISSED"
        lines.append(
            f"target at {TARGET_SIZE} hosts: {name} <= {limit}x floor: {met}, x{ratio:.2f}"
        )
    for name in TARGETS:  # the same repeat's floor, next to it in time: the machine's noise
        measured, floors = samples[TARGET_SIZE, name], samples[TARGET_SIZE, "floor"]
        pairs = [m / f for m, f in zip(measured, floors, strict=True)]
        lines.append(
            f"  paired per repeat, {name} / floor: {' '.join(f'{r:.2f}' for r in pairs)} "
            f"-> median {statistics.median(pairs):.2f}"
        )
    poll = median(samples, TARGET_SIZE, "poll")
    met = "MET" if poll <= POLL_TARGET_S else "MISSED"
    lines.append(f"target at {TARGET_SIZE} hosts: poll <= {POLL_TARGET_S} s: {met}, {poll:.3f} s")
    return lines


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method and size")
    parser.add_argument(
        "--sizes",
        type=lambda text: tuple(sorted(int(word) for word in text.split(","))),
        default=SIZES,
        help="host counts, comma-separated (default 1,4,16,64)",
    )
    parser.add_argument("--polls", type=int, default=POLLS, help="timed polls per lifecycle")
    parser.add_argument(
        "--cpu-window", type=float, default=CPU_WINDOW_S, help="seconds of supervisor CPU sampling"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or min(args.sizes) < 1 or args.polls < 1:
        parser.error("--repeats, --polls and every size must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="bench-cp-") as base,
        NamespaceCluster(max(args.sizes), PREFIX, base_dir=Path(base) / "cluster") as cluster,
    ):
        print(f"cluster of {len(cluster.hosts)} hosts up", file=sys.stderr, flush=True)
        target = make_target(cluster)
        entries = host_entries(cluster)
        setups = []
        for n in args.sizes:
            directory = Path(base) / f"n{n}"
            directory.mkdir()
            (directory / "train.py").write_text(SCRIPT)
            inventory = write_inventory(
                directory / "inv.yaml", cluster, JOB, hosts=entries[:n], defaults=DEFAULTS
            )
            setups.append(Setup(n, inventory, target, cluster))
        samples, cpu, loads = measure(setups, args.repeats, args.polls, args.cpu_window)
    print(header(args.repeats))
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}; "
          f"1-min after each size's repeats: {' '.join(loads)}")  # fmt: skip
    print()
    print(table(samples, args.sizes))
    print()
    print("\n".join(verdicts(samples, args.sizes)))
    print()
    print(cpu_table(cpu))
    biggest = max(args.sizes)
    print(
        f"\n{biggest} remote login shells at once, as sshd starts them: "
        f"{login_shells_s(biggest, as_sshd=True):.3f} s "
        f"({login_shells_s(biggest, as_sshd=False):.3f} s without ~/.bashrc); every remote "
        "command of every method pays this"
    )
    print(f"total benchmark time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
