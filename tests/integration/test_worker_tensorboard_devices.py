"""TensorBoard output, strategies and device flags of real `python -m worker` processes.

One worker each, no TF_CONFIG, 10-30 steps of the bundled shapes task. The event files are read back
with TensorBoard's own reader, as the TensorBoard server would. About 30 s on two CPU cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import worker_env

pytestmark = pytest.mark.tf

REPO = Path(__file__).resolve().parents[2]
TASK = "worker.examples.shapes:task"
TIMEOUT_S = 120
SCALAR_TAGS = {"loss", "accuracy", "learning_rate", "steps_per_sec", "examples_per_sec"}
SHAPES_LEARNING_RATE = 3e-3
GRID_SIDE = 4 * (16 + 1) + 1  # 16 images of 16x16 pixels, 4x4, with 1-pixel borders


def worker(run_dir: Path, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "worker", "--task", TASK, *flags],
        cwd=REPO,
        env=worker_env(run_dir, **env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def train(run_dir: Path, *flags: str) -> str:
    """Runs a worker that must succeed; returns its stdout."""
    result = worker(run_dir, *flags)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def progress(run_dir: Path) -> dict:
    return json.loads((run_dir / "progress.json").read_text())


def events(directory: Path):
    """Everything the event files in directory hold, as TensorBoard's plugins see it.

    TF2 writes every summary as a tensor with plugin metadata (scalars, images, the trace), so
    the plugin-aware accumulator is the one that shows them; size_guidance 0 keeps every event.
    """
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea

    accumulator = pea.EventAccumulator(str(directory), size_guidance={pea.TENSORS: 0})
    accumulator.Reload()
    return accumulator


def values(accumulator, tag: str):
    tf = pytest.importorskip("tensorflow")
    return [(event.step, tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)]


def decoded_images(accumulator, tag: str) -> list:
    """The images plugin's tensor: [width, height, png, png, ...] as strings."""
    tf = pytest.importorskip("tensorflow")
    [(step, data)] = values(accumulator, tag)
    assert step == 0
    width, height = int(data[0]), int(data[1])
    pictures = [tf.io.decode_png(png).numpy() for png in data[2:]]
    assert all(picture.shape[:2] == (height, width) for picture in pictures)
    return pictures


def test_chief_writes_scalars_sample_images_and_a_profile(tmp_path):
    run_dir = tmp_path / "run"
    board = run_dir / "tensorboard"
    out = train(run_dir, "--steps", "20", "--log-every", "5", "--profile-steps", "5", "8")
    assert f"worker: profile of steps 5..8 written to {board}" in out

    accumulator = events(board)
    tags = set(accumulator.Tags()["tensors"])
    val_tags = {"val_loss", "val_accuracy"}  # the bundled task's final evaluation
    assert tags == SCALAR_TAGS | val_tags | {"inputs/sample", "inputs/grid", "train_step"}
    for tag in val_tags:
        assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"
        assert [step for step, _ in values(accumulator, tag)] == [20]
    for tag in SCALAR_TAGS:
        assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"
        assert [step for step, _ in values(accumulator, tag)] == [5, 10, 15, 20]
    for _, rate in values(accumulator, "learning_rate"):
        assert rate == pytest.approx(SHAPES_LEARNING_RATE)
    for (_, steps), (_, examples) in zip(
        values(accumulator, "steps_per_sec"), values(accumulator, "examples_per_sec"), strict=True
    ):
        assert examples == pytest.approx(steps * 64)  # the default global batch

    assert accumulator.SummaryMetadata("inputs/grid").plugin_data.plugin_name == "images"
    [sample] = decoded_images(accumulator, "inputs/sample")
    assert sample.shape == (16, 16, 1)
    [grid] = decoded_images(accumulator, "inputs/grid")
    assert grid.shape == (GRID_SIDE, GRID_SIDE, 1)
    assert (
        "| col 1 | col 2 | col 3 | col 4 |"
        in accumulator.SummaryMetadata("inputs/grid").summary_description
    )

    # The trace: a RunMetadata with the step function's graphs, at step END...
    tf = pytest.importorskip("tensorflow")
    assert accumulator.SummaryMetadata("train_step").plugin_data.plugin_name == (
        "graph_run_metadata"
    )
    [(step, serialized)] = values(accumulator, "train_step")
    assert step == 8
    run_metadata = tf.compat.v1.RunMetadata.FromString(serialized.item())
    assert run_metadata.function_graphs
    # ...and the profiler's own file, where TensorBoard's profile plugin looks for it.
    profiles = list((board / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(profiles) == 1 and profiles[0].stat().st_size > 0

    # A resumed run: no second set of sample images, and the window lies behind it.
    out = train(run_dir, "--steps", "30", "--log-every", "5", "--profile-steps", "5", "8")
    assert "worker: --profile-steps 5 8 lies outside this run's steps 21..30; not profiling" in out
    accumulator = events(board)
    assert len(accumulator.Tensors("inputs/grid")) == 1
    assert len(accumulator.Tensors("train_step")) == 1
    assert [step for step, _ in values(accumulator, "loss")] == [5, 10, 15, 20, 25, 30]


def test_mirrored_on_two_logical_cpus_trains_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    flags = ("--strategy", "mirrored", "--logical-cpus", "2", "--checkpoint-every", "10")
    out = train(run_dir, *flags, "--steps", "20")
    assert "worker: CPU split into 2 logical devices" in out
    assert "worker: saved checkpoint at step 20" in out
    first = progress(run_dir)
    assert first["num_replicas"] == 2
    assert first["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert (first["step"], first["checkpoint_step"], first["num_workers"]) == (20, 20, 1)
    assert sorted(p.name for p in checkpoints.glob("*.index")) == ["ckpt-10.index", "ckpt-20.index"]

    out = train(run_dir, *flags, "--steps", "30")
    assert f"worker: restored checkpoint at step 20 from {checkpoints}" in out
    assert out.rstrip().endswith("worker: finished at step 30")
    second = progress(run_dir)
    assert (second["start_step"], second["step"], second["num_replicas"]) == (20, 30, 2)


def test_logical_cpus_are_set_before_the_multi_worker_strategy(tmp_path):
    # Set after the strategy, tf.config would raise "Virtual devices cannot be modified after
    # being initialized" and the worker would exit 1.
    run_dir = tmp_path / "run"
    out = train(run_dir, "--logical-cpus", "2", "--steps", "10")
    assert out.rstrip().endswith("worker: finished at step 10")
    # MultiWorkerMirroredStrategy takes GPUs or one CPU per worker: the split CPU is still one
    # replica, but the progress file lists every logical device.
    data = progress(run_dir)
    assert (data["num_replicas"], data["devices"]) == (1, ["/device:CPU:0", "/device:CPU:1"])


def test_gpu_flags_on_a_host_without_gpu_warn_once_and_train(tmp_path):
    tf = pytest.importorskip("tensorflow")
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this host has a GPU; see bench/gpu_check.py")
    result = worker(
        tmp_path,
        "--steps", "3", "--strategy", "mirrored", "--gpu-memory-limit-mb", "256",
        "--logical-gpus", "2", "--visible-gpus", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("worker:")]
    assert warnings == [
        "worker: no GPU found; ignoring GPU settings "
        "(--gpu-memory-limit-mb 256, --visible-gpus 0, --logical-gpus 2)"
    ]
    assert "Traceback" not in result.stderr
    assert progress(tmp_path)["num_replicas"] == 1  # the one CPU


TWO_WORKERS = json.dumps(
    {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 0}}
)


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (
            ["--gpu-memory-growth", "--gpu-memory-limit-mb", "1024"],
            {},
            "worker: --gpu-memory-growth cannot be combined with --gpu-memory-limit-mb",
        ),
        (
            ["--gpu-memory-growth", "--logical-gpus", "2"],
            {},
            "worker: --gpu-memory-growth cannot be combined with --logical-gpus",
        ),
        (["--logical-gpus", "2"], {}, "worker: --logical-gpus needs --gpu-memory-limit-mb"),
        (["--logical-cpus", "0"], {}, "worker: --logical-cpus must be a positive integer, got 0"),
        (["--visible-gpus", "0,0"], {}, "worker: --visible-gpus names GPU 0 more than once"),
        (["--profile-steps", "8", "5"], {}, "worker: --profile-steps START END needs 1 <= START"),
        (
            ["--strategy", "mirrored"],
            {"TF_CONFIG": TWO_WORKERS},
            "worker: --strategy mirrored is single-host, but TF_CONFIG lists 2 workers",
        ),
    ],
)
def test_invalid_settings_exit_2_with_one_line(tmp_path, flags, env, message):
    result = worker(tmp_path, "--steps", "5", *flags, **env)
    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "progress.json").exists()


def test_a_batch_that_does_not_split_over_the_replicas_exits_2(tmp_path):
    # Only the strategy knows the replica count, so this is found after TensorFlow has started
    # (whose own start-up lines on stderr come first), but still before any step.
    result = worker(tmp_path, "--steps", "5", "--strategy", "mirrored", "--logical-cpus", "3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "worker: --batch-size 64 is the global batch size and must be divisible by the number of "
        "replicas (3)"
    )
    assert "Traceback" not in result.stderr
