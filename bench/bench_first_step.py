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
  second up          (job.linger, issue 32) a first `up` ran to its end in the same directory
                     and its lingering standbys have imported TensorFlow (the user editing);
                     its checkpoints are removed (a fresh start, as by hand); then
                     `orchestrate up --detach` again, timed like "up", split by the arrival
                     of the workers' log lines: hand-over ("warm start"), strategy and
                     checkpoint lookup ("no checkpoint"), first step

    .venv/bin/python -m bench.bench_first_step [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.bench_launch import BATCH, by_hand, env, free_ports, tf_configs, wait_logs, worker_argv
from orchestrator.engine.supervision.locks import SupervisorLock

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


def inventory(root: Path, linger: int = 0) -> None:
    """`linger: 0` but for the second-up method: no run leaves standbys to the next sample."""
    ports = free_ports()
    (root / "inv.yaml").write_text(
        "defaults: {connection: local, workdir: ./work}\nhosts:\n"
        f"  - {{name: w0, address: localhost, port: {ports[0]}}}\n"
        f"  - {{name: w1, address: localhost, port: {ports[1]}}}\n"
        f"job: {{name: bench, task: 'worker.examples.shapes:task', steps: {STEPS}, "
        f"batch_size: {BATCH}, checkpoint_every: {STEPS}, linger: {linger}}}\n"
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


MARKS = {"hand-over": "orchestrate: warm start", "strategy": "worker: no checkpoint",
         "first step": "first step done"}  # fmt: skip


def orchestrate(root: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=root, env=env(),
                          check=True, capture_output=True, text=True)  # fmt: skip
    return done.stdout


def lingering_ready(root: Path) -> bool:
    standbys = json.loads(orchestrate(root, "status", "--json"))["standbys"]
    return len(standbys) == 2 and all(s["lingering"] and s["ready"] for s in standbys)


def second_up() -> tuple[float, dict[str, float]]:
    """A first `up` to its end, its standbys lingering and ready; then the timed second `up`:
    when it returned, and when both workers' logs showed each of MARKS."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        inventory(root, linger=300)
        orchestrate(root, "up", "--skip-checks", "inv.yaml")
        deadline = time.monotonic() + 120
        while not lingering_ready(root):
            if time.monotonic() > deadline:
                raise TimeoutError("the first run's standbys did not linger ready")
            time.sleep(0.2)
        shutil.rmtree(root / "work" / "bench" / "checkpoints")  # a fresh start, as by hand
        first_run = (root / ".orchestrate" / "current").read_text().strip()
        started = time.perf_counter()
        orchestrate(root, "up", "--detach", "inv.yaml")
        returned = time.perf_counter() - started
        run_id = (root / ".orchestrate" / "current").read_text().strip()
        assert run_id != first_run
        attempt = root / "work" / "bench" / "runs" / run_id / "attempt-0"
        logs = [attempt / "w0" / "worker.log", attempt / "w1" / "worker.log"]
        seen: dict[str, dict[Path, float]] = {mark: {} for mark in MARKS}
        while len(seen["first step"]) < 2:
            if time.perf_counter() - started > 300:
                raise TimeoutError(f"no first step in {logs}")
            for log in logs:
                text = log.read_text() if log.exists() else ""
                for mark, needle in MARKS.items():
                    if log not in seen[mark] and needle in text:
                        seen[mark][log] = time.perf_counter() - started
            time.sleep(0.01)
        text = "".join(log.read_text() for log in logs)
        if "left lingering" not in text:
            raise RuntimeError(f"the second up did not take the lingering standbys: {logs}")
        wait_logs(logs, started, STEPS)
        lock = SupervisorLock(root / ".orchestrate" / "runs" / f"{run_id}.lock")
        deadline = time.monotonic() + 60
        while lock.held_elsewhere() and time.monotonic() < deadline:
            time.sleep(0.1)
        orchestrate(root, "down")  # its own standbys linger: discarded before the files go
        return returned, {mark: max(times.values()) for mark, times in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {}
    up_samples: list[tuple[float, float]] = []
    second_samples: list[tuple[float, dict[str, float]]] = []
    stages: dict[str, Callable[[], float]] = {
        "python start": lambda: pair(None),
        "+ TF import": lambda: pair("import tensorflow"),
        "+ strategy": lambda: pair(STRATEGY),
        "hand: first step": hand,
        "controller start": orchestrator("--help"),
        "check": orchestrator("check", "inv.yaml"),
        "up": lambda: -1.0,
        "second up": lambda: -1.0,
    }
    names = list(stages)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            if name == "up":
                up_samples.append(up())
            elif name == "second up":
                second_samples.append(second_up())
            else:
                samples.setdefault(name, []).append(stages[name]())
        print(f"repeat {repeat + 1} done", flush=True)
    samples["up returns"] = [r for r, _ in up_samples]
    samples["up: first step"] = [f for _, f in up_samples]
    samples["second up returns"] = [r for r, _ in second_samples]
    for mark in MARKS:
        samples[f"second up: {mark}"] = [marks[mark] for _, marks in second_samples]
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

    second = m["second up: first step"]
    print("second up:     returned {:.2f}; hand-over {:.2f}, strategy and checkpoint lookup "
          "{:.2f}, first step {:.2f}: {:.2f}x the hand launch (goal <= 0.5x)"
          .format(m["second up returns"], m["second up: hand-over"], m["second up: strategy"],
                  second, second / m["hand: first step"]))  # fmt: skip
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
