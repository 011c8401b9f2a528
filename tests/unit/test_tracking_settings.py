"""job.tracking's pure parts (issue 58): the inventory's settings and their problems, the one
worker environment that carries the run's identity, the run record that keeps it, the params,
and the built-in loop's rule against a step logged twice. The real MLflow server runs in
tests/integration/test_tracking.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.backends.registry import host_settings, load_inventory, source_settings_of
from orchestrator.dashboard.watch import mlflow_link
from orchestrator.engine.trackers.base import job_params
from orchestrator.engine.trackers.tracking import run_link, tracking_lines
from orchestrator.engine.workers.launch import tracking_env
from orchestrator.engine.workers.plan import plan_workers
from orchestrator.errors import InventoryError
from orchestrator.model.inventory import Job, Tracking
from orchestrator.model.records import RunRecord
from worker.tracking import fresh

GOLDEN = Path(__file__).parent / "golden" / "inventories"
BASE = """\
defaults: {connection: local, workdir: ./work}
hosts:
  - {name: w0, address: localhost, port: 23456}
  - {name: w1, address: localhost, port: 23457}
job:
  name: demo
  task: worker.examples.shapes:task
  steps: 50
"""


def load(tmp_path: Path, extra: str) -> Job:
    path = tmp_path / "inv.yaml"
    path.write_text(BASE + textwrap.indent(textwrap.dedent(extra), "  "))
    return load_inventory(path).job


def problems(tmp_path: Path, extra: str) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, extra)
    assert caught.value.exit_code == 2
    return [str(p) for p in caught.value.problems]


def test_mlflow_and_wandb_settings_are_read(tmp_path: Path) -> None:
    job = load(tmp_path, """\
        tracking:
          mlflow: http://mlflow.lab:5000/
          experiment: shapes
          wandb: {project: vision, entity: lab}
        secret_env: [MLFLOW_TRACKING_TOKEN, WANDB_API_KEY]
        """)  # fmt: skip
    assert job.tracking == Tracking(mlflow="http://mlflow.lab:5000", experiment="shapes",
                                    wandb_project="vision", wandb_entity="lab")  # fmt: skip
    assert load(tmp_path, "").tracking is None


WANDB = "tracking: {wandb: {project: p}}"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("tracking: http://x:5000", "job.tracking: expected a mapping"),
        ("tracking: {}", "job.tracking: names no tracker"),
        ("tracking: {mlflow: ftp://x}", "job.tracking.mlflow: expected the tracking server's"),
        ("tracking: {mlflow: 'http://u:p@x:5000'}", "job.tracking.mlflow: a user or password"),
        ("tracking: {mlflow: 'http://x:99999'}", "job.tracking.mlflow: not a URL"),
        ("tracking: {experiment: e}", "job.tracking.experiment: applies to mlflow: only"),
        ("tracking: {mlfow: http://x}", "job.tracking.mlfow: unknown key; did you mean 'mlflow'"),
        ("tracking: {wandb: vision}", "job.tracking.wandb: expected a mapping"),
        ("tracking: {wandb: {entity: lab}}", "job.tracking.wandb.project: missing"),
        ("tracking: {wandb: {project: p, team: t}}", "job.tracking.wandb.team: unknown key"),
        (f"{WANDB}\nenv: {{MLFLOW_RUN_ID: x}}", "job.env.MLFLOW_RUN_ID: is set by orchestrate"),
        (f"{WANDB}\nenv: {{WANDB_API_KEY: x}}", "job.env.WANDB_API_KEY: a tracker's credential"),
        (f"{WANDB}\nsecret_env: [WANDB_RUN_ID]", "job.secret_env[0]: is set by orchestrate"),
    ],
)
def test_bad_settings_name_their_key(tmp_path: Path, extra: str, expected: str) -> None:
    found = problems(tmp_path, extra + "\n")
    assert any(expected in p for p in found), found


def test_without_tracking_the_trackers_variables_are_the_users() -> None:
    """An inventory that sets WANDB_PROJECT itself, as before job.tracking existed, loads."""
    job = load_inventory(GOLDEN / "script.yaml").job
    assert job.tracking is None and "WANDB_PROJECT" in job.env


def test_a_bad_setting_is_exit_2_naming_the_key_from_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(BASE + "  tracking: {mlflow: ftp://x}\n")
    done = subprocess.run([sys.executable, "-m", "orchestrator", "check", str(path)],
                          capture_output=True, text=True, cwd=tmp_path, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "job.tracking.mlflow" in done.stderr and "Traceback" not in done.stderr


IDENTITY = Tracking(
    mlflow="http://m:5000",
    wandb_project="p",
    wandb_entity="e",
    mlflow_run_id="abc",
    mlflow_experiment_id="7",
    wandb_run_id="x1y2z3w4",
)


def test_every_worker_gets_the_runs_identity() -> None:
    assert tracking_env(IDENTITY, "demo") == {
        "MLFLOW_TRACKING_URI": "http://m:5000", "MLFLOW_RUN_ID": "abc",
        "MLFLOW_EXPERIMENT_ID": "7", "WANDB_PROJECT": "p", "WANDB_ENTITY": "e",
        "WANDB_RUN_ID": "x1y2z3w4", "WANDB_RESUME": "allow",
    }  # fmt: skip
    # A run whose server was not reached at `up`: the experiment by name, no run to resume.
    unreached = Tracking(mlflow="http://m:5000", experiment="shapes")
    assert tracking_env(unreached, "demo") == {
        "MLFLOW_TRACKING_URI": "http://m:5000", "MLFLOW_EXPERIMENT_NAME": "shapes"}  # fmt: skip


def test_the_launch_of_every_worker_carries_it(tmp_path: Path) -> None:
    """Through the one definition of a worker (plan_workers -> worker_launch), every slot and
    every attempt."""
    path = tmp_path / "inv.yaml"
    path.write_text(BASE + "  tracking: {mlflow: http://m:5000}\n")
    inventory = load_inventory(path)
    inventory = replace(inventory, job=replace(inventory.job, tracking=IDENTITY))
    for attempt in (0, 3):
        specs = plan_workers(inventory, "r", {"w0": "/w", "w1": "/w"}, attempt,
                             reads_in_place=lambda host: True)  # fmt: skip
        assert [s.launch.env["MLFLOW_RUN_ID"] for s in specs] == ["abc", "abc"]


def test_the_run_record_keeps_the_identity(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(BASE)
    inventory = load_inventory(path)
    inventory = replace(inventory, job=replace(inventory.job, tracking=IDENTITY))
    record = RunRecord(run_id="r", inventory=inventory, created_at=1.0)
    data = json.loads(json.dumps(record.to_json()))
    back = RunRecord.from_json(data, host_settings, source_settings_of)
    assert back.inventory.job.tracking == IDENTITY


def test_params_leave_out_the_environment_and_say_the_link() -> None:
    job = Job(name="demo", task="m:f", steps=9, env={"TOKENISH": "v"}, secret_env=("S",),
              tracking=IDENTITY)  # fmt: skip
    params = job_params(job, "r1", 2)
    assert params["job.steps"] == "9" and params["workers"] == "2"
    assert params["orchestrate.run_id"] == "r1"
    assert not any(k in params for k in ("job.env", "job.secret_env", "job.tracking"))
    assert run_link(IDENTITY) == "http://m:5000/#/experiments/7/runs/abc"
    assert tracking_lines(IDENTITY) == [
        "tracking: MLflow run abc  http://m:5000/#/experiments/7/runs/abc",
        "tracking: W&B run x1y2z3w4 in e/p"]  # fmt: skip


def test_the_dashboard_links_to_the_mlflow_run_and_only_over_http(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(BASE)
    inventory = load_inventory(path)

    def record(tracking: Tracking | None) -> RunRecord:
        job = replace(inventory.job, tracking=tracking)
        return RunRecord(run_id="r", inventory=replace(inventory, job=job), created_at=1.0)

    assert mlflow_link(record(IDENTITY)) == "http://m:5000/#/experiments/7/runs/abc"
    assert mlflow_link(record(None)) is None
    assert mlflow_link(record(Tracking(mlflow="http://m:5000"))) is None  # no run was made
    assert mlflow_link(record(replace(IDENTITY, mlflow="javascript:alert(1)"))) is None


def test_steps_the_run_holds_already_are_not_logged_again() -> None:
    """After a resume from the checkpoint at step 20 of a run that logged up to 40, steps 30
    and 40 are trained again: they are not logged twice; 50 is."""
    logged = {"loss": 40, "val_loss": None}
    values = {"loss": 0.5, "accuracy": None, "val_loss": 0.7}
    assert fresh(30, values, logged) == {"val_loss": 0.7}
    assert fresh(40, values, logged) == {"val_loss": 0.7}
    assert fresh(50, values, logged) == {"loss": 0.5, "val_loss": 0.7}
    assert fresh(10, {"lr": 1.0}, {}) == {"lr": 1.0}  # a metric the run never had


def test_nothing_of_mlflow_or_wandb_is_imported_without_tracking() -> None:
    code = (
        "import sys, orchestrator.cli, orchestrator.engine.supervision.supervise, worker.tracking; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'wandb')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"
