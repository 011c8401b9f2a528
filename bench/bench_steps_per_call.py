"""steps/s of the built-in loop at --steps-per-call 1 and 10 beside the minimal MWMS loop, and
where a step's time goes, side by side in one run.

Every method trains the bundled example (global batch 64, per-replica batch 32) started by hand,
one TF thread pool thread per worker (as bench_launch). Methods alternate within each repeat,
the order rotating from repeat to repeat, so that they share the machine's noise:

  minimal x2       bench/minimal_mwms.py on two workers: the target's reference
  built-in K=1 x2  python -m worker on two workers, one step per tf.function call
  built-in K=10 x2 the same with --steps-per-call 10
  built-in K=1 x1  one worker alone (no TF_CONFIG), global batch 32: the same per-replica work,
  built-in K=10 x1 no cross-worker collective

Per-step time t = 1 / steps/s (the chief's logged rate after the first window). The split, from
the medians:

  Python dispatch per call  (t[K=1 x2] - t[K=10 x2]) * 10/9  (what 9 of 10 calls saved)
  collective per step       t[K=10 x2] - t[K=10 x1]           (two workers minus one, same work)
  compute per step          t[K=10 x1] - dispatch / 10

    .venv/bin/python -m bench.bench_steps_per_call [--repeats 7] [--steps 600]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.bench_launch import BATCH, REPO, chief_rate, env, free_ports, tf_configs

LOG_EVERY = 50


def run_workers(argv: list[str], workers: int, steps: int) -> float:
    """The chief's mean logged steps/s; waits for every worker to finish."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        configs = tf_configs(free_ports()) if workers == 2 else [None]
        processes, logs = [], []
        for index, config in enumerate(configs):
            log = root / f"w{index}.log"
            logs.append(log)
            extra = {"TF_CONFIG": config} if config else {}
            with log.open("w") as out:
                processes.append(
                    subprocess.Popen(
                        [*argv, "--checkpoint-dir", str(root / "ckpt")] if "-m" in argv else argv,
                        env={**env(), **extra},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=root,
                    )
                )
        for process in processes:
            if process.wait(timeout=600):
                raise RuntimeError(f"{argv} failed:\n{logs[0].read_text()[-3000:]}")
        text = logs[0].read_text()
        if f"finished at step {steps}" not in text:
            raise RuntimeError(f"{argv} did not finish:\n{text[-3000:]}")
        return chief_rate(text)


def builtin(steps: int, k: int, batch: int) -> list[str]:
    return [
        sys.executable, "-m", "worker", "--task", "worker.examples.shapes:task",
        "--steps", str(steps), "--batch-size", str(batch), "--log-every", str(LOG_EVERY),
        "--checkpoint-every", str(steps), "--steps-per-call", str(k),
    ]  # fmt: skip


def minimal(steps: int) -> list[str]:
    script = str(REPO / "bench" / "minimal_mwms.py")
    return [sys.executable, script, str(steps), str(BATCH), str(LOG_EVERY)]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} [{min(values):6.1f} {max(values):6.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    steps = args.steps
    methods: dict[str, Callable[[], float]] = {
        "minimal x2": lambda: run_workers(minimal(steps), 2, steps),
        "built-in K=1 x2": lambda: run_workers(builtin(steps, 1, BATCH), 2, steps),
        "built-in K=10 x2": lambda: run_workers(builtin(steps, 10, BATCH), 2, steps),
        "built-in K=1 x1": lambda: run_workers(builtin(steps, 1, BATCH // 2), 1, steps),
        "built-in K=10 x1": lambda: run_workers(builtin(steps, 10, BATCH // 2), 1, steps),
    }
    names = list(methods)
    rates: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {"K=1 / minimal": [], "K=10 / minimal": []}
    for repeat in range(args.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        load = os.getloadavg()[0]
        sample = {}
        for name in order:
            sample[name] = methods[name]()
            rates[name].append(sample[name])
        ratios["K=1 / minimal"].append(sample["built-in K=1 x2"] / sample["minimal x2"])
        ratios["K=10 / minimal"].append(sample["built-in K=10 x2"] / sample["minimal x2"])
        print(f"repeat {repeat + 1} (load {load:.1f}): "
              + ", ".join(f"{n} {sample[n]:.1f}" for n in names), flush=True)  # fmt: skip
    print(f"\n{args.repeats} repeats, {steps} steps, steps/s median [min max]:")
    for name in names:
        print(f"  {name:<18} {spread(rates[name])}")
    print("paired ratios per repeat, median [min max]:")
    for name, values in ratios.items():
        low, high = min(values), max(values)
        print(f"  {name:<18} {statistics.median(values):6.2f} [{low:.2f} {high:.2f}]")
    t = {name: 1000 / statistics.median(values) for name, values in rates.items()}
    dispatch = (t["built-in K=1 x2"] - t["built-in K=10 x2"]) * 10 / 9
    collective = t["built-in K=10 x2"] - t["built-in K=10 x1"]
    compute = t["built-in K=10 x1"] - dispatch / 10
    print("ms per step, from the medians:")
    for name, value in t.items():
        print(f"  {name:<18} {value:6.2f}")
    print(f"  split at K=1 x2:  compute {compute:.2f} + collective {collective:.2f} + dispatch "
          f"{dispatch:.2f} (sum {compute + collective + dispatch:.2f})")  # fmt: skip
    print(f"  split at K=10 x2: compute {compute:.2f} + collective {collective:.2f} + dispatch "
          f"{dispatch / 10:.2f} (sum {compute + collective + dispatch / 10:.2f})")  # fmt: skip
    target = statistics.median(ratios["K=10 / minimal"])
    print(f"target (K=10 >= 1.3x minimal, paired median): {'MET' if target >= 1.3 else 'NOT MET'}"
          f", {target:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
