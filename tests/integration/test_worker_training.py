"""The worker as the controller runs it: real `python -m worker` processes training real TensorFlow.

One worker alone (train, resume, nothing left to do), two workers on localhost ports forming a
MultiWorkerMirroredStrategy cluster, a killed worker, and user and training errors. About 40 s on
two CPU cores. SIGTERM, which stops a cluster cleanly, is tested in test_worker_preemption.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_ports, worker_env

pytestmark = pytest.mark.tf

REPO = Path(__file__).resolve().parents[2]
TASK = "worker.examples.shapes:task"
PROGRESS_KEYS = {
    "step", "start_step", "target_steps", "loss", "accuracy", "checkpoint_step", "steps_per_sec",
    "time", "task_index", "num_workers", "devices", "num_replicas", "preempted", "val_loss",
    "val_accuracy", "eval_step", "step_call_seconds", "step_seconds", "first_step_at",
    "checkpoint_seconds", "eval_seconds", "checkpoint_at",
}  # fmt: skip
TIMEOUT_S = 120
STEP_LINE = re.compile(r"^step (\d+) loss ([\d.]+) accuracy ([\d.]+) steps/s ([\d.]+)$", re.M)


def start_worker(run_dir: Path, *flags: str, tf_config: str | None = None) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "worker", "--task", TASK, *flags],
        cwd=REPO,
        env=worker_env(run_dir, tf_config),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"worker did not finish in {TIMEOUT_S}s\nstdout:\n{out}\nstderr:\n{err}")
    return process.returncode, out, err


def run_worker(run_dir: Path, *flags: str) -> str:
    """Runs one worker to the end; returns its stdout after checking it exited 0."""
    code, out, err = finish(start_worker(run_dir, *flags))
    assert code == 0, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def read_progress(run_dir: Path) -> dict:
    data = json.loads((run_dir / "progress.json").read_text())
    assert set(data) == PROGRESS_KEYS
    return data


def latest_checkpoint(directory: Path) -> str | None:
    tf = pytest.importorskip("tensorflow")
    return tf.train.latest_checkpoint(str(directory))


def test_one_worker_trains_resumes_and_stops_when_done(tmp_path):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"

    out = run_worker(run_dir, "--steps", "30", "--checkpoint-every", "10")
    assert f"worker: no checkpoint in {checkpoints}, starting at step 0" in out
    assert "worker: first step done" in out
    assert "worker: saved checkpoint at step 30" in out
    assert out.rstrip().endswith("worker: finished at step 30")
    progress = read_progress(run_dir)
    assert (progress["step"], progress["checkpoint_step"], progress["target_steps"]) == (30, 30, 30)
    assert (progress["task_index"], progress["num_workers"]) == (0, 1)
    assert progress["devices"] == ["/device:CPU:0"]
    assert progress["num_replicas"] == 1
    assert progress["loss"] > 0 and 0 <= progress["accuracy"] <= 1
    assert progress["steps_per_sec"] > 0
    assert latest_checkpoint(checkpoints) == str(checkpoints / "ckpt-30")
    # max_to_keep 3: steps 10, 20, 30 are kept.
    assert sorted(p.name for p in checkpoints.glob("*.index")) == [
        "ckpt-10.index", "ckpt-20.index", "ckpt-30.index",
    ]  # fmt: skip
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))

    # A resume from step 20's, written in the background (as if the run had been killed
    # before step 30's): the state file names it.
    for path in checkpoints.glob("ckpt-30.*"):
        path.unlink()
    (checkpoints / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-20"\nall_model_checkpoint_paths: "ckpt-10"\n'
        'all_model_checkpoint_paths: "ckpt-20"\n'
    )
    out = run_worker(run_dir, "--steps", "50", "--checkpoint-every", "10")
    assert f"worker: restored checkpoint at step 20 from {checkpoints}" in out
    assert [int(s) for s, *_ in STEP_LINE.findall(out)] == [30, 40, 50]
    assert out.rstrip().endswith("worker: finished at step 50")
    progress = read_progress(run_dir)
    assert (progress["start_step"], progress["step"], progress["checkpoint_step"]) == (20, 50, 50)
    assert latest_checkpoint(checkpoints) == str(checkpoints / "ckpt-50")

    out = run_worker(run_dir, "--steps", "50")
    assert "worker: already at step 50 >= 50, nothing to do" in out
    assert "first step done" not in out
    progress = read_progress(run_dir)
    assert (progress["step"], progress["loss"], progress["checkpoint_step"]) == (50, None, 50)


def test_an_async_written_checkpoint_holds_what_a_blocking_save_does(tmp_path):
    # The same seeded run twice, its saves blocking (--sync-checkpoints) and written in the
    # background (the default): the checkpoints of steps 10 and 20, written while training went
    # on, hold the values of their step. (save_counter is TensorFlow's count of saves, which
    # its async copy takes before counting; the loop numbers its checkpoints by step.)
    tf = pytest.importorskip("tensorflow")
    flags = ("--steps", "30", "--checkpoint-every", "10", "--seed", "7")
    run_worker(tmp_path / "sync", *flags, "--sync-checkpoints")
    out = run_worker(tmp_path / "async", *flags)
    assert "worker: saved checkpoint at step 20 (blocked " in out
    blocking, background = tmp_path / "sync" / "checkpoints", tmp_path / "async" / "checkpoints"
    for step in (10, 20):
        ours = tf.train.load_checkpoint(str(background / f"ckpt-{step}"))
        theirs = tf.train.load_checkpoint(str(blocking / f"ckpt-{step}"))
        names = set(theirs.get_variable_to_shape_map()) - {
            "save_counter/.ATTRIBUTES/VARIABLE_VALUE", "_CHECKPOINTABLE_OBJECT_GRAPH"}  # fmt: skip
        assert names <= set(ours.get_variable_to_shape_map()) and len(names) > 10
        for name in names:
            assert (ours.get_tensor(name) == theirs.get_tensor(name)).all(), (step, name)
    progress = read_progress(tmp_path / "async")
    assert progress["checkpoint_seconds"] > 0 and progress["eval_seconds"] > 0  # after step 30
    assert progress["first_step_at"] <= progress["checkpoint_at"] <= progress["time"]
    # A resume from one written in the background: test_one_worker_trains_resumes_and_stops.


def start_cluster(tmp_path: Path, *flags: str, workers: int = 2) -> list[subprocess.Popen]:
    """Workers on free localhost ports, run directories tmp_path/run0, run1, ..."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(workers)]}
    return [
        start_worker(
            tmp_path / f"run{index}",
            *flags,
            tf_config=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        for index in range(workers)
    ]


def test_two_workers_train_together(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    processes = start_cluster(tmp_path, "--steps", "200", "--checkpoint-dir", str(checkpoints))
    results = [finish(process) for process in processes]
    for code, out, err in results:
        assert code == 0, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"

    for index, (_, out, _) in enumerate(results):
        losses = [float(loss) for _, loss, _, _ in STEP_LINE.findall(out)]
        assert len(losses) == 20
        assert losses[-1] < losses[0] - 0.5, losses
        progress = read_progress(tmp_path / f"run{index}")
        assert (progress["task_index"], progress["num_workers"]) == (index, 2)
        assert progress["num_replicas"] == 2  # one CPU replica on each of the two workers
        assert (progress["step"], progress["checkpoint_step"]) == (200, 200)
        assert progress["accuracy"] > 0.8, progress
        # The step timing of the last log window: the calls are part of the step's wall time.
        assert 0 < progress["step_call_seconds"] <= progress["step_seconds"] * 1.01, progress
    # Both workers log the same globally reduced values.
    assert STEP_LINE.findall(results[0][1])[-1][1:3] == STEP_LINE.findall(results[1][1])[-1][1:3]
    assert latest_checkpoint(checkpoints) == str(checkpoints / "ckpt-200")
    assert not (tmp_path / "run1" / "tmp-checkpoints").exists()
    assert not (tmp_path / "run0" / "tmp-checkpoints").exists()
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_a_killed_worker_fails_its_peer(tmp_path):
    # A worker that dies without a word (SIGKILL, a crash, a lost host) cannot be waited for:
    # the survivor's next collective fails and it exits 1 with the traceback, within seconds.
    processes = start_cluster(tmp_path, "--steps", "100000", "--log-every", "1000")
    try:
        victim = processes[1]
        for line in victim.stdout:
            if line.startswith("worker: first step done"):
                break
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        killed = time.monotonic()
        code, _, err = finish(processes[0])
        assert time.monotonic() - killed < 15
        assert code == 1
        assert "Traceback" in err
        assert "Collective ops is aborted" in err, err[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--task", "no_such_package.tasks:task"],
            "worker: cannot import task "
            "'no_such_package.tasks:task': No module named 'no_such_package'",
        ),
        (["--task", "worker.examples.shapes:nope"], "has no function 'nope'"),
        (["--batch-size", "many"], "argument --batch-size: invalid int value: 'many'"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(tmp_path, flags, message):
    process = subprocess.Popen(
        [sys.executable, "-m", "worker", "--task", TASK, "--steps", "10", *flags],
        cwd=REPO,
        env=worker_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code, _, err = finish(process)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not (tmp_path / "progress.json").exists()


def test_training_error_exits_1_with_traceback(tmp_path):
    # A task that loads fine but fails once training starts: its model has 4 outputs, not 3.
    (tmp_path / "wrong_classes.py").write_text(
        "from worker.examples import shapes\n"
        "from worker.task import TrainingTask\n\n\n"
        "def task():\n"
        "    return TrainingTask(shapes.build_model, shapes.build_dataset, num_classes=3)\n"
    )
    env = worker_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    process = subprocess.Popen(
        [sys.executable, "-m", "worker", "--task", "wrong_classes:task", "--steps", "10"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code, out, err = finish(process)
    assert code == 1, f"stdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" in err
    assert "the model outputs 4 values per example but the task says num_classes=3" in err
