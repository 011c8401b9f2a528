"""Benchmark for issue 44: goodput's account against a run whose truth is known, and the time
the step loop is blocked per checkpoint save, blocking versus written in the background.

(a) The account. `orchestrate up --skip-checks` supervises two local workers of the bundled
shapes task (a checkpoint every 100 steps, a progress report every step, no warm restarts,
restart_backoff 0); once the chief's log says step KILL_AT (between the checkpoints of 100
and 200), worker 1 gets SIGKILL; the cluster restarts from step 100 and finishes. Then from
`status --json`'s goodput and the run record:
  - sums: each worker's parts add up to its wall time, its first launch to its exit (both from
    the run record), within 2 %; the bench's own clock around `up` is shown beside the
    longest worker's account (the rest is `up`'s own start before the launch and its end);
  - lost work: the killed worker's lost seconds against the time from the end of the save the
    next attempt resumed from (its step's line in the progress history, plus the save's
    blocked seconds in its log) to the bench's own SIGKILL, within one step time (the median
    gap between two history lines) plus the time the exit record was written after the
    signal (the account knows the death from it).
(b) Blocked per save. The same two workers started by hand (python -m worker, hand-written
TF_CONFIG) on a wider model (bench_goodput:wide_task: a 2048-unit layer, ~25 MB checkpoints
with Adam's slots), a save every SAVE_EVERY steps, once with --sync-checkpoints and once
with saves written in the background (the default); the chief's "saved checkpoint at step N
(blocked X s)" lines, the last save left out (it blocks either way), a run's first two saves
apart from the rest (in the background they trace TensorFlow's copy to host memory, once per
process).

    .venv/bin/python -m bench.bench_goodput [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_launch import BATCH, env, free_ports, tf_configs
from tests.conftest import wait_for

KILL_AT = 150
STEPS = 400
CHECKPOINT_EVERY = 100
SAVE_STEPS, SAVE_EVERY = 400, 50
STEP_LINE = re.compile(r"^step (\d+) loss", re.M)
BLOCKED = re.compile(r"^worker: saved checkpoint at step (\d+) \(blocked ([\d.]+) s\)", re.M)
WIDE = 2048


def wide_task() -> Any:
    """The shapes task with a 2048-unit layer: checkpoints large enough to take time to write."""
    from worker.examples import shapes

    keras = shapes.chosen_keras()

    def model() -> Any:
        return keras.Sequential([
            keras.Input(shape=(shapes.IMAGE_SIZE, shapes.IMAGE_SIZE, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(WIDE, activation="relu"),
            keras.layers.Dense(len(shapes.CLASS_NAMES)),
        ])  # fmt: skip

    return dataclasses.replace(shapes.task(), model=model, eval_dataset=None)


def orchestrate(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=root, env=env(),
                          capture_output=True, text=True, check=check)  # fmt: skip


def killed_run() -> dict[str, Any]:
    """One supervised run with a SIGKILL between two checkpoints; what the checks need."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        ports = free_ports()
        job = {"name": "bench", "task": "worker.examples.shapes:task", "steps": STEPS,
               "batch_size": BATCH, "log_every": 1, "checkpoint_every": CHECKPOINT_EVERY,
               "restart_backoff": 0, "warm_restarts": False}  # fmt: skip
        (root / "inv.yaml").write_text(
            "defaults: {connection: local, workdir: ./work}\nhosts:\n"
            f"  - {{name: w0, address: localhost, port: {ports[0]}}}\n"
            f"  - {{name: w1, address: localhost, port: {ports[1]}}}\n"
            f"job: {json.dumps(job)}\n"
        )
        started = time.time()
        up = subprocess.Popen([sys.executable, "-m", "orchestrator", "up", "--skip-checks",
                               "inv.yaml"], cwd=root, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            record = wait_for(lambda: _record(root), timeout=60, what="the run record")
            logs = [Path(w["run_dir"]) / "worker.log" for w in record["workers"]]
            victim = Path(record["workers"][1]["run_dir"]) / "worker.pid"
            wait_for(lambda: _logged_step(logs[0]) >= KILL_AT, timeout=300, what="the kill step")
            signal_at = _logged_step(logs[0])
            pid = int(victim.read_text())
            killed_at = time.time()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            history = Path(record["workers"][1]["run_dir"]) / "progress-history.jsonl"
            log = logs[1]
            _, err = up.communicate(timeout=600)
        finally:
            up.kill()
        ended = time.time()
        status = json.loads(orchestrate(root, "status", "--json").stdout)
        return {"record": _record(root), "goodput": status["goodput"], "err": err,
                "history": history.read_text(), "wall": ended - started,
                "signal_at": signal_at, "killed_at": killed_at,
                "log": log.read_text(errors="replace")}  # fmt: skip


def _record(root: Path) -> dict[str, Any] | None:
    try:
        run_id = (root / ".orchestrate" / "current").read_text().strip()
        record = json.loads((root / ".orchestrate" / "runs" / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("launched") and record.get("workers") else None


def _logged_step(log: Path) -> int:
    try:
        steps = STEP_LINE.findall(log.read_text(errors="replace"))
    except OSError:
        return 0
    return int(steps[-1]) if steps else 0


def check_run(run: dict[str, Any]) -> dict[str, float]:
    """The sums and the lost work of one killed run: the figures, checked."""
    record, goodput = run["record"], run["goodput"]
    first, killed = record["attempts"][0], record["attempts"][0]["workers"][1]
    resumed = record["attempts"][1]["workers"][1]["start_step"]
    worst = 0.0
    for span in record["attempts"][-1]["workers"]:
        wall = span["finished_at"] - first["launched_at"]
        total = goodput["workers"][span["name"]]["total_seconds"]
        worst = max(worst, abs(total - wall) / wall)
    assert worst <= 0.02, f"a worker's parts are {worst:.1%} off its wall time"
    # The truth, measured apart from the account: from the end of the save the next attempt
    # resumed from (its step's history line, then the save's blocked seconds in the log) to
    # the bench's own SIGKILL.
    points = [json.loads(line) for line in run["history"].splitlines() if line.strip()]
    times = [p["time"] for p in points if p.get("loss") is not None]
    step_time = statistics.median(b - a for a, b in itertools.pairwise(times))
    last = max(p["step"] for p in points)
    saved_at = next(p["time"] for p in points if p["step"] == resumed)
    blocked = dict(BLOCKED.findall(run["log"]))[str(resumed)]
    expected = run["killed_at"] - (saved_at + float(blocked))
    # The account knows the death by the exit record, written a moment after the signal.
    recorded = killed["finished_at"] - run["killed_at"]
    lost = goodput["workers"][killed["name"]]["seconds"]["lost"]
    assert abs(lost - expected) <= step_time + recorded, (lost, expected, step_time, recorded)
    return {"worst_sum_error": worst, "lost_s": lost, "expected_lost_s": expected,
            "step_time_s": step_time, "exit_recorded_after_s": recorded,
            "steps_lost": last - resumed,
            "goodput": goodput["goodput"],
            "longest_worker_s": max(w["total_seconds"] for w in goodput["workers"].values()),
            "bench_wall_s": run["wall"],
            **{f"share_{k}": v for k, v in goodput["shares"].items() if v}}  # fmt: skip


def blocked_per_save(background: bool) -> list[float]:
    """The chief's blocked seconds per save (the last one left out) in one two-worker run."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        argv = [sys.executable, "-m", "worker", "--task", "bench.bench_goodput:wide_task",
                "--steps", str(SAVE_STEPS), "--batch-size", str(BATCH), "--log-every", "10",
                "--checkpoint-every", str(SAVE_EVERY), "--checkpoint-dir", str(root / "ckpt"),
                *(() if background else ("--sync-checkpoints",))]  # fmt: skip
        processes = [
            subprocess.Popen(argv, env={**env(), "TF_CONFIG": config}, cwd=root,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for config in tf_configs(free_ports())
        ]  # fmt: skip
        outputs = [p.communicate(timeout=600)[0] for p in processes]
        assert all(p.returncode == 0 for p in processes), outputs[0][-3000:]
        saves = [(int(s), float(b)) for s, b in BLOCKED.findall(outputs[0])]
        return [blocked for step, blocked in saves if step != SAVE_STEPS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--saves-only", action="store_true", help="part (b) alone")
    options = parser.parse_args()
    repeats = options.repeats
    runs = [] if options.saves_only else [check_run(killed_run()) for _ in range(repeats)]
    for index, figures in enumerate(runs, start=1):
        print(f"run {index}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))
    blocked: dict[bool, list[list[float]]] = {False: [], True: []}
    for _ in range(repeats):
        for background in (False, True):
            blocked[background].append(blocked_per_save(background))
    for background, per_run in blocked.items():
        # A process's first two saves in the background trace TensorFlow's copy to host
        # memory (the second: its assign, asyncsave.py): once per worker process, apart.
        firsts = [sum(saves[:2]) for saves in per_run]
        rest = [value for saves in per_run for value in saves[2:]]
        name = "background" if background else "blocking"
        print(
            f"{name}: a run's first two saves {statistics.median(firsts) * 1000:.0f} ms together "
            f"(median of {len(firsts)}); the {len(rest)} others: median "
            f"{statistics.median(rest) * 1000:.1f} ms, mean {statistics.mean(rest) * 1000:.1f} ms,"
            f" max {max(rest) * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
