"""TF_CONFIG and each worker's command line, environment and paths."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.contract import SCRIPT_BOOT, booted
from orchestrator.engine.workers.tfconfig import tf_config
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from tests.fakes.planning import plan_workers


def inventory(job: Job | None = None) -> Inventory:
    hosts = (
        WorkerSlot(name="a", address="10.0.0.1", port=20000),
        WorkerSlot(name="b", address="10.0.0.2", port=20000, workdir="/data"),
        WorkerSlot(name="c", address="fe80::1", port=20001),
    )
    job = job or Job(name="demo", task="pkg.mod:task", steps=100, env={"K": "v w"})
    return Inventory(path="inv.yaml", base_dir="/inv", hosts=hosts, job=job)


def test_same_cluster_for_every_worker_and_own_index() -> None:
    inv = inventory()
    configs = [tf_config(inv, i) for i in range(3)]
    assert all(
        c["cluster"] == {"worker": ["10.0.0.1:20000", "10.0.0.2:20000", "[fe80::1]:20001"]}
        for c in configs
    )
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert json.loads(json.dumps(configs[1])) == configs[1]  # plain JSON, as written to hosts


def test_index_out_of_range() -> None:
    with pytest.raises(IndexError):
        tf_config(inventory(), 3)


def test_plan_paths_command_and_env() -> None:
    specs = plan_workers(inventory(), "r1", {"a": "/home/u/orchestrate", "b": "/data", "c": "/c"})
    a, b, _ = specs
    assert a.run_dir == "/home/u/orchestrate/demo/runs/r1/attempt-0/a"
    assert b.checkpoint_dir == "/data/demo/checkpoints"
    assert a.argv[:5] == ("python3", "-m", "worker", "--task", "pkg.mod:task")
    assert a.argv[a.argv.index("--checkpoint-dir") + 1] == "/home/u/orchestrate/demo/checkpoints"
    assert a.env["K"] == "v w" and a.env["ORCHESTRATE_RUN_DIR"] == a.run_dir
    assert a.env["ORCHESTRATE_PROGRESS_FILE"] == a.run_dir + "/progress.json"
    assert b.tf_config["task"]["index"] == 1
    assert a.cwd == a.run_dir  # ssh workers start in their run directory
    # TF_CONFIG travels as a file, not as an environment string built by a shell.
    assert "TF_CONFIG" not in a.env


def test_each_attempt_gets_fresh_run_directories() -> None:
    workdirs = {"a": "/w", "b": "/w", "c": "/w"}
    first = plan_workers(inventory(), "r", workdirs)[0]
    second = plan_workers(inventory(), "r", workdirs, attempt=1)[0]
    assert second.run_dir == "/w/demo/runs/r/attempt-1/a" != first.run_dir
    assert second.tf_config == first.tf_config and second.checkpoint_dir == first.checkpoint_dir


def test_script_job_and_absolute_checkpoint_dir() -> None:
    job = Job(name="s", script="/inv/train.py", args=("--lr", "0.1"), checkpoint_dir="/shared/ck")
    a = plan_workers(inventory(job), "r", {"a": "/w", "b": "/w", "c": "/w"})[0]
    # An SSH host runs the uploaded copy of the script from its run directory, behind the boot
    # that registers its stack dump (`python -c BOOT SCRIPT ARGS`).
    assert a.argv == ("python3", "-c", SCRIPT_BOOT, "/w/s/runs/r/attempt-0/a/train.py", "--lr",
                      "0.1")  # fmt: skip
    assert a.uploads == (("/inv/train.py", "/w/s/runs/r/attempt-0/a/train.py"),)
    assert a.checkpoint_dir == "/shared/ck" and a.env["ORCHESTRATE_CHECKPOINT_DIR"] == "/shared/ck"


def test_local_workers_use_files_in_place() -> None:
    job = Job(name="s", script="/inv/train.py", files=("/inv/data",))
    base = inventory(job)
    local = Inventory(
        base.path, base.base_dir, tuple(replace(h, connection="local") for h in base.hosts), job
    )
    a = plan_workers(local, "r", {"a": "/w", "b": "/w", "c": "/w"})[0]
    assert a.argv == booted(("python3", "/inv/train.py")) and a.uploads == () and a.cwd == "/inv"


def test_ssh_workers_get_script_and_files_uploaded() -> None:
    job = Job(name="s", script="/inv/train.py", files=("/inv/data", "/inv/lib/util.py"))
    a = plan_workers(inventory(job), "r", {"a": "/w", "b": "/w", "c": "/w"})[0]
    assert [remote for _, remote in a.uploads] == [
        "/w/s/runs/r/attempt-0/a/train.py",
        "/w/s/runs/r/attempt-0/a/data",
        "/w/s/runs/r/attempt-0/a/util.py",
    ]


def test_gpu_strategy_and_profile_flags_reach_the_worker() -> None:
    base = inventory(Job(name="g", task="m:f", steps=10, profile_steps=(5, 8)))
    hosts = (replace(base.hosts[0], gpu_memory_limit_mb=2048, logical_gpus=2, visible_gpus=(1,)),
             *base.hosts[1:])  # fmt: skip
    argv = plan_workers(replace(base, hosts=hosts), "r", {"a": "/w", "b": "/w", "c": "/w"})[0].argv
    joined = " ".join(argv)
    assert "--gpu-memory-limit-mb 2048 --visible-gpus 1 --logical-gpus 2" in joined
    assert "--profile-steps 5 8" in joined and "--strategy" not in joined


def test_script_jobs_get_visible_gpus_as_cuda_visible_devices() -> None:
    base = inventory(Job(name="s", script="/inv/train.py"))
    hosts = (replace(base.hosts[0], visible_gpus=(0, 2)), *base.hosts[1:])
    spec = plan_workers(replace(base, hosts=hosts), "r", {"a": "/w", "b": "/w", "c": "/w"})[0]
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0,2"


def test_eval_and_export_flags_reach_the_worker() -> None:
    job = Job(name="e", task="m:f", steps=10, eval_every=25, export="saved_model")
    a, b, _ = plan_workers(inventory(job), "r", {"a": "/w", "b": "/data", "c": "/c"})
    assert "--eval-every 25 --export saved_model --export-dir /w/e/export" in " ".join(a.argv)
    assert b.argv[b.argv.index("--export-dir") + 1] == "/data/e/export"
    plain = plan_workers(inventory(), "r", {"a": "/w", "b": "/w", "c": "/w"})[0].argv
    assert "--eval-every" not in plain and "--export" not in plain
