"""One run in the experiment trackers per orchestrate run, whatever its restarts (job.tracking,
docs/tracking.md).

At `up` (`open_tracking`) the controller makes the run's MLflow run (its experiment too, if
missing) and picks its W&B run id; both go into the inventory's `job.tracking`, which the run
record keeps, so every attempt's workers (engine/workers/launch.py's `tracking_env`) and every later
supervisor of the run join that one run. The supervisor's events (engine/observe/notify.py's
`RunEvents`, the one place a run's events are made) reach a `Tracker`, which logs the restarts
and, at the end, the goodput and the verdict, and ends the MLflow run FINISHED, FAILED or
KILLED. Into the W&B run (engine/trackers/wandbrun.py) the controller writes the job's
settings at `up`, before the workers' `wandb.init()` join it, and at the end, once the workers
ended, the restarts, the goodput and the verdict (`RunTrackers` hands it the run's end).

MLflow is reached through its client library (mlflow-skinny's MlflowClient), imported only
when a job names an MLflow server; W&B through its own (wandb), in a child process, only when a
job names a W&B project. A tracker that cannot be reached is a warning (`check`, `up`, the
supervisor's log), never a failed training.
"""

from __future__ import annotations

import os
import queue
import secrets
import string
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator import contract
from orchestrator.engine.trackers import wandbrun
from orchestrator.engine.trackers.base import (
    ENDS,
    NOT_STARTED,
    PARAM_LIMIT,
    TrackingError,
    goodput_values,
    job_params,
)
from orchestrator.engine.trackers.trackresume import Resumed
from orchestrator.model.findings import Finding, Status
from orchestrator.model.inventory import Inventory, Tracking
from orchestrator.model.printable import printable
from orchestrator.model.records import Restart, RunRecord

# The controller's calls to MLflow give up soon (MLflow's own default retries for about two
# minutes): a tracker down must not hold up `up` or the supervisor; and the controller says the
# run's link itself. Set them to change it (a local worker inherits them too).
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                   "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}  # fmt: skip
CLOSE_LIMIT = 30.0  # the most seconds the end of supervision waits for the tracker's writes
TAG_LIMIT = 5000  # characters of a tag's value (MLflow's oldest servers' limit)
# How a run's events end the MLflow run (engine/observe/events.py's names).
END_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED",
              "preempted": "KILLED"}  # fmt: skip


def mlflow_client(uri: str) -> Any:
    """MLflow's client for `uri`; TrackingError when mlflow-skinny is not installed."""
    for name, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise TrackingError(
            f"job.tracking.mlflow needs MLflow's client on this machine ({exc}): "
            f"{contract.install_hint('mlflow')}"
        ) from exc
    return MlflowClient(tracking_uri=uri)


def _call(what: str, action: Callable[[], Any]) -> Any:
    """`action`, its failure (whatever MLflow or the network raised) as a TrackingError."""
    try:
        return action()
    except TrackingError:
        raise
    except Exception as exc:  # a tracker's failure never fails the run
        first = str(exc).strip().splitlines()
        raise TrackingError(f"{what}: {type(exc).__name__}: {first[0] if first else ''}") from exc


def wandb_run_id() -> str:
    """A W&B run id as wandb makes them: 8 lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def run_link(tracking: Tracking) -> str | None:
    """The MLflow run's page on its server."""
    if tracking.mlflow is None or tracking.mlflow_run_id is None:
        return None
    return (f"{tracking.mlflow}/#/experiments/{tracking.mlflow_experiment_id}/runs/"
            f"{tracking.mlflow_run_id}")  # fmt: skip


def tracking_lines(tracking: Tracking | None) -> list[str]:
    """What `status` says of the run's trackers."""
    if tracking is None:
        return []
    lines = []
    if tracking.mlflow is not None:
        if tracking.mlflow_run_id is None:
            lines.append(f"tracking: no MLflow run ({tracking.mlflow} was not reached at 'up')")
        else:
            lines.append(f"tracking: MLflow run {tracking.mlflow_run_id}  {run_link(tracking)}")
    if tracking.wandb_run_id is not None:
        where = "/".join(p for p in (tracking.wandb_entity, tracking.wandb_project) if p)
        lines.append(f"tracking: W&B run {tracking.wandb_run_id} in {where}")
    return lines


def tracking_json(tracking: Tracking | None) -> dict[str, Any] | None:
    if tracking is None:
        return None
    return {**asdict(tracking), "mlflow_link": run_link(tracking)}


class Opened(NamedTuple):
    """The run's identity in its trackers as `up` opened them (open_tracking)."""

    inventory: Inventory  # with the identity in job.tracking
    before: str | None  # a resumed MLflow run's status before this `up` set it RUNNING
    wandb_written: bool  # whether this `up` wrote the W&B run's settings (a new W&B run)


def open_tracking(
    inventory: Inventory,
    run_id: str,
    say: Callable[[str], None],
    resumed: Resumed | None = None,
    state_dir: Path = Path("."),
) -> Opened:
    """The inventory with the run's identity in its trackers (job.tracking): a W&B run id, the
    W&B run made now with the job's settings as its config, and an MLflow run made now with
    them as params; or, for an `up` that resumes an earlier run's checkpoint (`resumed`,
    engine/trackers/trackresume.py), that run's identity, its MLflow run RUNNING again (its
    status before is returned beside). A tracker that cannot be reached is said and left out;
    the run trains without it. `state_dir`: where W&B's files go without WANDB_DIR."""
    tracking = inventory.job.tracking
    if tracking is None:
        return Opened(inventory, None, False)
    before = None
    if resumed is not None:
        tracking, before = _resume(resumed, run_id, say)
    written = False
    if tracking.wandb_project is not None and tracking.wandb_run_id is None:
        tracking = replace(tracking, wandb_run_id=wandb_run_id())
        written = _wandb_start(tracking, inventory, run_id, say, state_dir)
    if tracking.mlflow is not None and tracking.mlflow_run_id is None:
        try:
            tracking = _mlflow_run(tracking, inventory, run_id)
            say(f"tracking: MLflow run {tracking.mlflow_run_id} ({run_link(tracking)})")
        except TrackingError as exc:
            say(f"warning: tracking: no MLflow run for this run: {printable(str(exc))}; the "
                "workers get the experiment's name only, and training goes on")  # fmt: skip
    return Opened(replace(inventory, job=replace(inventory.job, tracking=tracking)), before,
                  written)  # fmt: skip


def _wandb_start(
    tracking: Tracking, inventory: Inventory, run_id: str, say: Callable[[str], None],
    state_dir: Path,
) -> bool:  # fmt: skip
    """The new W&B run with the job's settings (engine/trackers/wandbrun.py); whether written."""
    try:
        wandbrun.write(wandbrun.start_plan(tracking, inventory, run_id), state_dir)
    except TrackingError as exc:
        say(f"warning: tracking: W&B run {tracking.wandb_run_id} in {wandbrun.where(tracking)}: "
            f"the job's settings were not written: {printable(str(exc))}; the workers' "
            "wandb.init() still joins it, and training goes on")  # fmt: skip
        return False
    say(f"tracking: W&B run {tracking.wandb_run_id} in {wandbrun.where(tracking)}")
    return True


def _resume(
    resumed: Resumed, run_id: str, say: Callable[[str], None]
) -> tuple[Tracking, str | None]:
    """The earlier run's identity, its MLflow run set RUNNING again and tagged with this run
    (and its status before); without its MLflow run when that is gone or cannot be reached (a
    new one is then made)."""
    tracking = resumed.tracking
    whence = f"run {resumed.run_id}, whose checkpoint {resumed.checkpoint} this run resumes"
    if tracking.wandb_run_id is not None:
        say(f"tracking: W&B run {tracking.wandb_run_id} resumed ({whence})")
    if tracking.mlflow is None or tracking.mlflow_run_id is None:
        return tracking, None
    try:
        before = _reopen(tracking.mlflow, tracking.mlflow_run_id, run_id)
    except TrackingError as exc:
        say(f"warning: tracking: MLflow run {tracking.mlflow_run_id} of {whence} not "
            f"resumed: {printable(str(exc))}; making a new one")  # fmt: skip
        return replace(tracking, mlflow_run_id=None, mlflow_experiment_id=None), None
    say(f"tracking: MLflow run {tracking.mlflow_run_id} resumed ({whence}): {run_link(tracking)}")
    return tracking, before


def _reopen(uri: str, mlflow_id: str, run_id: str) -> str:
    """MLflow run `mlflow_id` RUNNING again, `run_id` named in its tags (orchestrate.run_id:
    the latest run; orchestrate.run_ids: every run that logged into it); its status before.
    Its params stay the first run's: MLflow refuses a param's change."""
    client = mlflow_client(uri)
    run = _call("reading the run", lambda: client.get_run(mlflow_id))
    if run.info.lifecycle_stage != "active":
        raise TrackingError(f"the run is {run.info.lifecycle_stage}")
    tags = run.data.tags
    runs = f"{tags.get('orchestrate.run_ids') or tags.get('orchestrate.run_id', '')} {run_id}"
    _call("resuming the run", lambda: client.update_run(mlflow_id, status="RUNNING"))

    def tag() -> None:
        from mlflow.entities import RunTag

        latest = {"orchestrate.run_id": run_id, "orchestrate.run_ids": runs.strip()[-TAG_LIMIT:]}
        client.log_batch(mlflow_id, tags=[RunTag(k, v) for k, v in latest.items()])

    _call("tagging the run", tag)
    return str(run.info.status)


@contextmanager
def held_tracking(
    inventory: Inventory,
    run_id: str,
    say: Callable[[str], None],
    resumed: Resumed | None = None,
    state_dir: Path = Path("."),
) -> Iterator[Inventory]:
    """`up`: the run's identity in its trackers (open_tracking) from before its standbys (their
    environment is the workers') through its launch. When the run then does not start (a failed
    check), an MLflow run made for it is ended KILLED, tagged so, and a resumed one ends as it
    was (FAILED, KILLED: its verdict stays the earlier run's); a W&B run made for it ends failed,
    its verdict `not started` (a resumed one keeps the earlier run's end)."""
    opened = open_tracking(inventory, run_id, say, resumed, state_dir)
    try:
        yield opened.inventory
    except BaseException:
        tracking = opened.inventory.job.tracking
        if tracking is not None and tracking.mlflow and tracking.mlflow_run_id:
            with suppress(TrackingError):
                _not_started(tracking.mlflow, tracking.mlflow_run_id, opened.before)
        if tracking is not None and opened.wandb_written:
            with suppress(TrackingError):
                wandbrun.write(wandbrun.not_started_plan(tracking, run_id), state_dir)
        raise


def _not_started(uri: str, run: str, before: str | None) -> None:
    client = mlflow_client(uri)
    if before is None:
        _call("ending the run", lambda: client.set_tag(run, "orchestrate.verdict", NOT_STARTED))
    status = before or "KILLED"
    if status in END_STATUS.values():  # one found RUNNING is left so
        _call("ending the run", lambda: client.set_terminated(run, status=status))


def _mlflow_run(tracking: Tracking, inventory: Inventory, run_id: str) -> Tracking:
    assert tracking.mlflow is not None
    client = mlflow_client(tracking.mlflow)
    name = tracking.experiment or inventory.job.name
    experiment = _call("finding the experiment", lambda: client.get_experiment_by_name(name))
    if experiment is not None:
        experiment_id = experiment.experiment_id
    else:
        experiment_id = _call("making the experiment", lambda: client.create_experiment(name))
    tags = {"orchestrate.run_id": run_id, "orchestrate.job": inventory.job.name}
    run = _call("making the run", lambda: client.create_run(
        experiment_id, run_name=f"{inventory.job.name}-{run_id}", tags=tags))  # fmt: skip
    mlflow_id = run.info.run_id
    params = job_params(inventory.job, run_id, len(inventory.hosts))

    def log_params() -> None:
        from mlflow.entities import Param

        client.log_batch(mlflow_id, params=[Param(k, v) for k, v in params.items()])

    _call("logging the job's settings", log_params)
    return replace(tracking, mlflow_run_id=mlflow_id, mlflow_experiment_id=str(experiment_id))


def tracking_findings(inventory: Inventory) -> tuple[Finding, ...]:
    """`check` and `up`: whether this machine reaches the MLflow server (a warning if not)."""
    tracking = inventory.job.tracking
    if tracking is None or tracking.mlflow is None:
        return ()
    uri = tracking.mlflow
    try:
        client = mlflow_client(uri)
        _call("asking for the experiments",
              lambda: client.search_experiments(max_results=1))  # fmt: skip
    except TrackingError as exc:
        return (Finding("controller", "tracking", Status.WARN,
                        f"MLflow at {uri}: {printable(str(exc))}",
                        "the run trains anyway, without its MLflow run; start the server or "
                        "fix job.tracking.mlflow"),)  # fmt: skip
    return (Finding("controller", "tracking", Status.OK, f"MLflow at {uri} answers"),)


class Tracker:
    """The supervisor's writes into the run's MLflow run, in order, on a thread of their own
    (a slow tracker delays no poll); a failed write is said once and the rest still tried."""

    def __init__(self, tracking: Tracking, say: Callable[[str], None]) -> None:
        assert tracking.mlflow is not None and tracking.mlflow_run_id is not None
        self.uri = tracking.mlflow
        self.run_id = tracking.mlflow_run_id
        self.before = tracking.restarts_before  # the earlier runs' restarts (a resumed run)
        self.say = say
        self.said = False
        self.jobs: queue.Queue[Callable[[Any], None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="tracking", daemon=True)
        self.thread.start()

    @classmethod
    def of(cls, tracking: Tracking | None, say: Callable[[str], None]) -> Tracker | None:
        """A tracker for a run that has an MLflow run; None otherwise."""
        if tracking is None or tracking.mlflow is None or tracking.mlflow_run_id is None:
            return None
        return cls(tracking, say)

    def event(self, key: str, event: Mapping[str, Any], restart: Restart | None) -> None:
        """One of the run's events (engine/observe/events.py's document, claimed once per run as
        `key` by RunEvents): a restart is logged, an end ends the run; the others change nothing."""
        name = event["event"]
        if restart is not None:
            self._restart(restart, alone=key.startswith("alone-"))
        elif name in END_STATUS:
            self._end(name, event)
        elif name == "lease_lost":
            lost = str(event.get("root_cause"))[:PARAM_LIMIT]
            self.jobs.put(lambda c: c.set_tag(self.run_id, "orchestrate.lease_lost", lost))

    def _restart(self, restart: Restart, *, alone: bool) -> None:
        """A restart of the cluster (the Nth: tag orchestrate.restart.N, metric
        orchestrate.restarts = N at the failed step), or of one worker by itself."""
        key = (f"orchestrate.restart_alone.{restart.worker}.{restart.at:.0f}" if alone
               else f"orchestrate.restart.{self.before + restart.attempt + 1}")  # fmt: skip
        tags = {key: restart.describe()[:PARAM_LIMIT], f"{key}.worker": restart.worker,
                f"{key}.kind": restart.kind,
                f"{key}.step": "" if restart.step is None else str(restart.step)}  # fmt: skip
        count = self.before + restart.attempt + 1
        step = restart.step or 0
        at = int(restart.at * 1000)

        def log(client: Any) -> None:
            from mlflow.entities import Metric, RunTag

            metrics = [] if alone else [Metric("orchestrate.restarts", float(count), at, step)]
            client.log_batch(self.run_id, metrics=metrics,
                             tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip

        self.jobs.put(log)

    def _end(self, name: str, event: Mapping[str, Any]) -> None:
        step = event.get("step") or 0
        now = int(time.time() * 1000)
        values = goodput_values(event.get("goodput") or {})
        restarts = self.before + (event.get("restarts") or 0)
        tags = {"orchestrate.verdict": name, "orchestrate.restart_count": str(restarts)}
        if event.get("root_cause"):
            tags["orchestrate.root_cause"] = str(event["root_cause"])[:PARAM_LIMIT]

        def log(client: Any) -> None:
            from mlflow.entities import Metric, RunTag

            metrics = [Metric(k, v, now, step) for k, v in values.items()]
            client.log_batch(self.run_id, metrics=metrics,
                             tags=[RunTag(k, v) for k, v in tags.items()])  # fmt: skip
            client.set_terminated(self.run_id, status=END_STATUS[name])

        self.jobs.put(log)

    def close(self, limit: float = CLOSE_LIMIT) -> None:
        """Wait (a bounded time) for the writes still queued."""
        self.jobs.put(None)
        self.thread.join(limit)
        if self.thread.is_alive():
            self.say(f"writes to {self.uri} still pending when orchestrate stopped "
                     "waiting")  # fmt: skip

    def _loop(self) -> None:
        client = None
        while (job := self.jobs.get()) is not None:
            try:
                client = client or mlflow_client(self.uri)
                _call("writing to the MLflow run", lambda c=client, j=job: j(c))  # type: ignore[misc]
            except TrackingError as exc:
                if not self.said:
                    self.said = True
                    self.say(f"{printable(str(exc))} (the run goes on; what was not "
                             "written is lost)")  # fmt: skip


class RunTrackers:
    """The run's events (engine/observe/notify.py's RunEvents) for each of its trackers: every
    event to the MLflow run's `Tracker`; the end to the W&B run's, with the run's record as last
    saved (its restarts) and, for each tracker, its goodput (the events of a stop and of a
    preemption carry none: `ending` gives it)."""

    def __init__(
        self,
        mlflow: Tracker | None,
        wandb: wandbrun.WandbTracker | None,
        ending: Callable[[], tuple[RunRecord, Mapping[str, Any]]],
    ) -> None:
        self.mlflow = mlflow
        self.wandb = wandb
        self.ending = ending

    @classmethod
    def of(
        cls,
        tracking: Tracking | None,
        say: Callable[[str], None],
        state_dir: Path,
        ending: Callable[[], tuple[RunRecord, Mapping[str, Any]]],
    ) -> RunTrackers | None:
        """The trackers of a run that has a tracking run; None otherwise."""
        mlflow = Tracker.of(tracking, say)
        wandb = wandbrun.WandbTracker.of(tracking, state_dir, say)
        return cls(mlflow, wandb, ending) if mlflow or wandb else None

    def event(self, key: str, event: Mapping[str, Any], restart: Restart | None) -> None:
        name = event["event"]
        if restart is None and name in ENDS:
            record, account = self.ending()
            event = {**event, "goodput": event.get("goodput") or account}
            if self.wandb is not None:
                self.wandb.end(name, event, record)
        if self.mlflow is not None:
            self.mlflow.event(key, event, restart)

    def close(self) -> None:
        """Wait (bounded) for the writes still under way (each tracker's run on their own)."""
        for tracker in (self.mlflow, self.wandb):
            if tracker is not None:
                tracker.close()
