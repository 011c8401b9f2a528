"""Benchmark for the core issue, side by side in one run, two local workers on localhost:

  (a) launch: `orchestrate up --detach` versus the same `python -m worker` started by hand as two
      processes with hand-written TF_CONFIG (the TensorFlow tutorial's way);
  (b) loop: the built-in training loop (started by hand) versus a minimal hand-written MWMS loop
      (bench/minimal_mwms.py) on the same model and data.

Time to first step: from the launch until both workers have printed "first step done".
Steps/s: the chief's logged rate over the windows after the first one (warm-up excluded).
Methods alternate within each repeat so they share the machine's noise; medians are reported.

    .venv/bin/python -m bench.bench_launch [--repeats 3] [--steps 400]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH = 64
LOG_EVERY = 50
RATE = re.compile(r"^step (\d+) .*steps/s ([0-9.]+)")


@dataclass(frozen=True)
class Sample:
    first_step_s: float
    steps_per_s: float


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    # One TF thread pool thread per worker: two workers on two cores otherwise oversubscribe the
    # machine and the rates swing by ±20% from run to run, hiding any real difference.
    threads = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    # No run leaves standbys lingering into the next sample (job.linger; an inventory that sets
    # `linger:` still gets it: bench_first_step's second up).
    return {**clean, **threads, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO), "ORCHESTRATE_LINGER": "0"}  # fmt: skip


def free_ports() -> list[int]:
    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def tf_configs(ports: list[int]) -> list[str]:
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    tasks = [{"type": "worker", "index": index} for index in (0, 1)]
    return [json.dumps({"cluster": cluster, "task": task}) for task in tasks]


def wait_logs(logs: list[Path], started: float, steps: int, timeout: float = 300) -> Sample:
    """Poll both logs until both finished; the time both first printed 'first step done'."""
    first: dict[Path, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        texts = {log: log.read_text() if log.exists() else "" for log in logs}
        for log, text in texts.items():
            if log not in first and "first step done" in text:
                first[log] = time.perf_counter() - started
        if all(f"finished at step {steps}" in text for text in texts.values()):
            return Sample(max(first.values()), chief_rate(texts[logs[0]]))
        time.sleep(0.01)
    raise TimeoutError(f"workers did not finish: {logs}")


def chief_rate(text: str) -> float:
    rates = [float(m[2]) for m in map(RATE.match, text.splitlines()) if m and int(m[1]) > LOG_EVERY]
    return statistics.mean(rates)


def by_hand(argv_for: Callable[[Path], list[str]], steps: int) -> Sample:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        logs = [root / f"w{i}.log" for i in (0, 1)]
        started = time.perf_counter()
        processes = []
        for index, config in enumerate(tf_configs(free_ports())):
            with logs[index].open("w") as log:
                processes.append(
                    subprocess.Popen(
                        argv_for(root),
                        env={**env(), "TF_CONFIG": config},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=root,
                    )
                )
        sample = wait_logs(logs, started, steps)
        for process in processes:
            process.wait(timeout=60)
        return sample


def worker_argv(steps: int) -> Callable[[Path], list[str]]:
    def argv(root: Path) -> list[str]:
        return [
            sys.executable, "-m", "worker", "--task", "worker.examples.shapes:task",
            "--steps", str(steps), "--batch-size", str(BATCH), "--log-every", str(LOG_EVERY),
            "--checkpoint-every", str(steps), "--checkpoint-dir", str(root / "ckpt"),
        ]  # fmt: skip

    return argv


def minimal_argv(steps: int) -> Callable[[Path], list[str]]:
    script = str(REPO / "bench" / "minimal_mwms.py")
    return lambda root: [sys.executable, script, str(steps), str(BATCH), str(LOG_EVERY)]


def orchestrated(steps: int) -> Sample:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        ports = free_ports()
        (root / "inv.yaml").write_text(
            "defaults: {connection: local, workdir: ./work}\n"
            "hosts:\n"
            f"  - {{name: w0, address: localhost, port: {ports[0]}}}\n"
            f"  - {{name: w1, address: localhost, port: {ports[1]}}}\n"
            "job: {name: bench, task: 'worker.examples.shapes:task', "
            f"steps: {steps}, batch_size: {BATCH}, log_every: {LOG_EVERY}, "
            f"checkpoint_every: {steps}}}\n"
        )
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "orchestrator", "up", "--detach", "inv.yaml"],
            cwd=root, env=env(), check=True, capture_output=True,
        )  # fmt: skip
        runs = root / "work" / "bench" / "runs"
        run_dir = next(runs.iterdir())
        attempt = run_dir / "attempt-0"
        sample = wait_logs([attempt / "w0" / "worker.log", attempt / "w1" / "worker.log"], started,
                           steps)  # fmt: skip
        # Let the detached supervisor see the end before the directories go.
        for _ in range(100):
            state = subprocess.run(
                [sys.executable, "-m", "orchestrator", "status", "--json"],
                cwd=root, env=env(), capture_output=True, text=True, check=False,
            )  # fmt: skip
            if '"state": "succeeded"' in state.stdout:
                break
            time.sleep(0.1)
        return sample


def table(results: dict[str, list[Sample]], baseline: str) -> list[str]:
    base_first = statistics.median(s.first_step_s for s in results[baseline])
    base_rate = statistics.median(s.steps_per_s for s in results[baseline])
    lines = [f"{'method':<34} {'first step s':>12} {'vs':>7} {'steps/s':>9} {'vs':>7}"]
    for name, samples in results.items():
        first = statistics.median(s.first_step_s for s in samples)
        rate = statistics.median(s.steps_per_s for s in samples)
        lines.append(
            f"{name:<34} {first:>12.2f} {first / base_first - 1:>+7.1%} "
            f"{rate:>9.1f} {rate / base_rate - 1:>+7.1%}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    hand, orchestrate, minimal = (
        "by hand: python -m worker x2",
        "orchestrate up --detach",
        "by hand: minimal MWMS loop x2",
    )
    methods: dict[str, Callable[[], Sample]] = {
        hand: lambda: by_hand(worker_argv(args.steps), args.steps),
        orchestrate: lambda: orchestrated(args.steps),
        minimal: lambda: by_hand(minimal_argv(args.steps), args.steps),
    }
    results: dict[str, list[Sample]] = {name: [] for name in methods}
    for repeat in range(args.repeats):
        for name, method in methods.items():
            sample = method()
            results[name].append(sample)
            print(f"repeat {repeat + 1}: {name}: first step {sample.first_step_s:.2f} s, "
                  f"{sample.steps_per_s:.1f} steps/s", flush=True)  # fmt: skip
    print(f"\n(a) launch, {args.repeats} repeats, {args.steps} steps, medians:")
    print("\n".join(table({k: results[k] for k in (hand, orchestrate)}, hand)))
    print("\n(b) training loop:")
    print("\n".join(table({k: results[k] for k in (minimal, hand)}, minimal)))


if __name__ == "__main__":
    main()
