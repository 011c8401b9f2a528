"""`job.tracking`: the experiment tracker a run logs into (engine/trackers/tracking.py makes its one
run there, docs/tracking.md). Pure: nothing of MLflow or W&B is imported to read it.

`{mlflow: URI, experiment: NAME}` names an MLflow tracking server, `{wandb: {project: P,
entity: E}}` a Weights & Biases project; both may be set. Credentials never appear here: they
are the trackers' own variables (MLFLOW_TRACKING_TOKEN, WANDB_API_KEY), listed in
job.secret_env.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from orchestrator.config.report import Report, line_of
from orchestrator.contract import TRACKING_ENV, TRACKING_SECRET_ENV
from orchestrator.model.inventory import Tracking
from orchestrator.values import Checked, Checker, Key, checkers, describe, string
from orchestrator.yamlsource import LineList, LineMap


def _mlflow_uri(value: Any) -> Checked:
    text, problem = string(value)
    if problem:
        return None, problem
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as exc:
        return None, f"not a URL ({exc}): {text!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, (
            f"expected the tracking server's http:// or https:// URL (every worker logs to it), "
            f"got {describe(text)}"
        )
    if parts.username is not None or parts.password is not None:
        return None, (
            "a user or password in the URL would be written into the run record and every "
            "worker's environment; list MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
            "(or MLFLOW_TRACKING_TOKEN) in job.secret_env instead"
        )
    return text.rstrip("/"), None


TRACKING_KEY_ENTRIES: tuple[Key, ...] = (
    Key("mlflow", "string (an `http://` or `https://` URL)", "",
        "an MLflow tracking server: `up` makes one MLflow run per run there, and every worker of "
        "every attempt gets `MLFLOW_TRACKING_URI`, `MLFLOW_RUN_ID` and `MLFLOW_EXPERIMENT_ID`",
        _mlflow_uri),
    Key("experiment", "string", "the job's name", "the MLflow experiment (made if missing)",
        string),
    Key("wandb", "mapping: `project` (required), `entity`", "",
        "a Weights & Biases project: every worker gets `WANDB_RUN_ID` (one per run), "
        "`WANDB_RESUME=allow`, `WANDB_PROJECT` and `WANDB_ENTITY`"),
)  # fmt: skip
TRACKING_KEYS = checkers(TRACKING_KEY_ENTRIES)
WANDB_KEYS: dict[str, Checker] = {"project": string, "entity": string}


def parse_tracking(block: LineMap, report: Report) -> Tracking | None:
    """`job.tracking` (present in `block`, the job's mapping) as settings; every problem said."""
    raw = block["tracking"]
    where = "job.tracking"
    if not isinstance(raw, LineMap):
        report.add(line_of(block, "tracking"), where,
                   f"expected a mapping such as {{mlflow: URL, experiment: NAME}} or "
                   f"{{wandb: {{project: NAME}}}}, got {describe(raw)}")  # fmt: skip
        return None
    before = len(report.problems)
    report.unknown_keys(raw, tuple(k.name for k in TRACKING_KEY_ENTRIES), where)
    values = report.checked(raw, TRACKING_KEYS, where)
    if "mlflow" not in raw and "wandb" not in raw:
        report.add(raw.line, where, "names no tracker: set mlflow: URL or wandb: {project: NAME}")
    if "experiment" in raw and "mlflow" not in raw:
        report.add(line_of(raw, "experiment"), f"{where}.experiment", "applies to mlflow: only")
    wandb = _wandb(raw, report) if "wandb" in raw else {}
    if len(report.problems) > before:
        return None
    return Tracking(
        mlflow=values.get("mlflow"),
        experiment=values.get("experiment"),
        wandb_project=wandb.get("project"),
        wandb_entity=wandb.get("entity"),
    )


def _wandb(raw: LineMap, report: Report) -> dict[str, str]:
    where = "job.tracking.wandb"
    block = raw["wandb"]
    if not isinstance(block, LineMap):
        report.add(line_of(raw, "wandb"), where,
                   f"expected a mapping {{project: NAME, entity: TEAM}}, "
                   f"got {describe(block)}")  # fmt: skip
        return {}
    report.unknown_keys(block, tuple(WANDB_KEYS), where)
    values = report.checked(block, WANDB_KEYS, where)
    if "project" not in block:
        report.add(block.line, f"{where}.project", "missing; the W&B project the run logs into")
    return values


def tracking_env_problems(block: LineMap, report: Report) -> None:
    """With job.tracking: job.env may not set what orchestrate sets from it (the run's
    identity, the project), nor hold a tracker's credential (job.secret_env does)."""
    env = block.get("env")
    if isinstance(env, LineMap):
        for key in env:
            where = f"job.env.{key}"
            if key in TRACKING_ENV:
                report.add(line_of(env, key), where, "is set by orchestrate from job.tracking")
            elif key in TRACKING_SECRET_ENV:
                report.add(line_of(env, key), where,
                           "a tracker's credential must not be written in the inventory: list "
                           "its name in job.secret_env (its value is taken from the "
                           "environment of 'orchestrate up')")  # fmt: skip
    secrets = block.get("secret_env")
    if isinstance(secrets, LineList):
        for index, item in enumerate(secrets):
            if item in TRACKING_ENV:
                report.add(secrets.item_lines[index], f"job.secret_env[{index}]",
                           "is set by orchestrate from job.tracking")  # fmt: skip
