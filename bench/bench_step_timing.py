"""steps/s of the built-in loop with and without its step timing (issue 27), side by side in one
run: two local workers train the bundled example at --steps-per-call 1 (the most calls, so the
most clock reads per step), once with ORCHESTRATE_STEP_TIMING=0 and once timed, alternating
within each repeat and the order flipping from repeat to repeat, so that both share the
machine's noise. The timing stays only if the paired median loss is under 2 %.

On a shared, loaded machine the paired figures swing by tens of percent either way, far more
than two clock reads could cost, so the bench also measures that cost directly: the timing's
own work per call (timeit), as a share of the median step time measured above.

    .venv/bin/python -m bench.bench_step_timing [--repeats 5] [--steps 400]

Because those figures swing so, `--segments N` measures in one process instead: one worker (no
TF_CONFIG) builds the loop once, then trains N pairs of adjacent 200-step segments, one timed and
one not (the order flipping from pair to pair), by switching the same Loop's timing on and off;
the checkpoint save, evaluation and summaries' close at each segment's end are skipped. Pairs a
second apart share far more of the machine's noise than runs a minute apart.

    .venv/bin/python -m bench.bench_step_timing --segments 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import timeit
from unittest import mock

from bench.bench_launch import BATCH
from bench.bench_steps_per_call import builtin, run_workers
from orchestrator.contract import STEP_TIMING_ENV


def rate(steps: int, timed: bool) -> float:
    with mock.patch.dict(os.environ, {STEP_TIMING_ENV: "1" if timed else "0"}):
        return run_workers(builtin(steps, 1, BATCH), 2, steps)


SEGMENT_STEPS = 200


def no_save(step: int, *, wait: bool = False) -> None:
    """The loop's saves left out: the bench times the steps."""


def in_process(pairs: int) -> None:
    """Adjacent timed and untimed segments of one Loop, in this process (see the docstring)."""
    import dataclasses

    from worker import cli
    from worker.dataset import distribute_dataset
    from worker.mirrored import build_loop
    from worker.preemption import watch_sigterm
    from worker.progress import ProgressWriter
    from worker.strategy import create_strategy
    from worker.summaries import Summaries
    from worker.task import load_task
    from worker.trainstate import build_state

    with tempfile.TemporaryDirectory() as scratch:
        flags = ["--task", "worker.examples.shapes:task", "--steps", "1000000", "--batch-size",
                 str(BATCH // 2), "--log-every", "50", "--checkpoint-every", "1000000",
                 "--checkpoint-dir", f"{scratch}/ckpt"]  # fmt: skip
        config = cli.parse_config(flags, {"ORCHESTRATE_RUN_DIR": scratch})
        task = load_task(config.task)
        strategy = create_strategy(config.strategy, config.devices)
        dataset = task.dataset()
        state = build_state(strategy, task, dataset.element_spec)
        summaries = Summaries(config.tensorboard_dir, strategy.extended.should_checkpoint)
        loop = build_loop(config, strategy=strategy, task=task, state=state,
                          summaries=summaries, progress=ProgressWriter(f"{scratch}/p.json"),
                          start_step=0, element_spec=dataset.element_spec,
                          sigterm=watch_sigterm())  # fmt: skip
        loop.saver.save = no_save  # type: ignore[method-assign]
        loop.saver.close = lambda: None  # type: ignore[method-assign]
        loop.summaries.close = lambda: None  # type: ignore[method-assign]
        loop.evaluator = None
        iterator = iter(distribute_dataset(strategy, dataset, config.batch_size, 100, 0))
        loop.config = dataclasses.replace(config, steps=SEGMENT_STEPS)
        step = loop.run(iterator, 0)  # warm up: the trace and the first steps
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}  # CPU seconds per step
        for pair in range(pairs):
            for timed in (False, True) if pair % 2 == 0 else (True, False):
                loop._in_calls = 0.0 if timed else None
                loop.config = dataclasses.replace(config, steps=step + SEGMENT_STEPS)
                started, used = time.perf_counter(), time.process_time()
                step = loop.run(iterator, step)
                rates[timed].append(SEGMENT_STEPS / (time.perf_counter() - started))
                cpu[timed].append((time.process_time() - used) / SEGMENT_STEPS)
    losses = [1 - t / u for t, u in zip(rates[True], rates[False], strict=True)]
    print(f"{pairs} pairs of {SEGMENT_STEPS}-step segments in one process, steps/s median "
          f"[min max]:")  # fmt: skip
    for timed, name in ((False, "untimed"), (True, "timed")):
        values = rates[timed]
        print(f"  {name:<8} {statistics.median(values):7.1f} [{min(values):.1f} {max(values):.1f}]")
    loss = statistics.median(losses)
    print(f"paired loss, median [min max]: {loss * 100:.1f} % "
          f"[{min(losses) * 100:.1f} {max(losses) * 100:.1f}]")  # fmt: skip
    # CPU time per step: what the timing itself costs, nearly blind to other processes' load
    extra = [t / u - 1 for t, u in zip(cpu[True], cpu[False], strict=True)]
    print(f"CPU ms per step, median: untimed {statistics.median(cpu[False]) * 1000:.3f}, timed "
          f"{statistics.median(cpu[True]) * 1000:.3f}; paired extra CPU, median [min max]: "
          f"{statistics.median(extra) * 100:.1f} % [{min(extra) * 100:.1f} "
          f"{max(extra) * 100:.1f}]")  # fmt: skip
    print(
        f"keep the timing (paired loss < 2 %): {'YES' if loss < 0.02 else 'NO'}; "
        f"(extra CPU < 2 %): {'YES' if statistics.median(extra) < 0.02 else 'NO'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--segments", type=int, metavar="N", help="N pairs in one process")
    args = parser.parse_args()
    if args.segments:
        os.environ.update({"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"})
        in_process(args.segments)
        return
    off: list[float] = []
    on: list[float] = []
    for repeat in range(args.repeats):
        load = os.getloadavg()[0]
        order = (False, True) if repeat % 2 == 0 else (True, False)
        sample = {timed: rate(args.steps, timed) for timed in order}
        off.append(sample[False])
        on.append(sample[True])
        print(f"repeat {repeat + 1} (load {load:.1f}): untimed {sample[False]:.1f}, "
              f"timed {sample[True]:.1f} steps/s", flush=True)  # fmt: skip
    losses = [1 - t / u for t, u in zip(on, off, strict=True)]
    loss = statistics.median(losses)
    print(f"\n{args.repeats} repeats, {args.steps} steps, steps/s median [min max]:")
    for name, values in (("untimed", off), ("timed", on)):
        print(f"  {name:<8} {statistics.median(values):7.1f} [{min(values):.1f} {max(values):.1f}]")
    print(f"paired loss per repeat, median [min max]: {loss * 100:.1f} % "
          f"[{min(losses) * 100:.1f} {max(losses) * 100:.1f}]")  # fmt: skip
    # What Loop.run adds per call: two perf_counter reads, a subtraction and an addition.
    cost = min(timeit.repeat("c = perf_counter(); t += perf_counter() - c", "t = 0.0",
                             globals={"perf_counter": time.perf_counter}, number=100_000,
                             repeat=5)) / 100_000  # fmt: skip
    step = 1 / statistics.median(off)
    print(f"the timing's own cost: {cost * 1e9:.0f} ns per call, {cost / step * 100:.4f} % of "
          f"a {step * 1000:.1f} ms step")  # fmt: skip
    print(
        f"keep the timing (paired loss < 2 %): {'YES' if loss < 0.02 else 'NO'}; "
        f"(own cost < 2 %): {'YES' if cost / step < 0.02 else 'NO'}"
    )


if __name__ == "__main__":
    main()
