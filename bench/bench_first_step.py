"""Time to first step, split into stages: `orchestrate up --detach` beside a hand launch.

Two local workers on the bundled example (as bench_launch). Each stage is a separate pair of
processes started at once, timed from their start until both are done (or both printed "first
step done"); the differences between consecutive stages are the stages' costs. Stages alternate
within each repeat (rotating order), so that they share the machine's noise:

  python start       2x `python -c pass`
  + TF import        2x `python -c "import tensorflow"`
  + strategy         2x import and MultiWorkerMirroredStrategy() over TF_CONFIG (they connect)
  hand: first step   2x `python -m worker` by hand, until both printed "first step done"
  controller start   `python -m orchestrator --help`
  check              `python -m orchestrator check inv.yaml` (preflight, as `up` runs it)
  up returns         `orchestrate up --detach` until the command returned (preflight, launch)
  up: first step     the same run, until both workers printed "first step done"

    .venv/bin/python -m bench.bench_first_step [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.bench_launch import BATCH, by_hand, env, free_ports, tf_configs, wait_logs, worker_argv
from orchestrator.engine.locks import SupervisorLock

STEPS = 120  # wait_logs needs a logged rate after step 50
STRATEGY = "import tensorflow as tf; tf.distribute.MultiWorkerMirroredStrategy()"


def pair(code: str | None) -> float:
    """Two `python -c CODE` processes (with a shared TF_CONFIG) until both exit."""
    configs = tf_configs(free_ports())
    started = time.perf_counter()
    processes = [
        subprocess.Popen([sys.executable, "-c", code or "pass"], env={**env(), "TF_CONFIG": c},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for c in configs
    ]  # fmt: skip
    for process in processes:
        if process.wait(timeout=120):
            raise RuntimeError(f"{code} failed")
    return time.perf_counter() - started


def hand() -> float:
    """Two workers started by hand with hand-written TF_CONFIG (bench_launch's method)."""
    return by_hand(worker_argv(STEPS), STEPS).first_step_s


def inventory(root: Path) -> None:
    ports = free_ports()
    (root / "inv.yaml").write_text(
        "defaults: {connection: local, workdir: ./work}\nhosts:\n"
        f"  - {{name: w0, address: localhost, port: {ports[0]}}}\n"
        f"  - {{name: w1, address: localhost, port: {ports[1]}}}\n"
        f"job: {{name: bench, task: 'worker.examples.shapes:task', steps: {STEPS}, "
        f"batch_size: {BATCH}, checkpoint_every: {STEPS}}}\n"
    )


def orchestrator(*args: str) -> Callable[[], float]:
    def run() -> float:
        with tempfile.TemporaryDirectory() as scratch:
            inventory(Path(scratch))
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=scratch, env=env(),
                           check=True, capture_output=True)  # fmt: skip
            return time.perf_counter() - started

    return run


def up() -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        inventory(root)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "orchestrator", "up", "--detach", "inv.yaml"],
                       cwd=root, env=env(), check=True, capture_output=True)  # fmt: skip
        returned = time.perf_counter() - started
        attempt = next((root / "work" / "bench" / "runs").iterdir()) / "attempt-0"
        logs = [attempt / "w0" / "worker.log", attempt / "w1" / "worker.log"]
        first = wait_logs(logs, started, STEPS).first_step_s
        # Let the detached supervisor see the end and let go (it discards the standbys it
        # started after the first step) before the files go.
        lock = SupervisorLock(next((root / ".orchestrate" / "runs").glob("*.lock")))
        deadline = time.monotonic() + 60
        while lock.held_elsewhere() and time.monotonic() < deadline:
            time.sleep(0.1)
        return returned, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {}
    up_samples: list[tuple[float, float]] = []
    stages: dict[str, Callable[[], float]] = {
        "python start": lambda: pair(None),
        "+ TF import": lambda: pair("import tensorflow"),
        "+ strategy": lambda: pair(STRATEGY),
        "hand: first step": hand,
        "controller start": orchestrator("--help"),
        "check": orchestrator("check", "inv.yaml"),
        "up": lambda: -1.0,
    }
    names = list(stages)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            if name == "up":
                up_samples.append(up())
            else:
                samples.setdefault(name, []).append(stages[name]())
        print(f"repeat {repeat + 1} done", flush=True)
    samples["up returns"] = [r for r, _ in up_samples]
    samples["up: first step"] = [f for _, f in up_samples]
    m = {name: statistics.median(values) for name, values in samples.items()}
    print(f"\n{args.repeats} repeats, median [min max] s:")
    for name, values in samples.items():
        print(f"  {name:<18} {m[name]:6.2f} [{min(values):.2f} {max(values):.2f}]")
    print("hand launch:   python {:.2f} + import {:.2f} + strategy {:.2f} + model/data/first step "
          "{:.2f} = {:.2f}".format(m["python start"], m["+ TF import"] - m["python start"],
          m["+ strategy"] - m["+ TF import"], m["hand: first step"] - m["+ strategy"],
          m["hand: first step"]))  # fmt: skip
    print("orchestrate:   controller start {:.2f} + preflight {:.2f} + launch {:.2f} "
          "(up returned at {:.2f}); workers' first step at {:.2f}: {:+.2f} over the hand launch"
          .format(m["controller start"], m["check"] - m["controller start"],
                  m["up returns"] - m["check"], m["up returns"], m["up: first step"],
                  m["up: first step"] - m["hand: first step"]))  # fmt: skip


if __name__ == "__main__":
    main()
