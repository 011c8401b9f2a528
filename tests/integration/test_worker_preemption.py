"""Stopping cleanly: SIGTERM to real `python -m worker` processes, and a save killed midway.

SIGTERM to any one worker stops every worker of the cluster at the same step, after a checkpoint
there, with exit code 75; the next run resumes from it. A SIGKILL that lands while a checkpoint is
being written leaves the previous checkpoint as the latest, complete and restorable. Each worker
writes its output to files in its run directory (not pipes, which nobody reads while the test
waits). About 40 s on two CPU cores.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_ports, wait_for, worker_env

pytestmark = pytest.mark.tf

REPO = Path(__file__).resolve().parents[2]
SHAPES = "worker.examples.shapes:task"
BIG = "tests.tasks.big:task"
EXIT_PREEMPTED = 75
STARTUP_S = 120  # TensorFlow import and the first steps on two busy CPU cores
STOP_S = 20  # SIGTERM to exit: up to --preemption-check-every steps, a save, TensorFlow teardown
STEP_KEY = (
    "step/.ATTRIBUTES/VARIABLE_VALUE"  # the `step` variable in worker.trainstate's checkpoint
)


class Worker:
    """One `python -m worker` process; stdout and stderr go to files in its run directory."""

    def __init__(
        self, run_dir: Path, *flags: str, task: str = SHAPES, tf_config: str | None = None
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        with ExitStack() as files:
            stdout = files.enter_context(open(run_dir / "stdout.txt", "w"))
            stderr = files.enter_context(open(run_dir / "stderr.txt", "w"))
            self.process = subprocess.Popen(
                [sys.executable, "-m", "worker", "--task", task, *flags],
                cwd=REPO,
                env=worker_env(run_dir, tf_config),
                stdout=stdout,
                stderr=stderr,
            )

    @property
    def stdout(self) -> str:
        return (self.run_dir / "stdout.txt").read_text()

    def describe(self) -> str:
        stderr = (self.run_dir / "stderr.txt").read_text()
        return f"{self.run_dir.name}:\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"

    def progress(self) -> dict[str, Any]:
        try:
            return json.loads((self.run_dir / "progress.json").read_text())
        except FileNotFoundError:
            return {}

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker still running after {timeout} s\n{self.describe()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def workers() -> Any:
    """Starts workers; whatever is still running at the end of the test is killed."""
    started: list[Worker] = []

    def start(run_dir: Path, *flags: str, **kwargs: Any) -> Worker:
        started.append(Worker(run_dir, *flags, **kwargs))
        return started[-1]

    yield start
    for worker in started:
        worker.stop()


def tf_configs(count: int) -> list[str]:
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(count)]}
    return [
        json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        for index in range(count)
    ]


def wait_for_step(running: list[Worker], step: int) -> None:
    def reached() -> bool:
        for worker in running:
            if worker.process.poll() is not None:
                pytest.fail(f"worker exited {worker.process.returncode}\n{worker.describe()}")
        return all(worker.progress().get("step", 0) >= step for worker in running)

    wait_for(reached, STARTUP_S, f"every worker at step {step}")


def tf() -> Any:
    return pytest.importorskip("tensorflow")


def checkpoint_step(path: str) -> int:
    return int(tf().train.load_variable(path, STEP_KEY))


def assert_stopped_at_one_step(stopped: list[Worker], checkpoints: Path) -> int:
    """Every worker exited 75 after a checkpoint at the same step S, which is the latest; S."""
    progresses = [worker.progress() for worker in stopped]
    step = progresses[0]["step"]
    for worker, progress in zip(stopped, progresses, strict=True):
        assert (progress["step"], progress["checkpoint_step"], progress["preempted"]) == (
            step,
            step,
            True,
        ), worker.describe()
        assert f"worker: preempted: saved checkpoint at step {step}\n" in worker.stdout
    latest = tf().train.latest_checkpoint(str(checkpoints))
    assert latest == str(checkpoints / f"ckpt-{step}")
    assert checkpoint_step(latest) == step
    return step


def partial_save(checkpoints: Path) -> Path | None:
    """A data file TensorFlow is writing right now: ckpt-N_temp/*.tempstate* with some bytes in it.

    TensorFlow 2.21 writes a checkpoint's data under that name and renames it when complete, so
    such a file exists only in the middle of a save. Files may vanish while we look.
    """
    try:
        temp_dirs = [e.path for e in os.scandir(checkpoints) if e.name.endswith("_temp")]
        for temp_dir in temp_dirs:
            for entry in os.scandir(temp_dir):
                if ".data-" in entry.name and ".tempstate" in entry.name and entry.stat().st_size:
                    return Path(entry.path)
    except FileNotFoundError:
        pass
    return None


def assert_complete(path: str) -> None:
    """Reads every tensor of the checkpoint: the reader checks each one's checksum."""
    reader = tf().train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)


def resume(
    workers: Any,
    run_dirs: list[Path],
    steps: int,
    checkpoints: Path,
    from_step: int,
    *flags: str,
    task: str = SHAPES,
) -> None:
    """A new run of the same workers to `steps`; each must restore from_step and finish."""
    configs = tf_configs(len(run_dirs)) if len(run_dirs) > 1 else [None]
    flags = ("--steps", str(steps), "--checkpoint-dir", str(checkpoints), *flags)
    resumed = [
        workers(run_dir, *flags, task=task, tf_config=config)
        for run_dir, config in zip(run_dirs, configs, strict=True)
    ]
    for worker in resumed:
        assert worker.wait(STARTUP_S) == 0, worker.describe()
        restored = f"worker: restored checkpoint at step {from_step} from {checkpoints}"
        assert restored in worker.stdout
        assert worker.stdout.rstrip().endswith(f"worker: finished at step {steps}")
        progress = worker.progress()
        assert (progress["start_step"], progress["step"], progress["preempted"]) == (
            from_step,
            steps,
            False,
        )


def test_sigterm_to_one_worker_stops_the_cluster_after_one_checkpoint(tmp_path, workers):
    checkpoints = tmp_path / "checkpoints"
    run_dirs = [tmp_path / "run0", tmp_path / "run1"]
    flags = ("--steps", "100000", "--checkpoint-dir", str(checkpoints))
    cluster = [
        workers(run_dir, *flags, tf_config=config)
        for run_dir, config in zip(run_dirs, tf_configs(2), strict=True)
    ]
    wait_for_step(cluster, 20)

    cluster[1].process.send_signal(signal.SIGTERM)  # worker 1 only
    for worker in cluster:
        assert worker.wait(STOP_S) == EXIT_PREEMPTED, worker.describe()
    step = assert_stopped_at_one_step(cluster, checkpoints)
    assert step % 10 == 0  # --preemption-check-every's default

    resume(workers, run_dirs, step + 20, checkpoints, from_step=step)


def test_sigterm_to_a_lone_worker_saves_once_even_if_sent_twice(tmp_path, workers):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    # The big task's save lasts long enough for a second SIGTERM to land inside it, and with
    # --checkpoint-every 1000 the first save in the directory is the preemption save.
    flags = ("--steps", "100000", "--checkpoint-every", "1000", "--preemption-check-every", "7")
    worker = workers(run_dir, *flags, "--batch-size", "8", task=BIG)
    wait_for_step([worker], 20)

    worker.process.send_signal(signal.SIGTERM)
    partial = wait_for(lambda: partial_save(checkpoints), STOP_S, "the save", interval=0.001)
    worker.process.send_signal(signal.SIGTERM)  # counted, nothing else: the save goes on
    assert worker.wait(STOP_S) == EXIT_PREEMPTED, worker.describe()
    step = assert_stopped_at_one_step([worker], checkpoints)
    assert step % 7 == 0
    assert partial.parent.name == f"ckpt-{step}_temp"  # the second signal came mid-save
    assert worker.stdout.count("worker: preempted") == 1
    assert_complete(str(checkpoints / f"ckpt-{step}"))

    resume(workers, [run_dir], step + 10, checkpoints, step, "--batch-size", "8", task=BIG)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("localhost", port), timeout=0.1).close()
    except OSError:
        return False
    return True


def test_sigterm_while_the_workers_connect_stops_them_at_the_first_check(tmp_path, workers):
    # While the strategy connects, TensorFlow's own handler has SIGTERM and only records it in
    # the coordination service; the worker reads that record once the strategy is built.
    checkpoints = tmp_path / "checkpoints"
    run_dirs = [tmp_path / "run0", tmp_path / "run1"]
    configs = tf_configs(2)
    flags = ("--steps", "100000", "--checkpoint-dir", str(checkpoints))
    first = workers(run_dirs[0], *flags, tf_config=configs[0])
    port = int(json.loads(configs[0])["cluster"]["worker"][0].rsplit(":", 1)[1])
    wait_for(lambda: port_open(port) or first.process.poll() is not None, STARTUP_S, "gRPC port")
    # The port opens a moment (< 0.2 s here) before TensorFlow installs its handler.
    time.sleep(2)
    first.process.send_signal(signal.SIGTERM)  # worker 0 waits for worker 1 now
    time.sleep(1)
    assert first.process.poll() is None, first.describe()

    cluster = [first, workers(run_dirs[1], *flags, tf_config=configs[1])]
    for worker in cluster:
        assert worker.wait(STARTUP_S) == EXIT_PREEMPTED, worker.describe()
        assert "worker: SIGTERM received while the workers connected" in worker.stdout
    assert assert_stopped_at_one_step(cluster, checkpoints) == 10


def test_a_save_killed_midway_leaves_the_previous_checkpoint(tmp_path, workers):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    flags = ("--steps", "100000", "--checkpoint-every", "5", "--batch-size", "8")
    worker = workers(run_dir, *flags, "--max-to-keep", "2", task=BIG)
    # The progress file names checkpoint 5 once it is on disk (written in the background).
    wait_for(lambda: (worker.progress().get("checkpoint_step") or 0) >= 5, STARTUP_S, "ckpt 5")
    assert tf().train.latest_checkpoint(str(checkpoints)) is not None

    # Writing the 67 MB takes about 0.1 s here; a 1 ms poll and a SIGKILL land well inside it.
    partial = wait_for(lambda: partial_save(checkpoints), 60, "the next save", interval=0.001)
    worker.process.kill()
    worker.wait(10)

    # The kill landed mid-save: the data file is still under its temporary name, short.
    assert partial.exists()
    latest = tf().train.latest_checkpoint(str(checkpoints))
    step = checkpoint_step(latest)
    saving = int(partial.parent.name.removeprefix("ckpt-").removesuffix("_temp"))
    assert (latest, saving) == (str(checkpoints / f"ckpt-{step}"), step + 5)
    complete_size = (checkpoints / f"ckpt-{step}.data-00000-of-00001").stat().st_size
    assert partial.stat().st_size < complete_size
    assert_complete(latest)

    resumed = workers(run_dir, "--steps", str(step + 2), "--batch-size", "8", task=BIG)
    assert resumed.wait(STARTUP_S) == 0, resumed.describe()
    assert f"worker: restored checkpoint at step {step} from {checkpoints}" in resumed.stdout
    assert f"worker: removed ckpt-{saving}_temp, left by an interrupted" in resumed.stdout
    assert not partial.parent.exists()
    assert tf().train.latest_checkpoint(str(checkpoints)) == str(checkpoints / f"ckpt-{step + 2}")
