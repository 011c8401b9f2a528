"""Benchmark for issue 10: how long each fault takes to detect, on two local script workers.

Each fault is injected into a running two-worker script job (a step every 20 ms, a progress file
and a "checkpoint" after every step) supervised in this process by the real Supervisor, with the
job's defaults except restart_backoff 0 and the stall_timeout given. Detection is the time from
the fault to the supervisor announcing the restart; "resumed" is the time until both workers of
the next attempt report a step again. Detection splits into "seen" (the fault to the supervisor
starting to stop the survivors: the exit told by the host, or the next poll) and the survivors'
stop. Faults:

  sigkill    SIGKILL to worker 1's process
  sigstop    SIGSTOP to worker 1 (frozen: only the stall watch sees it)
  exit0      worker 1 exits 0 at step 100 of 100000 (a false success)

    .venv/bin/python -m bench.bench_faults [--repeats 3] [--stall-timeout 5] [--interval 1]

The TensorFlow faults (partition, full disk, damaged checkpoint) are covered by the tests in
tests/integration/test_faults_*.py; recovery of a killed TensorFlow worker by bench_recovery.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator.backends.hosts.backend import HostBackend
from orchestrator.backends.registry import load_inventory
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run, stop_run
from orchestrator.fanout import GroupResult
from orchestrator.model.answers import BY_DOWN, StopAnswer
from orchestrator.model.records import WorkerRecord
from tests.conftest import free_ports

SCRIPT = """\
import json, os, sys, time
p = os.environ["ORCHESTRATE_PROGRESS_FILE"]
c = os.path.join(os.environ["ORCHESTRATE_CHECKPOINT_DIR"], os.environ["ORCHESTRATE_WORKER"])
os.makedirs(os.path.dirname(c), exist_ok=True)
start = int(open(c).read()) if os.path.exists(c) else 0
for step in range(start + 1, 100001):
    time.sleep(0.02)
    open(c + ".t", "w").write(str(step)); os.replace(c + ".t", c)
    json.dump({"step": step, "target_steps": 100000}, open(p + ".t", "w")); os.replace(p + ".t", p)
    if os.environ.get("EXIT0") and os.environ["ORCHESTRATE_WORKER"] == "b" and step == start + 100:
        sys.exit(0)
"""


class Done(Exception):
    pass


class MarkingBackend(HostBackend):
    """The real backend; the first stop after the fault marks when the supervisor saw it."""

    def __init__(self, marks: dict[str, float]) -> None:
        super().__init__()
        self.marks = marks

    def stop(
        self, workers: Sequence[WorkerRecord], grace: float, by: str = BY_DOWN
    ) -> GroupResult[str, StopAnswer]:
        if "fault" in self.marks and "seen" not in self.marks:
            self.marks["seen"] = time.monotonic()
        return super().stop(workers, grace, by)


def _step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def one(fault: str, stall_timeout: int, interval: float) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as scratch:
        root = Path(scratch)
        (root / "t.py").write_text(SCRIPT)
        ports = free_ports(2)
        env = "{EXIT0: '1'}" if fault == "exit0" else "{}"
        (root / "inv.yaml").write_text(
            textwrap.dedent(f"""\
            defaults: {{connection: local, workdir: ./w}}
            hosts:
              - {{name: a, address: localhost, port: {ports[0]}}}
              - {{name: b, address: localhost, port: {ports[1]}}}
            job: {{name: f, script: t.py, restart_backoff: 0, stall_timeout: {stall_timeout},
                   max_restarts: 5, env: {env}}}
            """)
        )
        store = RunStore(root / "state")
        marks: dict[str, float] = {}
        with MarkingBackend(marks) as backend:
            record = start_run(load_inventory(root / "inv.yaml"), store, backend)

            def show(status: object) -> None:
                steps = [w.step or 0 for w in status.workers]  # type: ignore[attr-defined]
                if "restart" in marks and status.attempt > 0 and min(steps) > 0:  # type: ignore[attr-defined]
                    marks["resumed"] = time.monotonic()
                    raise Done

            def say(message: str) -> None:
                if "restarting the cluster" in message and "restart" not in marks:
                    marks["restart"] = time.monotonic()

            def inject() -> None:
                # The workers' own files, read here: a probe through a new agent session each
                # time (as before) started a Python every 50 ms beside the run and slowed the
                # very detection measured (0.15 s of "seen" on 2 loaded cores).
                run_dirs = [Path(w.run_dir) for w in record.workers]
                while not all(_step(run_dir) >= 20 for run_dir in run_dirs):
                    time.sleep(0.05)
                pid = int((run_dirs[1] / "worker.pid").read_text())
                marks["fault"] = time.monotonic()
                if fault == "sigkill":
                    os.kill(pid, signal.SIGKILL)
                elif fault == "sigstop":
                    os.kill(pid, signal.SIGSTOP)

            if fault != "exit0":
                threading.Thread(target=inject, daemon=True).start()
            else:
                marks["fault"] = time.monotonic() + 100 * 0.02  # step 100 of the first attempt
            try:
                Supervisor(store, backend, record, show=show, say=say, interval=interval).run()
            except Done:
                pass
            finally:
                stop_run(store.load(record.run_id), backend, grace=2)
        seen = marks.get("seen", marks["restart"]) - marks["fault"]
        return seen, marks["restart"] - marks["fault"], marks["resumed"] - marks["fault"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stall-timeout", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--faults", default="sigkill,sigstop,exit0")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the start")
    print(f"{'fault':<9} {'detected s (median, min-max)':<30} {'seen s':>8} {'stop s':>8} "
          f"{'resumed s (median)':>20}")  # fmt: skip
    for fault in args.faults.split(","):
        samples = [one(fault, args.stall_timeout, args.interval) for _ in range(args.repeats)]
        seen = statistics.median(s[0] for s in samples)
        detect = [s[1] for s in samples]
        stop = statistics.median(s[1] - s[0] for s in samples)
        resume = [s[2] for s in samples]
        spread = f"{statistics.median(detect):.3f} ({min(detect):.3f}-{max(detect):.3f})"
        print(f"{fault:<9} {spread:<30} {seen:>8.3f} {stop:>8.3f} "
              f"{statistics.median(resume):>20.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
