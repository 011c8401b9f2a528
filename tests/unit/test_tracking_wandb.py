"""What the controller writes into the run's W&B run (engine/trackers/wandbrun.py, issue 58):
the plans made from the job and from a RunRecord and its goodput, the child that writes them
(wandbwrite.py) against a stand-in of wandb's module, and the child process's failures. W&B's
own files from real runs are read in tests/integration/test_tracking.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.engine.trackers import wandbrun, wandbwrite
from orchestrator.engine.trackers.base import TrackingError, job_config, job_params
from orchestrator.engine.trackers.tracking import RunTrackers
from orchestrator.model.inventory import Inventory, Job, Tracking, WorkerSlot
from orchestrator.model.records import Restart, RunRecord

TRACKING = Tracking(wandb_project="vision", wandb_entity="lab", wandb_run_id="ab12cd34")
JOB = Job(name="demo", task="m:f", steps=400, env={"TOKENISH": "v"}, secret_env=("S",),
          permanent_exit_codes=(2, 3), tracking=TRACKING)  # fmt: skip
HOSTS = (WorkerSlot("alpha", "localhost", 1), WorkerSlot("beta", "localhost", 2))
INVENTORY = Inventory(path="inv.yaml", base_dir=".", job=JOB, hosts=HOSTS)
GOODPUT = {"goodput": 0.8, "total_seconds": 100.0,
           "seconds": {"productive": 80.0, "restart": 15.0, "lost": 5.0}}  # fmt: skip


def record(**fields: Any) -> RunRecord:
    return RunRecord(run_id="r2", inventory=INVENTORY, created_at=1.0, **fields)


def test_the_start_writes_the_jobs_settings_as_config_and_names_the_run() -> None:
    plan = wandbrun.start_plan(TRACKING, INVENTORY, "r1")
    assert (plan.id, plan.project, plan.entity) == ("ab12cd34", "vision", "lab")
    assert plan.name == "demo-r1" and plan.exit_code == 0
    config = plan.config
    assert config is not None
    assert config["job.steps"] == 400 and config["workers"] == 2  # numbers, for W&B's filters
    assert config["job.permanent_exit_codes"] == [2, 3]
    assert config["orchestrate.run_id"] == "r1"
    assert not any(k in config for k in ("job.env", "job.secret_env", "job.tracking"))
    # The names MLflow's params have: a run reads alike in both trackers.
    assert set(config) == set(job_params(JOB, "r1", 2)) == set(job_config(JOB, "r1", 2))


def test_the_end_writes_each_restart_the_goodput_and_the_verdict() -> None:
    """Two restarts of the cluster in a run that resumes one with two (restarts_before): they
    are the 3rd and 4th; a worker restarted by itself has its own keys."""
    restarts = (
        Restart(at=10.0, attempt=0, worker="beta", reason="killed by SIGKILL", step=57),
        Restart(at=20.0, attempt=1, worker="alpha", reason="exit 1", step=None),
    )
    alone = (Restart(at=30.4, attempt=2, worker="w1", reason="exit 1", step=90),)
    tracking = replace(TRACKING, restarts_before=2)
    event = {"event": "succeeded", "goodput": GOODPUT}
    plan = wandbrun.end_plan(tracking, "succeeded", event, record(restarts=restarts, alone=alone))
    summary = plan.summary
    assert plan.exit_code == 0 and plan.config is None and plan.name is None
    assert summary["orchestrate.verdict"] == "succeeded"
    assert summary["orchestrate.run_id"] == "r2"
    assert summary["orchestrate.restart_count"] == 4
    assert summary["orchestrate.restart.3"] == "beta at step 57: killed by SIGKILL"
    assert (summary["orchestrate.restart.3.worker"], summary["orchestrate.restart.3.kind"],
            summary["orchestrate.restart.3.step"]) == ("beta", "crashed", 57)  # fmt: skip
    assert summary["orchestrate.restart.4"] == "alpha: exit 1"
    assert summary["orchestrate.restart.4.step"] is None
    assert summary["orchestrate.restart_alone.w1.30.worker"] == "w1"
    assert summary["orchestrate.goodput"] == 0.8
    assert summary["orchestrate.goodput.total_seconds"] == 100.0
    assert summary["orchestrate.goodput.restart_seconds"] == 15.0
    assert "orchestrate.root_cause" not in summary


@pytest.mark.parametrize(
    ("verdict", "code"), [("succeeded", 0), ("failed", 1), ("stopped", 130), ("preempted", 75)]
)
def test_only_a_success_ends_the_wandb_run_finished(verdict: str, code: int) -> None:
    """W&B shows exit code 0 as finished and any other as failed: a stopped or preempted run
    did not finish; its verdict says which it was."""
    event = {"event": verdict, "root_cause": "why", "goodput": {"goodput": None}}
    plan = wandbrun.end_plan(TRACKING, verdict, event, record(leases_lost="port 1"))
    assert plan.exit_code == code
    assert plan.summary["orchestrate.verdict"] == verdict
    assert plan.summary["orchestrate.root_cause"] == "why"
    assert plan.summary["orchestrate.lease_lost"] == "port 1"
    assert "orchestrate.goodput" not in plan.summary  # not measured: not written as 0


class FakeRun:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.summary: dict[str, Any] = {}
        self.finished: int | None = None

    def finish(self, exit_code: int) -> None:
        self.finished = exit_code


class FakeWandb:
    """wandb's module as wandbwrite uses it: Settings, init, the run's summary and finish."""

    def __init__(self, fail: bool = False) -> None:
        self.run = FakeRun(fail)
        self.init_args: dict[str, Any] = {}
        if fail:
            self.run.summary = None  # type: ignore[assignment]  # update() raises

    @staticmethod
    def Settings(**settings: Any) -> dict[str, Any]:  # noqa: N802 - wandb's name
        return settings

    def init(self, **args: Any) -> FakeRun:
        self.init_args = args
        return self.run


def test_the_child_resumes_the_run_quietly_and_ends_it_with_the_plans_code() -> None:
    wandb = FakeWandb()
    wandbwrite.write(wandbrun.start_plan(TRACKING, INVENTORY, "r1"), wandb)
    args = wandb.init_args
    assert (args["id"], args["project"], args["entity"], args["resume"]) == (
        "ab12cd34", "vision", "lab", "allow")  # fmt: skip
    assert args["config"]["job.steps"] == 400 and args["name"] == "demo-r1"
    settings = args["settings"]
    assert settings["silent"] and settings["console"] == "off"
    assert settings["init_timeout"] <= 30 and settings["finish_timeout"] <= 30
    assert wandb.run.summary == {"orchestrate.run_id": "r1"} and wandb.run.finished == 0


def test_the_child_ends_the_run_even_when_a_write_fails() -> None:
    wandb = FakeWandb(fail=True)
    plan = wandbrun.end_plan(TRACKING, "stopped", {"event": "stopped"}, record())
    with pytest.raises(AttributeError):
        wandbwrite.write(plan, wandb)
    assert wandb.run.finished == 130


def test_the_childs_environment_names_no_other_run_and_keeps_it_quiet(tmp_path: Path) -> None:
    environ = {"WANDB_API_KEY": "k", "WANDB_RUN_ID": "other", "WANDB_RESUME": "must",
               "WANDB_MODE": "offline", "PATH": "/bin"}  # fmt: skip
    env = wandbrun.writer_env(tmp_path, environ)
    assert env["WANDB_API_KEY"] == "k" and env["WANDB_MODE"] == "offline"
    assert "WANDB_RUN_ID" not in env and "WANDB_RESUME" not in env
    assert env["WANDB_SILENT"] == "true" and env["WANDB_DIR"] == str(tmp_path.resolve())
    relative = wandbrun.writer_env(tmp_path, {"WANDB_DIR": "runs"})["WANDB_DIR"]
    assert relative == str(Path("runs").resolve())  # the child runs in the state directory


def test_a_write_that_hangs_is_killed_at_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that does not end (here: one that sleeps) is killed with its process group."""
    monkeypatch.setattr(wandbrun, "WRITER", "this_module_does_not_matter")
    sleeper = tmp_path / "this_module_does_not_matter.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(TrackingError, match="did not answer within 1 s"):
        wandbrun.write(wandbrun.not_started_plan(TRACKING, "r1"), tmp_path, limit=1)


class FakeWandbTracker:
    def __init__(self) -> None:
        self.ends: list[tuple[str, dict[str, Any], RunRecord]] = []

    def end(self, verdict: str, event: dict[str, Any], record: RunRecord) -> None:
        self.ends.append((verdict, event, record))

    def close(self) -> None:
        pass


def test_the_runs_end_reaches_wandb_with_its_record_and_goodput() -> None:
    """A stop's event carries no goodput (notifications have it for succeeded and failed):
    the trackers get the account from the run's end; a restart writes nothing to W&B."""
    tracker = FakeWandbTracker()
    saved = record(restarts=(Restart(at=1.0, attempt=0, worker="beta", reason="x", step=5),))
    trackers = RunTrackers(None, tracker, lambda: (saved, GOODPUT))  # type: ignore[arg-type]
    restart = saved.restarts[0]
    trackers.event("restarting-0", {"event": "restarting"}, restart)
    assert tracker.ends == []
    trackers.event("stopped", {"event": "stopped", "root_cause": "down"}, None)
    ((verdict, event, given),) = tracker.ends
    assert verdict == "stopped" and event["goodput"] == GOODPUT and given is saved
    assert (
        RunTrackers.of(Tracking(wandb_project="p"), print, Path("."), lambda: (saved, {})) is None
    )
