"""What the run's trackers share (job.tracking, docs/tracking.md): their one error, the job's
settings as each writes them (MLflow's params, W&B's config), and what a run's end is in each.

MLflow (engine/trackers/tracking.py) and W&B (engine/trackers/wandbrun.py) get the same
settings under the same names, so a run reads alike in both."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any

from orchestrator import __version__
from orchestrator.model.inventory import Job

PARAM_LIMIT = 500  # characters of a param's value (MLflow's oldest servers' limit)
# Job settings not written: the environment may hold values (the secrets are names only, but
# job.env is the user's), tracking is where they go.
UNLOGGED = ("env", "secret_env", "tracking")
# A run's events that end it (engine/observe/events.py's names).
ENDS = ("succeeded", "failed", "stopped", "preempted")
# The verdict a tracker's run gets when its `up` failed before the workers started (a check).
NOT_STARTED = "not started"


class TrackingError(Exception):
    """A tracker could not be reached or refused a call; the message says why."""


def _settings(job: Job, run_id: str, workers: int) -> Iterator[tuple[str, Any]]:
    """The job's settings as (name, value), the values as the inventory has them."""
    yield from (("orchestrate.run_id", run_id), ("orchestrate.version", __version__),
                ("workers", workers))  # fmt: skip
    for key, value in asdict(job).items():
        if key in UNLOGGED or value is None or value in ((), []):
            continue
        yield f"job.{key}", list(value) if isinstance(value, list | tuple) else value


def goodput_values(goodput: Mapping[str, Any]) -> dict[str, float]:
    """The run's account at its end (engine/observe/goodput.py's to_json) as numbers:
    orchestrate.goodput (the share), orchestrate.goodput.total_seconds and one
    orchestrate.goodput.PART_seconds per part; a share not measured is left out."""
    values = {"orchestrate.goodput": goodput.get("goodput"),
              "orchestrate.goodput.total_seconds": goodput.get("total_seconds"),
              **{f"orchestrate.goodput.{part}_seconds": seconds
                 for part, seconds in (goodput.get("seconds") or {}).items()}}  # fmt: skip
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float)}


def job_params(job: Job, run_id: str, workers: int) -> dict[str, str]:
    """The job's settings as MLflow params (values as text, cut to PARAM_LIMIT)."""
    params = {}
    for name, value in _settings(job, run_id, workers):
        text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
        params[name] = text[:PARAM_LIMIT]
    return params


def job_config(job: Job, run_id: str, workers: int) -> dict[str, Any]:
    """The same settings as a W&B run's config: the values as JSON has them (W&B filters and
    sorts runs by number), under MLflow's names."""
    return dict(_settings(job, run_id, workers))
