"""The controller's writes into the run's W&B run (job.tracking.wandb, docs/tracking.md).

The run's id is picked at `up` (engine/trackers/tracking.py); the workers' `wandb.init()` make
and resume that run. The controller writes into it twice, never while a worker may write:

- at `up`, before any worker starts: the job's settings as the run's config (engine/trackers/
  base.py's job_config, the names MLflow's params have), its name `JOB-RUNID`; the session then
  ends, so every worker's `wandb.init()` resumes the run;
- at the run's end (the supervisor's, or `down`'s, after the workers ended): its restarts (each
  cause, worker, kind and step), its goodput (the share, the total and each part's seconds),
  its verdict and root cause, as summary keys under MLflow's names; the run then ends with the
  verdict's exit code (EXIT_CODES): W&B shows 0 as finished, any other as failed.

W&B's client is made for a training process (exit hooks, a service process, a finish() that
waits for the upload), so each write is a child process (engine/trackers/wandbwrite.py),
killed with its process group past LIMIT: a W&B that hangs never holds up `up` or the end of
supervision. The child reads W&B's own variables from the controller's environment
(WANDB_API_KEY, WANDB_MODE, WANDB_BASE_URL, WANDB_DIR); its files go to WANDB_DIR, else the
state directory (`.orchestrate/wandb/`). A write that fails is a warning, never a failed run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path
from typing import Any

from orchestrator.engine.trackers.base import (
    NOT_STARTED,
    PARAM_LIMIT,
    TrackingError,
    goodput_values,
    job_config,
)
from orchestrator.engine.trackers.wandbwrite import Plan
from orchestrator.model.inventory import Inventory, Tracking
from orchestrator.model.printable import printable
from orchestrator.model.records import Restart, RunRecord

LIMIT = 60.0  # seconds one write may take (the child's init and finish wait 20 s each)
WRITER = "orchestrator.engine.trackers.wandbwrite"
# How each verdict ends the W&B run. W&B's client can end a run only finished (0) or failed
# (any other code); its "killed" is for runs stopped from W&B itself. A run stopped by `down`
# or preempted did not finish: it ends failed, with the code a stopped process has (130, as
# after Ctrl-C; 75, EX_TEMPFAIL, the code of a preempted worker), and its verdict in the summary.
EXIT_CODES = {"succeeded": 0, "failed": 1, "stopped": 130, "preempted": 75}
# W&B's variables that would name another run than the plan's (a user's shell may set them).
RUN_VARIABLES = ("WANDB_RUN_ID", "WANDB_RESUME", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_NAME")


def where(tracking: Tracking) -> str:
    """The run's project as W&B names it: ENTITY/PROJECT."""
    return "/".join(p for p in (tracking.wandb_entity, tracking.wandb_project) if p)


def start_plan(tracking: Tracking, inventory: Inventory, run_id: str) -> Plan:
    """What `up` writes before the workers start: the job's settings and the run's name."""
    config = job_config(inventory.job, run_id, len(inventory.hosts))
    return _plan(tracking, 0, name=f"{inventory.job.name}-{run_id}", config=config,
                 summary={"orchestrate.run_id": run_id})  # fmt: skip


def not_started_plan(tracking: Tracking, run_id: str) -> Plan:
    """A run whose `up` failed after its settings were written (a check): ended failed."""
    summary = {"orchestrate.run_id": run_id, "orchestrate.verdict": NOT_STARTED}
    return _plan(tracking, 1, summary=summary)


def end_plan(tracking: Tracking, verdict: str, event: Mapping[str, Any], record: RunRecord) -> Plan:
    """What the run's end writes (the module's list), from the end's event (engine/observe/
    events.py's document, its goodput filled in) and the run's record as last saved. The
    restarts number on after those of the earlier runs of a resumed W&B run (restarts_before),
    as MLflow's tags do. Pure."""
    before = tracking.restarts_before
    summary: dict[str, Any] = {
        "orchestrate.run_id": record.run_id,
        "orchestrate.verdict": verdict,
        "orchestrate.restart_count": before + len(record.restarts),
    }
    if event.get("root_cause"):
        summary["orchestrate.root_cause"] = str(event["root_cause"])[:PARAM_LIMIT]
    if record.leases_lost:
        summary["orchestrate.lease_lost"] = record.leases_lost[:PARAM_LIMIT]
    for restart in record.restarts:
        summary.update(restart_keys(f"orchestrate.restart.{before + restart.attempt + 1}",
                                    restart))  # fmt: skip
    for restart in record.alone:
        key = f"orchestrate.restart_alone.{restart.worker}.{restart.at:.0f}"
        summary.update(restart_keys(key, restart))
    summary.update(goodput_values(event.get("goodput") or {}))
    return _plan(tracking, EXIT_CODES[verdict], summary=summary)


def restart_keys(key: str, restart: Restart) -> dict[str, Any]:
    """One restart as summary keys: KEY (the cause as `status` says it), KEY.worker, .kind,
    .step."""
    return {key: restart.describe()[:PARAM_LIMIT], f"{key}.worker": restart.worker,
            f"{key}.kind": str(restart.kind), f"{key}.step": restart.step}  # fmt: skip


def _plan(tracking: Tracking, exit_code: int, **what: Any) -> Plan:
    assert tracking.wandb_run_id is not None and tracking.wandb_project is not None
    return Plan(tracking.wandb_run_id, tracking.wandb_project, tracking.wandb_entity, exit_code,
                **what)  # fmt: skip


def writer_env(state_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the controller's, quiet, its files in WANDB_DIR (absolute: the
    child runs in the state directory) or the state directory."""
    env = {k: v for k, v in environ.items() if k not in RUN_VARIABLES}
    env["WANDB_SILENT"] = "true"
    env["WANDB_DIR"] = str(Path(environ.get("WANDB_DIR") or state_dir).resolve())
    return env


def write(plan: Plan, state_dir: Path, limit: float = LIMIT) -> None:
    """One write (wandbwrite's child, in the state directory); TrackingError saying why not."""
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", WRITER], cwd=state_dir, env=writer_env(state_dir, os.environ),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,  # its own group: W&B's service process goes with it
        )  # fmt: skip
    except OSError as exc:
        raise TrackingError(f"starting W&B's writer: {exc}") from exc
    try:
        out, err = child.communicate(json.dumps(asdict(plan)), timeout=limit)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise TrackingError(f"W&B did not answer within {limit:g} s") from None
    if child.returncode != 0:
        said = [line for line in out.splitlines() if line.startswith("error: ")]
        last = said[-1].removeprefix("error: ") if said else (err.strip().splitlines() or [""])[-1]
        raise TrackingError(last or f"W&B's writer exited {child.returncode}")


class WandbTracker:
    """The end of supervision's write into the run's W&B run, on a thread of its own; said
    (once) when it fails."""

    def __init__(self, tracking: Tracking, state_dir: Path, say: Callable[[str], None]) -> None:
        self.tracking = tracking
        self.state_dir = state_dir
        self.say = say
        self.thread: threading.Thread | None = None

    @classmethod
    def of(
        cls, tracking: Tracking | None, state_dir: Path, say: Callable[[str], None]
    ) -> WandbTracker | None:
        """A tracker for a run that has a W&B run id; None otherwise."""
        if tracking is None or tracking.wandb_project is None or tracking.wandb_run_id is None:
            return None
        return cls(tracking, state_dir, say)

    def end(self, verdict: str, event: Mapping[str, Any], record: RunRecord) -> None:
        plan = end_plan(self.tracking, verdict, event, record)
        self.thread = threading.Thread(target=self._write, args=(plan,), name="wandb",
                                       daemon=True)  # fmt: skip
        self.thread.start()

    def _write(self, plan: Plan) -> None:
        try:
            write(plan, self.state_dir)
        except TrackingError as exc:
            self.say(f"W&B run {plan.id}: {printable(str(exc))} (the run's end was not "
                     "written)")  # fmt: skip

    def close(self) -> None:
        """Wait for the end's write: the child's own limit bounds it."""
        if self.thread is not None:
            self.thread.join(LIMIT + 10)
