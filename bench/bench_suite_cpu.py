"""Where a command's CPU goes, by kind of process: the test suite's, for instance.

Runs COMMAND in a cpuacct cgroup of its own (every process it starts is counted, however deep,
unless something moves it out: Docker's containers go to Docker's own cgroups), reads each of
the cgroup's processes from /proc every 0.1 s, and prints, at the end, the CPU seconds of each
kind of process (TensorFlow workers, each `orchestrate` subcommand, the host-side programs,
pytest, pip, ...), with the cgroup's own total beside what the samples saw (a process that lives
less than 0.1 s is missed, or counted short), then the cores the whole cgroup used, minute by
minute (where the machine was not kept busy). Root only (it makes a cgroup), cgroup v1's cpuacct
controller (as on the development machines):

    .venv/bin/python -m bench.bench_suite_cpu --json /tmp/ci-cpu.json -- bash .ci/run
    .venv/bin/python -m bench.bench_suite_cpu --report /tmp/ci-cpu.json     # the table again

docs/development.md ("Where the CPU goes") has what it showed for the whole suite.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
INTERVAL_S = 0.1
TIMELINE_BIN_S = 60
TICK = os.sysconf("SC_CLK_TCK")
SUBCOMMAND = re.compile(
    r"(?:-m orchestrator|bin/orchestrate)\s+(?:--state-dir\s+\S+\s+)?(?:-\S+\s+)*([a-z][a-z-]*)"
)
# Checked in order: the first that the command line contains names its kind. These come before
# the `orchestrate` subcommands (a worker's or a host program's command line may hold the word).
PROGRAM_KINDS = (
    (" -m worker", "TensorFlow or JAX worker (python -m worker)"),
    ("# orchestrate boot", "a job's script, started through the stack-dump boot"),
    ("worker.evaluate", "worker.evaluate"),
    ("# orchestrate:", "host-side program (agent, probe, minder)"),
)
# Then these, after the subcommands.
TOOL_KINDS = (
    ("tensorboard", "TensorBoard"),
    ("exec(eval(sys.stdin", "pytest lane process (xdist)"),
    ("pytest", "pytest"),
    ("pip", "pip"),
    ("mlflow", "MLflow server"),
    ("wandb", "wandb"),
    ("mypy", "mypy"),
    ("ruff", "ruff"),
    ("mkdocs", "mkdocs"),
    ("chrom", "Chromium"),
    ("docker", "Docker"),
    ("slurm", "Slurm"),
    ("srun", "Slurm"),
    ("sshd", "sshd"),
)


def kind_of(command: str) -> str:
    for marker, kind in PROGRAM_KINDS:
        if marker in command:
            return kind
    subcommand = SUBCOMMAND.search(command)
    if subcommand:
        return f"orchestrate {subcommand.group(1)}"
    if re.search(r"/attempt-\d+/|/standby/", command):
        return "host-side program (agent, probe, minder)"
    for marker, kind in TOOL_KINDS:
        if marker in command:
            return kind
    return "other"


def processes_in(cgroup: Path) -> set[str]:
    """The processes of `cgroup` and of the cgroups below it (the test suite makes one per
    pytest process: tests/lanecpu.py), which its own cgroup.procs does not list."""
    found: set[str] = set()
    for directory, _, files in os.walk(cgroup):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):  # a child cgroup removed meanwhile
                found.update((Path(directory) / "cgroup.procs").read_text().split())
    return found


def sample(
    cgroup: Path, seen: dict[str, list[Any]], usage: list[float], stop: threading.Event
) -> None:
    """Every INTERVAL_S: each process of `cgroup`, its CPU so far and its command line; every
    second, the cgroup's CPU so far (`usage`, one value a second)."""
    began = time.monotonic()
    while not stop.wait(INTERVAL_S):
        if time.monotonic() - began >= len(usage):
            usage.append(int((cgroup / "cpuacct.usage").read_text()) / 1e9)
        for pid in processes_in(cgroup):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                cpu = (int(fields[11]) + int(fields[12])) / TICK
                key = f"{pid}:{fields[19]}"  # the pid and its start time: pids are reused
                if key not in seen:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                    seen[key] = [cpu, raw.replace(b"\0", b" ").decode(errors="replace")[:300]]
                seen[key][0] = cpu
            except (OSError, ValueError, IndexError):
                continue  # it ended between the listing and the read


def run(command: list[str], out: Path) -> int:
    if not CPUACCT.is_dir() or os.geteuid() != 0:
        sys.exit(f"bench_suite_cpu: needs root and cgroup v1's cpuacct at {CPUACCT}")
    cgroup = CPUACCT / f"bench-suite-cpu-{os.getpid()}"
    cgroup.mkdir()
    seen: dict[str, list[Any]] = {}
    usage: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(cgroup, seen, usage, stop), daemon=True)
    sampler.start()
    # The shell joins the cgroup, then becomes the command: everything it starts is counted.
    joined = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *command]
    status = subprocess.run(joined, check=False).returncode
    stop.set()
    sampler.join()
    total = int((cgroup / "cpuacct.usage").read_text()) / 1e9
    out.write_text(json.dumps({"total_cpu_s": total, "processes": seen, "usage_each_s": usage}))
    with contextlib.suppress(OSError):  # something it started still runs: the cgroup stays
        cgroup.rmdir()
    return status


def report(path: Path, rows: int) -> None:
    data = json.loads(path.read_text())
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for cpu, command in data["processes"].values():
        tally = by_kind[kind_of(command)]
        tally[0] += cpu
        tally[1] += 1
    total = data["total_cpu_s"]
    sampled = sum(cpu for cpu, _ in by_kind.values())
    print(f"CPU in all {total:.0f} s (the cgroup's); the samples saw {sampled:.0f} s")
    print(f"{'CPU (s)':>8} {'share':>6} {'processes':>9} {'each (s)':>8}  kind")
    ranked = sorted(by_kind.items(), key=lambda item: -item[1][0])
    for kind, (cpu, count) in ranked[:rows]:
        print(f"{cpu:8.0f} {cpu / total:6.1%} {count:9.0f} {cpu / count:8.2f}  {kind}")
    timeline(data.get("usage_each_s", []))


def timeline(usage: list[float]) -> None:
    """Cores in use, on average, in each TIMELINE_BIN_S of the run (a bar of 20 per core)."""
    if len(usage) <= TIMELINE_BIN_S:
        return
    print(f"cores in use, each {TIMELINE_BIN_S} s from the start")
    for start in range(0, len(usage) - TIMELINE_BIN_S, TIMELINE_BIN_S):
        cores = (usage[start + TIMELINE_BIN_S] - usage[start]) / TIMELINE_BIN_S
        print(f"{start:6d} s {cores:5.2f} {'#' * round(cores * 20)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("suite-cpu.json"), help="samples file")
    parser.add_argument("--report", type=Path, help="print the table of an earlier run's file")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("command", nargs="*", help="the command to measure, after --")
    args = parser.parse_args()
    if args.report:
        report(args.report, args.rows)
        return
    if not args.command:
        parser.error("give a command after --, or --report FILE")
    status = run(args.command, args.json)
    report(args.json, args.rows)
    sys.exit(status)


if __name__ == "__main__":
    main()
