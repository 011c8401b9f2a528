"""Flags, environment and task loading of the worker: pure rules, no TensorFlow, no processes."""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Iterator

import pytest

from worker import cli
from worker.config import ClusterInfo, ConfigError, parse_tf_config
from worker.task import TaskError, TrainingTask, load_task

TASK = "worker.examples.shapes:task"


def tf_config(index: int, workers: int = 2) -> str:
    cluster = {"worker": [f"host{i}:20000" for i in range(workers)]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> str:
    """Run in an empty directory, so relative defaults resolve somewhere known."""
    monkeypatch.chdir(tmp_path)
    return str(tmp_path)


def test_defaults_without_environment(in_tmp):
    config = cli.parse_config(["--task", TASK, "--steps", "30"], {})
    assert config.task == TASK
    assert config.steps == 30
    assert (config.checkpoint_every, config.max_to_keep) == (100, 3)
    assert (config.batch_size, config.log_every) == (64, 10)
    assert config.checkpoint_dir == os.path.join(in_tmp, "checkpoints")
    assert config.tensorboard_dir == os.path.join(in_tmp, "tensorboard")
    assert config.progress_file is None
    assert config.temp_checkpoint_dir is None
    assert config.cluster == ClusterInfo(task_index=0, num_workers=1)
    assert config.cluster.is_chief


def test_run_dir_and_progress_file_from_environment(in_tmp):
    env = {
        "ORCHESTRATE_RUN_DIR": "run",
        "ORCHESTRATE_PROGRESS_FILE": "run/progress.json",
        "TF_CONFIG": tf_config(1),
    }
    config = cli.parse_config(["--task", TASK, "--steps", "5"], env)
    run_dir = os.path.join(in_tmp, "run")
    assert config.checkpoint_dir == os.path.join(run_dir, "checkpoints")
    assert config.tensorboard_dir == os.path.join(run_dir, "tensorboard")
    assert config.progress_file == os.path.join(run_dir, "progress.json")
    assert config.temp_checkpoint_dir == os.path.join(run_dir, "tmp-checkpoints", "worker-1")
    assert config.cluster == ClusterInfo(task_index=1, num_workers=2)
    assert not config.cluster.is_chief


def test_explicit_flags_win_over_defaults(in_tmp):
    argv = [
        "--task", TASK, "--steps", "7", "--checkpoint-dir", "out/ckpt", "--checkpoint-every", "3",
        "--max-to-keep", "1", "--batch-size", "32", "--log-every", "2",
    ]  # fmt: skip
    config = cli.parse_config(argv, {"ORCHESTRATE_RUN_DIR": "/elsewhere"})
    assert config.checkpoint_dir == os.path.join(in_tmp, "out", "ckpt")
    # The TensorBoard directory follows the checkpoint directory, not the run directory.
    assert config.tensorboard_dir == os.path.join(in_tmp, "out", "tensorboard")
    assert (config.checkpoint_every, config.max_to_keep) == (3, 1)
    assert (config.batch_size, config.log_every) == (32, 2)


def test_explicit_tensorboard_dir(in_tmp):
    config = cli.parse_config(["--task", TASK, "--steps", "1", "--tensorboard-dir", "tb"], {})
    assert config.tensorboard_dir == os.path.join(in_tmp, "tb")


def test_empty_environment_variables_count_as_unset(in_tmp):
    env = {"ORCHESTRATE_RUN_DIR": "", "ORCHESTRATE_PROGRESS_FILE": "", "TF_CONFIG": " "}
    config = cli.parse_config(["--task", TASK, "--steps", "1"], env)
    assert config.progress_file is None
    assert config.checkpoint_dir == os.path.join(in_tmp, "checkpoints")
    assert config.cluster == ClusterInfo()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "10"], "--task"),
        (["--task", TASK], "--steps"),
        (["--task", TASK, "--steps", "ten"], "invalid int value: 'ten'"),
        (["--task", TASK, "--steps", "0"], "--steps must be a positive integer, got 0"),
        (["--task", TASK, "--steps", "5", "--checkpoint-every", "-1"], "--checkpoint-every"),
        (["--task", TASK, "--steps", "5", "--max-to-keep", "0"], "--max-to-keep"),
        (["--task", TASK, "--steps", "5", "--batch-size", "0"], "--batch-size"),
        (["--task", TASK, "--steps", "5", "--log-every", "0"], "--log-every"),
        (["--task", TASK, "--steps", "5", "--epochs", "3"], "unrecognized arguments: --epochs 3"),
        (["--task", "shapes", "--steps", "5"], "MODULE:FUNCTION, got 'shapes'"),
        (["--task", "a.b:c:d", "--steps", "5"], "MODULE:FUNCTION"),
        (["--task", "a-b:c", "--steps", "5"], "MODULE:FUNCTION"),
    ],
)
def test_bad_flags_name_the_problem(argv, message):
    with pytest.raises(ConfigError) as error:
        cli.parse_config(argv, {})
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_global_batch_must_split_evenly_over_workers():
    argv = ["--task", TASK, "--steps", "5"]
    with pytest.raises(ConfigError, match=r"--batch-size 64 .* number of workers \(3\)"):
        cli.parse_config(argv, {"TF_CONFIG": tf_config(0, workers=3)})
    config = cli.parse_config([*argv, "--batch-size", "63"], {"TF_CONFIG": tf_config(2, workers=3)})
    assert config.batch_size == 63


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "needs 'cluster' and 'task'"),
        ('{"cluster": {"worker": ["a:1"]}}', "needs 'cluster' and 'task'"),
        ('{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}', "non-empty"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}', "0..0"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}}', "'0'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": true}}', "True"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "only"),
        (
            '{"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", '
            '"index": 0}}',
            "only 'worker' tasks",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}',
            "an 'evaluator' task runs 'python -m worker.evaluate --watch'",
        ),
        (
            '{"cluster": {"ps": ["p:1"], "worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}',
            "chief and ps tasks need --strategy parameter-server",
        ),
    ],
)
def test_bad_tf_config(text, message):
    with pytest.raises(ConfigError) as error:
        parse_tf_config(text)
    assert message in str(error.value)


PS_CLUSTER = {"chief": ["c:1"], "worker": ["a:1", "b:1"], "ps": ["p:1"]}


def ps_config(kind: str, index: int, cluster: dict | None = None) -> str:
    return json.dumps({"cluster": cluster or PS_CLUSTER, "task": {"type": kind, "index": index}})


def test_tf_config_under_parameter_server_names_who_steps_and_who_serves(in_tmp):
    chief = parse_tf_config(ps_config("chief", 0), "parameter-server")
    assert (chief.is_chief, chief.serves, chief.num_workers) == (True, False, 2)
    worker = parse_tf_config(ps_config("worker", 0), "parameter-server")
    assert (worker.is_chief, worker.serves, worker.task_index) == (False, True, 0)
    ps = parse_tf_config(ps_config("ps", 0), "parameter-server")
    assert (ps.is_chief, ps.serves, ps.task_type) == (False, True, "ps")
    assert not parse_tf_config(tf_config(0)).serves  # MultiWorkerMirrored: everyone steps
    # A batch of 63 over two workers is fine: each step is one worker's whole batch.
    argv = ["--task", TASK, "--steps", "5", "--strategy", "parameter-server", "--batch-size", "63"]
    config = cli.parse_config(argv, {"TF_CONFIG": ps_config("chief", 0)})
    assert config.cluster.parameter_server and config.batch_size == 63


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "needs TF_CONFIG with a chief, ps and worker tasks"),
        (ps_config("evaluator", 0), "task type must be one of chief, worker, ps"),
        (ps_config("worker", 2), "0..1"),
        (ps_config("chief", 0, {"chief": ["c:1"], "worker": ["a:1"]}), "a cluster of one 'chief'"),
        (ps_config("chief", 0, {**PS_CLUSTER, "chief": ["c:1", "d:1"]}), "one 'chief'"),
    ],
)
def test_bad_tf_config_under_parameter_server(text, message):
    with pytest.raises(ConfigError) as error:
        parse_tf_config(text, "parameter-server")
    assert message in str(error.value)


def test_steps_per_call_is_refused_under_parameter_server(in_tmp):
    argv = ["--task", TASK, "--steps", "5", "--strategy", "parameter-server", "--steps-per-call",
            "5", "--log-every", "5", "--checkpoint-every", "5"]  # fmt: skip
    with pytest.raises(ConfigError, match="each step is a closure the chief schedules"):
        cli.parse_config(argv, {"TF_CONFIG": ps_config("chief", 0)})


def test_tf_config_of_a_three_worker_cluster():
    assert parse_tf_config(tf_config(2, workers=3)) == ClusterInfo(task_index=2, num_workers=3)
    assert parse_tf_config(None) == ClusterInfo(task_index=0, num_workers=1)


# --- task loading --------------------------------------------------------------------------------


@pytest.fixture
def fake_module(monkeypatch) -> Iterator[types.ModuleType]:
    """An importable module whose attributes each test sets; no TensorFlow needed."""
    module = types.ModuleType("fake_worker_tasks")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    yield module


def test_load_task_returns_the_training_task(fake_module):
    expected = TrainingTask(model=lambda: None, dataset=lambda: None, num_classes=3)
    fake_module.good = lambda: expected
    assert load_task("fake_worker_tasks:good") is expected


def test_training_task_defaults_and_frozen() -> None:
    task = TrainingTask(model=lambda: None, dataset=lambda: None)
    assert callable(task.optimizer) and callable(task.loss)
    assert task.learning_rate is None and task.num_classes is None
    with pytest.raises(AttributeError):
        task.steps = 3  # type: ignore[attr-defined]  # frozen: no attribute can be set


@pytest.mark.parametrize(
    ("setup", "spec", "message"),
    [
        (
            None,
            "no_such_module_xyz:task",
            "cannot import task 'no_such_module_xyz:task': No module",
        ),
        (None, "fake_worker_tasks:missing", "fake_worker_tasks has no function 'missing'"),
        (lambda m: setattr(m, "task", 42), "fake_worker_tasks:task", "no function 'task'"),
        (lambda m: setattr(m, "task", dict), "fake_worker_tasks:task", "returned dict, not a"),
        (lambda m: setattr(m, "task", lambda: 1 / 0), "fake_worker_tasks:task", "ZeroDivision"),
        (
            lambda m: setattr(m, "task", lambda: TrainingTask(model=None, dataset=list)),  # type: ignore[arg-type]
            "fake_worker_tasks:task",
            "TrainingTask.model must be callable",
        ),
    ],
)
def test_bad_tasks_name_the_problem(fake_module, setup, spec, message):
    if setup is not None:
        setup(fake_module)
    with pytest.raises(TaskError) as error:
        load_task(spec)
    assert message in str(error.value)


# --- exit codes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--task", TASK, "--steps", "0"], "worker: --steps must be a positive integer, got 0"),
        (["--task", "nope_xyz.mod:task", "--steps", "5"], "worker: cannot import task"),
    ],
)
def test_main_reports_user_mistakes_in_one_line_with_exit_2(capsys, argv, message):
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert len(err.strip().splitlines()) == 1
