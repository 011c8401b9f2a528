"""The documents behind the dashboard page, built from what status, the run record, the
worker's progress history and the state directory say. Pure: no hosts, no web framework."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.contract import HISTORY_FILE
from orchestrator.dashboard.charts import Marker, Series, line_chart, stacked_bar
from orchestrator.dashboard.curves import SMOOTHING, log10, smoothed
from orchestrator.engine.observe.goodput import LABELS, PARTS, run_account, summary
from orchestrator.engine.observe.rolepolicy import labelled
from orchestrator.engine.observe.snapshot import Snapshot
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.engine.supervision.policy import first_failure
from orchestrator.model.reading import number as finite_number
from orchestrator.model.records import RunRecord, restarted_alone
from orchestrator.model.vocabulary import WorkerState

__all__ = ["HISTORY_FILE"]  # watch.py reads the worker's history file by this name
LOG_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red")  # the order `tail` uses


def worker_view(worker: WorkerStatus) -> dict[str, Any]:
    """A worker of `status --json` plus what the page derives: progress fraction and ETA."""
    step, target = worker.step, worker.target_steps
    fraction = min(1.0, step / target) if step is not None and target else None
    return {
        **worker.to_json(),
        "progress": fraction,
        "eta_seconds": worker.eta_seconds,  # engine/observe/eta.py: the one estimate
    }


def log_prefix(name: str, width: int) -> str:
    """The prefix `orchestrate tail` puts before each line."""
    return f"{name:<{width}} |"


def root_cause(record: RunRecord, status: RunStatus) -> str | None:
    """The page's "root cause": one line saying why the run failed, or None.

    The supervisor's verdict when it gave up (the record's `outcome`, shown whatever the state);
    else, while the run's state is failed, the supervisor's own choice of the failed worker
    (policy.first_failure: a cause before the peers that aborted because of it, then the
    earliest `finished_at`), as "name at step N: reason"."""
    if record.outcome:
        return record.outcome
    failure = first_failure(status) if status.state is WorkerState.FAILED else None
    if failure is None:
        return None
    role = next(w.role for w in status.workers if w.name == failure.worker)
    where = f" at step {failure.step}" if failure.step is not None else ""
    return f"{labelled(failure.worker, role)}{where}: {failure.reason}"


def timeline(
    record: RunRecord, stacks: Mapping[int, Sequence[str]] | None = None
) -> list[dict[str, Any]]:
    """Each restart, with the workers whose stacks were kept at its stall (`stacks`: by the
    attempt that stalled, engine.supervision.hangs.kept's names)."""
    kept = stacks or {}
    restarts = [
        {**restart.__dict__, "number": number, "text": restart.describe(),
         "stacks": list(kept.get(restart.attempt, ()))}
        for number, restart in enumerate(record.restarts, start=1)
    ]  # fmt: skip
    return sorted([*restarts, *alone_entries(record)], key=lambda entry: entry["at"])


def alone_entries(record: RunRecord) -> list[dict[str, Any]]:
    """Each worker restarted by itself while the chief went on (ParameterServerStrategy), as
    "worker w1 restarted (2 of 6), the chief continued: w1 at step 40: killed by SIGKILL"."""
    budget = record.inventory.job.max_worker_restarts
    counts: dict[str, int] = {}
    entries = []
    for restart in record.alone:
        counts[restart.worker] = counts.get(restart.worker, 0) + 1
        line = restarted_alone(restart.worker, counts[restart.worker], budget)
        entries.append({**restart.__dict__, "alone": True, "stacks": [],
                        "text": f"{line}: {restart.describe()}"})  # fmt: skip
    return entries


def parse_history(text: str) -> list[dict[str, Any]]:
    """Lines of progress-history.jsonl; a line being appended (half written) is skipped, and so
    is one without a finite step (model/reading's: a 400-digit one is none). A metric may be NaN
    or infinite (json reads NaN, Infinity): the chart draws a gap there."""
    points = []
    for line in text.splitlines():
        try:
            point = json.loads(line)
        except ValueError:
            continue
        if isinstance(point, dict) and finite_number(point.get("step")) is not None:
            points.append(point)
    return points


def curve(history: Mapping[int, Sequence[Mapping[str, Any]]], key: str) -> list[Series]:
    return [
        Series(
            attempt,
            tuple(
                (float(p["step"]), _value(p[key]))
                for p in points
                if isinstance(p.get(key), int | float)
            ),
        )
        for attempt, points in sorted(history.items())
    ]


def _value(value: float) -> float:
    """A metric as the chart reads it: one that is not a finite float (an integer of 400
    digits) is a gap, as NaN is."""
    found = finite_number(value)
    return math.nan if found is None else found


def charts(record: RunRecord, history: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, str]:
    """The loss, steps/s, val_loss and val_accuracy charts of the chief across attempts (the
    evaluations are lines of their own in the history), restarts marked at their step (the step
    the next attempt resumed from when the failure happened before any step)."""
    markers = []
    for number, restart in enumerate(record.restarts, start=1):
        resumed = history.get(restart.attempt + 1) or ()
        step = restart.step
        if step is None and resumed:
            step = resumed[0]["step"]
        if step is not None:
            markers.append(Marker(float(step), f"restart {number}"))
    waiting = "waiting for the first logged step"
    no_eval = "no evaluation yet (a task's eval_dataset, or report(val_loss=...))"
    loss = curve(history, "loss")
    return {
        "loss": line_chart("loss", loss, markers, waiting),
        "loss_smoothed": line_chart(
            f"loss, smoothed ({SMOOTHING} EMA)", smoothed(loss), markers, waiting
        ),
        "loss_log": line_chart("log10(loss)", log10(loss), markers, waiting),
        "steps_per_sec": line_chart("steps/s", curve(history, "steps_per_sec"), markers, waiting),
        "val_loss": line_chart("val_loss", curve(history, "val_loss"), markers, no_eval),
        "val_accuracy": line_chart(
            "val_accuracy", curve(history, "val_accuracy"), markers, no_eval
        ),
    }


# A check of the run's own inventory at most this long before the run began is its check (the
# one `up` itself ran is seconds before); any other is another inventory's, or stale.
PREFLIGHT_WINDOW = 600.0


def run_preflight(document: Any, record: RunRecord) -> dict[str, Any] | None:
    """The recorded preflight findings when they are this run's: of its inventory, checked in
    the PREFLIGHT_WINDOW before it began; None otherwise (the panel then says none)."""
    if not isinstance(document, dict) or document.get("inventory") != record.inventory.path:
        return None
    checked = document.get("checked_at")
    if not isinstance(checked, int | float):
        return None
    return document if 0 <= record.created_at - checked <= PREFLIGHT_WINDOW else None


def goodput(record: RunRecord, status: RunStatus | None, now: float) -> dict[str, Any]:
    """The run's goodput (engine/observe/goodput.py): the account, its one line and its stacked
    bar."""
    account = run_account(record, status, now)
    cluster = account.cluster
    parts = [(name, LABELS[name], cluster.part(name)) for name in PARTS]
    return {
        **account.to_json(),
        "line": summary(account),
        "bar": stacked_bar(
            "goodput: where the machines' time went", parts, "no time to account yet"
        ),
    }


def unreadable_summary(run_id: str, why: str, current: str | None) -> dict[str, Any]:
    """The earlier-runs line of a run whose record cannot be read: named, with why."""
    return {
        "run_id": run_id,
        "job": None,
        "created_at": None,
        "workers": None,
        "restarts": None,
        "state": None,
        "outcome": None,
        "goodput": None,
        "current": run_id == current,
        "unreadable": why,
    }


def run_summary(
    record: RunRecord, snapshot: Snapshot | None, current: str | None
) -> dict[str, Any]:
    """One line of the earlier-runs list: its outcome as last recorded (the state as its last
    snapshot says; None without one)."""
    return {
        "run_id": record.run_id,
        "job": record.job_name,
        "created_at": record.created_at,
        "workers": len(record.workers),
        "restarts": len(record.restarts),
        "state": snapshot.status.state.value if snapshot else None,
        "outcome": record.outcome,
        # As of its last snapshot (a run that ended: its record's closed attempts).
        "goodput": run_account(
            record,
            snapshot.status if snapshot else None,
            snapshot.written_at if snapshot else record.created_at,
        ).cluster.goodput,
        "current": record.run_id == current,
    }
