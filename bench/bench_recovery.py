"""Benchmarks for issues 5 and 18: recovery after a killed worker, cold and warm, two local workers.

Recovery: `orchestrate up --skip-checks` supervises a two-worker run of the bundled shapes task in
the foreground; once the chief has a checkpoint at step >= 100, worker 1 gets SIGKILL (T0), right
after the chief logged step S_kill. Recovery ends (T1) when both workers of the new attempt have
printed "worker: first step done". Steps lost: S_kill minus the step the new attempt restored.
The supervisor's own lines (read as they come) and the run record split recovery into:

  detection  T0 -> the supervisor records the failure (last_restart.at)
  stop       -> "restarting the cluster" (the failed attempt's workers stopped: TASK_SURVIVOR_GRACE)
  relaunch   -> the last "started WORKER" of the new attempt (backoff, checkpoint, launch)
  TF start   -> both workers print "first step done" (import TF, strategy, restore, first step)

Warm (issue 18): the same recovery with `warm_restarts` on, the kill held back until both slots'
standbys have imported TensorFlow (in a long run they have, long before any failure); the cold
recovery runs with `warm_restarts: false`, today's path before issue 18. The standbys' resident
memory (the TensorFlow-imported child, and its supervisor) is sampled before the kill.

Floor: two `python -m worker` processes started by hand with hand-written TF_CONFIG, restoring a
copy of the same run's checkpoints, until both print "first step done": the cold start of the
same workers with nothing to detect or stop.

The three methods alternate (the order rotates every repeat) so that they share the machine's noise;
medians are reported, with the 1-minute load average of each sample (other work on the machine
moves single samples by seconds). restart_backoff is 0: the default (5 s, doubling) delays every
restart on purpose and would add to recovery by design. stall_timeout keeps its default (a
SIGKILL is seen as an exit, not as a stall). The target is the issue's: floor + detection + 5 s.

    .venv/bin/python -m bench.bench_recovery [--repeats 5] [--interval 1.0]

The report: cold and warm side by side per phase, the warm/cold ratio against issue 18's 0.6x
target, issue 5's target for the cold path, and the standbys' memory.

--interval is `orchestrate up --interval`, the supervisor's poll period (default 1 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.bench_launch import env, free_ports, tf_configs
from orchestrator.engine.supervision.policy import TASK_SURVIVOR_GRACE
from orchestrator.model.inventory import Job
from tests.conftest import wait_for

TASK = "worker.examples.shapes:task"
JOB = "bench"
STEPS = 1_000_000  # the run is still going whenever a worker is killed
CHECKPOINT_EVERY = 50
LOG_EVERY = 10
BATCH = 64
MAX_TO_KEEP = 3
MIN_CHECKPOINT = 100
# Where in the checkpoint interval the kill lands, cycling over the repeats: the chief's log line
# of a step with step % CHECKPOINT_EVERY == phase.
KILL_PHASES = (40, 10, 30, 20)
TARGET_SLACK = 5.0  # the target: floor + detection + 5 s
WARM_TARGET = 0.6  # issue 18: warm recovery <= 0.6 x the cold recovery of the same run
POLL = 0.01
TIMEOUT = 180.0

STEP_LINE = re.compile(r"^step (\d+) loss")
SAVED = re.compile(r"^worker: saved checkpoint at step (\d+)")
RESTORED = re.compile(r"^worker: restored checkpoint at step (\d+)")
FIRST_STEP = "worker: first step done"


@dataclass(frozen=True)
class Start:
    """Two workers starting: when both had restored the checkpoint (TensorFlow imported, the
    strategy connected, the model built) and when both had made their first step."""

    restored_at: float
    stepped_at: float
    restored_step: int


@dataclass(frozen=True)
class Floor:
    total: float
    to_restored: float
    load: float


@dataclass(frozen=True)
class Recovery:
    total: float
    detection: float
    stop: float
    relaunch: float
    tf_start: float
    to_restored: float  # of tf_start: up to both workers' "restored checkpoint"
    load: float  # the 1-minute load average at the end, for the noise
    kill_step: int
    checkpoint_step: int
    restored_step: int
    reason: str
    warm_workers: int = 0  # workers of the new attempt that were standbys
    standby_rss: tuple[float, ...] = ()  # MiB per slot: the standby's child + its supervisor

    @property
    def steps_lost(self) -> int:
        return self.kill_step - self.restored_step


class Log:
    """A log file read incrementally: the complete lines that appeared since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", "replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        return lines


class Output:
    """A child's stdout read in a thread; every line with the wall-clock time it arrived."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append((time.time(), line.rstrip("\n")))

    def first_after(self, since: float, needle: str) -> float:
        return next(t for t, line in self.lines if t >= since and needle in line)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def wait_until(condition: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
    return wait_for(condition, timeout, what, interval=POLL)


def wait_first_steps(paths: list[Path], alive: Callable[[], bool]) -> Start:
    logs = [Log(path) for path in paths]
    restored: dict[int, tuple[float, int]] = {}
    first: dict[int, float] = {}

    def both_stepped() -> bool:
        for index, log in enumerate(logs):
            for line in log.new_lines():
                if match := RESTORED.match(line):
                    restored[index] = (time.time(), int(match[1]))
                if line.startswith(FIRST_STEP):
                    first[index] = time.time()
        if len(first) < len(logs) and not alive():
            raise RuntimeError(f"a worker ended before its first step: {paths}")
        return len(first) == len(logs)

    wait_until(both_stepped, f"the first step in {paths}")
    if len(restored) < len(logs):
        raise RuntimeError(f"a worker did not restore the checkpoint: {paths}")
    return Start(
        restored_at=max(at for at, _ in restored.values()),
        stepped_at=max(first.values()),
        restored_step=min(step for _, step in restored.values()),
    )


def write_inventory(root: Path, warm: bool) -> None:
    ports = free_ports()
    job = {"name": JOB, "task": TASK, "steps": STEPS, "batch_size": BATCH,
           "checkpoint_every": CHECKPOINT_EVERY, "log_every": LOG_EVERY,
           "max_to_keep": MAX_TO_KEEP, "restart_backoff": 0,
           "warm_restarts": warm}  # fmt: skip
    (root / "inv.yaml").write_text(
        "defaults: {connection: local, workdir: ./work}\n"
        "hosts:\n"
        f"  - {{name: w0, address: localhost, port: {ports[0]}}}\n"
        f"  - {{name: w1, address: localhost, port: {ports[1]}}}\n"
        f"job: {json.dumps(job)}\n"
    )


def orchestrate(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=root, env=env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def run_record(root: Path) -> dict[str, Any] | None:
    state = root / ".orchestrate"
    try:
        run_id = (state / "current").read_text().strip()
        return json.loads((state / "runs" / f"{run_id}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None  # not written yet, or caught between two writes


def attempt_logs(root: Path, attempt: int) -> list[Path] | None:
    record = run_record(root)
    if record is None or record["attempt"] != attempt or not record["workers"]:
        return None
    return [Path(worker["log_path"]) for worker in record["workers"]]


def standbys_ready(root: Path) -> list[Path] | None:
    """The standby directories of both slots once both children imported TensorFlow."""
    record = run_record(root)
    if record is None:
        return None
    found = []
    for worker in record["workers"]:
        attempt = Path(worker["run_dir"]).parent
        standby = attempt.parents[2] / "standby" / Path(worker["run_dir"]).name  # {job}/standby
        if not (standby / "ready").exists():
            return None
        found.append(standby)
    return found


def rss_mib(pid_file: Path) -> float:
    import psutil

    return psutil.Process(int(pid_file.read_text())).memory_info().rss / 2**20


def recover_once(root: Path, phase: int, interval: float, warm: bool = False) -> Recovery:
    write_inventory(root, warm)
    up = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "up", "--skip-checks", "--interval", str(interval),
         "inv.yaml"],
        cwd=root, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert up.stdout is not None
    output = Output(up.stdout)
    try:
        return _kill_and_time(root, up, output, phase, warm)
    finally:
        down = orchestrate(root, "down", "--grace", "10")
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        if down.returncode != 0:
            print(f"warning: orchestrate down exited {down.returncode}: {down.stderr.strip()}")


def _kill_and_time(
    root: Path, up: subprocess.Popen[str], output: Output, phase: int, warm: bool
) -> Recovery:
    logs = wait_until(lambda: attempt_logs(root, 0), "the run record")
    chief = Log(logs[0])
    saved = [0]

    def checkpointed() -> bool:
        for line in chief.new_lines():
            if match := SAVED.match(line):
                saved.append(int(match[1]))
        return max(saved) >= MIN_CHECKPOINT or up.poll() is not None

    wait_until(checkpointed, f"a checkpoint at step {MIN_CHECKPOINT}")
    if up.poll() is not None:
        raise RuntimeError(f"orchestrate up exited {up.returncode}:\n{output.text()}")
    standby_pids: set[int] = set()
    rss: tuple[float, ...] = ()
    if warm:
        standbys = wait_until(lambda: standbys_ready(root), "both standbys ready")
        standby_pids = {int((d / "worker.pid").read_text()) for d in standbys}
        rss = tuple(rss_mib(d / "worker.pid") + rss_mib(d / "pid") for d in standbys)
    status = json.loads(orchestrate(root, "status", "--json").stdout)
    victim = status["workers"][1]["pid"]

    def latest_step() -> int | None:
        """The newest step the chief logged since the last look (older lines are stale)."""
        step = None
        for line in chief.new_lines():
            if match := SAVED.match(line):
                saved.append(int(match[1]))
            elif match := STEP_LINE.match(line):
                step = int(match[1])
        return step

    latest_step()  # lines logged while `status` ran are too old to time a kill on
    kill_step = wait_until(
        lambda: (step := latest_step()) is not None and step % CHECKPOINT_EVERY == phase and step,
        f"a step at phase {phase}",
    )
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    checkpoint_step = max(saved)

    new_logs = wait_until(lambda: attempt_logs(root, 1), "attempt 1")
    start = wait_first_steps(new_logs, lambda: up.poll() is None)
    after = json.loads(orchestrate(root, "status", "--json").stdout)
    last = after["last_restart"]
    warm_workers = sum(w["pid"] in standby_pids for w in after["workers"])
    if warm and warm_workers != len(after["workers"]):
        print(f"warning: {warm_workers} of the new workers were standbys", flush=True)
    detected_at = last["at"]
    stopped_at = output.first_after(detected_at, "restarting the cluster")
    launched_at = max(t for t, line in output.lines if t >= stopped_at and "started w" in line)
    return Recovery(
        total=start.stepped_at - killed_at,
        detection=detected_at - killed_at,
        stop=stopped_at - detected_at,
        relaunch=launched_at - stopped_at,
        tf_start=start.stepped_at - launched_at,
        to_restored=start.restored_at - launched_at,
        load=os.getloadavg()[0],
        kill_step=kill_step,
        checkpoint_step=checkpoint_step,
        restored_step=start.restored_step,
        reason=last["reason"],
        warm_workers=warm_workers,
        standby_rss=rss,
    )


def floor_once(root: Path, checkpoints: Path) -> Floor:
    """Two workers by hand from a copy of the checkpoints, until both made their first step."""
    ckpt = root / "floor-checkpoints"
    shutil.copytree(checkpoints, ckpt)
    logs = [root / f"floor-{index}.log" for index in (0, 1)]
    argv = [
        sys.executable, "-m", "worker", "--task", TASK, "--steps", str(STEPS),
        "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--max-to-keep", str(MAX_TO_KEEP), "--batch-size", str(BATCH),
        "--log-every", str(LOG_EVERY),
    ]  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = []
    started = time.time()
    try:
        for path, config in zip(logs, tf_configs(free_ports()), strict=True):
            with path.open("w") as log:
                process = subprocess.Popen(
                    argv, env={**env(), "TF_CONFIG": config}, cwd=root,
                    stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            processes.append(process)
        start = wait_first_steps(logs, lambda: all(p.poll() is None for p in processes))
        return Floor(start.stepped_at - started, start.restored_at - started, os.getloadavg()[0])
    finally:
        for process in processes:
            process.kill()
            process.wait()
        shutil.rmtree(ckpt, ignore_errors=True)


def median_min(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} {min(values):6.2f}"


PHASES = (
    ("recovery: SIGKILL -> both first new step", "total"),
    ("  detection (-> last_restart.at)", "detection"),
    ("  stop of the failed attempt", "stop"),
    ("  relaunch (backoff 0, checkpoint, launch)", "relaunch"),
    ("  TF start -> both first step done", "tf_start"),
    ("    of which -> both restored checkpoint", "to_restored"),
)


def report(colds: list[Recovery], warms: list[Recovery], floors: list[Floor]) -> list[str]:
    def column(samples: list[Recovery], name: str) -> list[float]:
        return [getattr(r, name) for r in samples]

    floor = statistics.median(f.total for f in floors)
    detection = statistics.median(column(colds, "detection"))
    cold = statistics.median(column(colds, "total"))
    warm = statistics.median(column(warms, "total"))
    target = floor + detection + TARGET_SLACK
    lines = [f"{'seconds':<44} {'cold':>6} {'min':>6}   {'warm':>6} {'min':>6}"]
    lines.extend(
        f"{label:<44} {median_min(column(colds, name))}   {median_min(column(warms, name))}"
        for label, name in PHASES
    )
    lines += [
        f"{'floor: cold start by hand -> first step':<44} {median_min([f.total for f in floors])}",
        f"{'    of which -> both restored checkpoint':<44} "
        f"{median_min([f.to_restored for f in floors])}",
        "",
        f"warm/cold (medians): {warm / cold:.2f} (target <= {WARM_TARGET:g}): "
        f"{'MET' if warm <= WARM_TARGET * cold else 'MISSED'}; warm {warm:.2f} s, cold "
        f"{cold:.2f} s",
        "paired warm/cold per repeat: "
        + " ".join(f"{w.total / c.total:.2f}" for c, w in zip(colds, warms, strict=True)),
        f"issue 5's target (cold <= floor + detection + 5 s = {target:.2f} s): "
        f"{'MET' if cold <= target else 'MISSED'}",
    ]
    rss = [value for r in warms for value in r.standby_rss]
    if rss:
        lines.append(f"standby RSS per slot (child + its supervisor): median "
                     f"{statistics.median(rss):.0f} MiB, max {max(rss):.0f} MiB")  # fmt: skip
    lines += [
        "",
        f"{'method':>6} {'kill at':>7} {'ckpt':>5} {'restored':>8} {'lost':>5} {'total s':>8} "
        f"{'TF start':>8} {'standbys':>8} {'load':>5}  reason",
    ]
    for name, samples in (("cold", colds), ("warm", warms)):
        lines.extend(
            f"{name:>6} {r.kill_step:>7} {r.checkpoint_step:>5} {r.restored_step:>8} "
            f"{r.steps_lost:>5} {r.total:>8.2f} {r.tf_start:>8.2f} {r.warm_workers:>8} "
            f"{r.load:>5.1f}  {r.reason}"
            for r in samples
        )
    lines.append("floor s (load): " + " ".join(f"{f.total:.2f} ({f.load:.1f})" for f in floors))
    lost = [r.steps_lost for r in colds + warms]
    within = all(0 <= n <= CHECKPOINT_EVERY for n in lost)
    lines.append(
        f"steps lost per failure: median {statistics.median(lost):g}, max {max(lost)}; "
        f"checkpoint interval {CHECKPOINT_EVERY}: {'within' if within else 'EXCEEDED'}"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--interval", type=float, default=1.0, help="orchestrate up --interval (its default: 1)"
    )
    args = parser.parse_args()
    stall = next(f.default for f in dataclasses.fields(Job) if f.name == "stall_timeout")
    print(f"two local workers, {TASK}, checkpoint_every {CHECKPOINT_EVERY}, log_every "
          f"{LOG_EVERY}, restart_backoff 0, stall_timeout {stall} (default), survivors grace "
          f"{TASK_SURVIVOR_GRACE:g} s, supervisor poll {args.interval:g} s; load at start "
          f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    colds: list[Recovery] = []
    warms: list[Recovery] = []
    floors: list[Floor] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as scratch:
        checkpoints = Path(scratch) / "checkpoints"  # the latest recovery run's, for the floor

        def recovery(repeat: int, warm: bool) -> None:
            name = "warm" if warm else "cold"
            root = Path(scratch) / f"{name}-{repeat}"
            root.mkdir()
            phase = KILL_PHASES[repeat % len(KILL_PHASES)]
            sample = recover_once(root, phase, args.interval, warm)
            (warms if warm else colds).append(sample)
            shutil.rmtree(checkpoints, ignore_errors=True)
            shutil.copytree(root / "work" / JOB / "checkpoints", checkpoints)
            shutil.rmtree(root)
            print(f"repeat {repeat + 1}: {name} recovery {sample.total:.2f} s (detection "
                  f"{sample.detection:.2f}, stop {sample.stop:.2f}, relaunch "
                  f"{sample.relaunch:.2f}, TF start {sample.tf_start:.2f}), killed at step "
                  f"{sample.kill_step}, restored {sample.restored_step}, standbys used "
                  f"{sample.warm_workers}, load {sample.load:.1f}", flush=True)  # fmt: skip

        def floor(repeat: int) -> None:
            root = Path(scratch) / f"floor-{repeat}"
            root.mkdir()
            floors.append(floor_once(root, checkpoints))
            shutil.rmtree(root)
            print(f"repeat {repeat + 1}: floor {floors[-1].total:.2f} s, load "
                  f"{floors[-1].load:.1f}", flush=True)  # fmt: skip

        methods: list[Callable[[int], None]] = [
            lambda repeat: recovery(repeat, warm=False),
            lambda repeat: recovery(repeat, warm=True),
            floor,
        ]
        for repeat in range(args.repeats):
            # The floor needs a checkpoint: the first repeat recovers first; then the order
            # rotates, so each method runs first, second and third alike.
            shift = repeat % len(methods)
            for method in methods[shift:] + methods[:shift]:
                method(repeat)
    print(f"\n{args.repeats} repeats, {time.monotonic() - began:.0f} s in all; medians and "
          f"minimums (a shared, noisy machine: methods alternate; see the load); load at end "
          f"{os.getloadavg()[0]:.1f}:")  # fmt: skip
    print("\n".join(report(colds, warms, floors)))


if __name__ == "__main__":
    main()
