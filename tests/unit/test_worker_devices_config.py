"""Strategy, profiling and device flags of the worker: pure rules, no TensorFlow, no processes."""

from __future__ import annotations

import json

import pytest

from worker import cli
from worker.config import (
    ClusterInfo,
    ConfigError,
    DeviceSettings,
    check_device_settings,
    check_profile_steps,
    parse_visible_gpus,
)

TASK = "worker.examples.shapes:task"
BASE = ["--task", TASK, "--steps", "20"]


def parse(*flags: str, env: dict[str, str] | None = None):
    return cli.parse_config([*BASE, *flags], env or {})


def two_worker_tf_config() -> str:
    cluster = {"worker": ["host0:20000", "host1:20000"]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})


def test_defaults_change_nothing():
    config = parse()
    assert config.strategy == "multi-worker"
    assert config.profile_steps is None
    assert config.devices == DeviceSettings()
    assert config.devices.gpu_flags() == []


def test_every_device_flag_reaches_the_settings():
    config = parse(
        "--gpu-memory-limit-mb", "1024", "--logical-gpus", "2", "--visible-gpus", "1, 0",
        "--logical-cpus", "4",
    )  # fmt: skip
    assert config.devices == DeviceSettings(
        memory_growth=False,
        memory_limit_mb=1024,
        visible_gpus=(1, 0),
        logical_gpus=2,
        logical_cpus=4,
    )
    # The order of the warning on a host without GPU; --logical-cpus is not a GPU setting.
    assert config.devices.gpu_flags() == [
        "--gpu-memory-limit-mb 1024", "--visible-gpus 1,0", "--logical-gpus 2",
    ]  # fmt: skip


def test_memory_growth_alone_and_with_visible_gpus():
    settings = parse("--gpu-memory-growth", "--visible-gpus", "0").devices
    assert settings.memory_growth and settings.visible_gpus == (0,)
    assert settings.gpu_flags() == ["--gpu-memory-growth", "--visible-gpus 0"]


def test_a_memory_limit_without_logical_gpus_is_fine():
    assert parse("--gpu-memory-limit-mb", "512").devices.memory_limit_mb == 512


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", (0,)), ("0,1", (0, 1)), ("3,1", (3, 1)), (" 2 , 0 ", (2, 0)), ("10", (10,))],
)
def test_parse_visible_gpus(text, expected):
    assert parse_visible_gpus(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "comma-separated GPU indices such as 0,1, got ''"),
        ("0,", "got '0,'"),
        ("a", "got 'a'"),
        ("-1", "got '-1'"),
        ("0;1", "got '0;1'"),
        ("1.5", "got '1.5'"),
        ("0,1,0", "names GPU 0 more than once"),
    ],
)
def test_bad_visible_gpus(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_visible_gpus(text)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--gpu-memory-growth", "--gpu-memory-limit-mb", "1024"],
            "--gpu-memory-growth cannot be combined with --gpu-memory-limit-mb",
        ),
        (
            ["--gpu-memory-growth", "--logical-gpus", "2", "--gpu-memory-limit-mb", "100"],
            "--gpu-memory-growth cannot be combined with --gpu-memory-limit-mb",
        ),
        (
            ["--gpu-memory-growth", "--logical-gpus", "2"],
            "--gpu-memory-growth cannot be combined with --logical-gpus",
        ),
        (["--logical-gpus", "2"], "--logical-gpus needs --gpu-memory-limit-mb"),
        (["--gpu-memory-limit-mb", "0"], "--gpu-memory-limit-mb must be a positive integer, got 0"),
        (["--gpu-memory-limit-mb", "-5"], "--gpu-memory-limit-mb must be a positive integer"),
        (
            ["--logical-gpus", "0", "--gpu-memory-limit-mb", "100"],
            "--logical-gpus must be a positive integer, got 0",
        ),
        (["--logical-cpus", "0"], "--logical-cpus must be a positive integer, got 0"),
        (["--logical-cpus", "-2"], "--logical-cpus must be a positive integer, got -2"),
        (["--gpu-memory-limit-mb", "1G"], "argument --gpu-memory-limit-mb: invalid int value"),
        (["--visible-gpus", "gpu0"], "--visible-gpus must be comma-separated GPU indices"),
        (["--gpu-memory-growth", "yes"], "unrecognized arguments: yes"),
    ],
)
def test_bad_device_flags_name_the_problem(flags, message):
    with pytest.raises(ConfigError) as error:
        parse(*flags)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_check_device_settings_directly():
    check_device_settings(DeviceSettings(memory_limit_mb=100, logical_gpus=3, visible_gpus=(0,)))
    with pytest.raises(ConfigError, match="cannot be combined"):
        check_device_settings(DeviceSettings(memory_growth=True, memory_limit_mb=100))


# --- profiling -----------------------------------------------------------------------------------


def test_profile_steps():
    assert parse("--profile-steps", "5", "8").profile_steps == (5, 8)
    assert parse("--profile-steps", "1", "2").profile_steps == (1, 2)
    assert check_profile_steps(None) is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--profile-steps", "8", "5"], "needs 1 <= START < END, got 8 5"),
        (["--profile-steps", "5", "5"], "needs 1 <= START < END, got 5 5"),
        (["--profile-steps", "0", "5"], "needs 1 <= START < END, got 0 5"),
        (["--profile-steps", "-3", "5"], "got -3 5"),
        (["--profile-steps", "5"], "argument --profile-steps: expected 2 arguments"),
        (["--profile-steps", "5", "x"], "argument --profile-steps: invalid int value: 'x'"),
    ],
)
def test_bad_profile_steps(flags, message):
    with pytest.raises(ConfigError) as error:
        parse(*flags)
    assert message in str(error.value)


# --- strategy ------------------------------------------------------------------------------------


def test_mirrored_strategy_on_one_host():
    config = parse("--strategy", "mirrored")
    assert config.strategy == "mirrored"
    assert config.cluster == ClusterInfo()


def test_mirrored_ignores_a_one_worker_tf_config():
    one = json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})
    assert parse("--strategy", "mirrored", env={"TF_CONFIG": one}).cluster == ClusterInfo()


def test_mirrored_refuses_a_cluster():
    with pytest.raises(ConfigError) as error:
        parse("--strategy", "mirrored", env={"TF_CONFIG": two_worker_tf_config()})
    assert str(error.value) == (
        "--strategy mirrored is single-host, but TF_CONFIG lists 2 workers; unset TF_CONFIG or "
        "use --strategy multi-worker"
    )


def test_multi_worker_keeps_the_cluster():
    config = parse("--strategy", "multi-worker", env={"TF_CONFIG": two_worker_tf_config()})
    assert config.cluster == ClusterInfo(task_index=1, num_workers=2)


def test_unknown_strategy():
    with pytest.raises(ConfigError, match="invalid choice: 'central-storage'"):
        parse("--strategy", "central-storage")
    # parameter-server is known, and needs its cluster (the hosts' roles give it).
    with pytest.raises(ConfigError, match="needs TF_CONFIG with a chief, ps and worker tasks"):
        parse("--strategy", "parameter-server")


@pytest.mark.parametrize(
    "flags",
    [
        ["--gpu-memory-growth", "--gpu-memory-limit-mb", "10"],
        ["--logical-gpus", "2"],
        ["--visible-gpus", "x"],
        ["--profile-steps", "3", "2"],
    ],
)
def test_main_exits_2_with_one_line_for_device_and_profile_mistakes(capsys, flags):
    assert cli.main([*BASE, *flags]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("worker: --")
    assert len(err.strip().splitlines()) == 1
