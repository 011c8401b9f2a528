"""The events a run's notify targets are told of, as data: what each says, which target wants
it, the body each is sent and its signature. Pure (engine/observe/notify.py sends them).

An event is one JSON object: `event` (queued, started, restarting, stalled, preempted,
succeeded, failed, stopped, lease_lost; `test` from `orchestrate notify --test`), `job`,
`run_id`, `state`,
`step`, `target_steps`, `eta_seconds` (engine/observe/eta.py's), `root_cause`, `hint`, `restarts`,
`attempt`, `dashboard` (its address, never its token), `at` (Unix time), `id` (unique, so a
receiver can drop a repeat) and `text` (the same for people: what a Slack message shows).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from orchestrator.engine.observe.status import RunStatus
from orchestrator.model.inventory import NotifyTarget
from orchestrator.model.timetext import duration

TEST_EVENT = "test"
HEADLINES = {
    "queued": "is queued",
    "started": "started",
    "restarting": "is restarting",
    "stalled": "stalled",
    "preempted": "was preempted",
    "succeeded": "succeeded",
    "failed": "failed",
    "stopped": "was stopped",
    "lease_lost": "runs unleased",
    TEST_EVENT: "test notification",
}


def run_event(
    name: str,
    *,
    job: str,
    run_id: str | None,
    status: RunStatus | None,
    at: float,
    event_id: str,
    root_cause: str | None = None,
    hint: str | None = None,
    restarts: int | None = None,
    dashboard: str | None = None,
    goodput: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The event `name` of a run, as its status last said (None: nothing known yet);
    `goodput`: the run's account (engine/observe/goodput.py's to_json) at its end."""
    workers = status.workers if status else ()
    steps = [w.step for w in workers if w.step is not None]
    targets = [w.target_steps for w in workers if w.target_steps]
    event: dict[str, Any] = {
        "event": name,
        "job": job,
        "run_id": run_id,
        "state": status.state.value if status else None,
        "step": min(steps) if steps else None,  # the slowest worker's, as the dashboard's
        "target_steps": targets[0] if targets else None,
        "eta_seconds": status.eta_seconds if status else None,
        "root_cause": root_cause,
        "hint": hint,
        "restarts": restarts if restarts is not None else len(status.restarts) if status else 0,
        "attempt": status.attempt if status else 0,
        "dashboard": dashboard,
        "at": at,
        "id": event_id,
    }
    if goodput is not None:
        event["goodput"] = dict(goodput)
    event["text"] = event_text(event)
    return event


def event_text(event: Mapping[str, Any]) -> str:
    """One paragraph for people: what happened, why, what to do, how far, where to look."""
    name = event["event"]
    run = f" (run {event['run_id']})" if event.get("run_id") else ""
    parts = [f"orchestrate: job {event['job']}{run} {HEADLINES.get(name, name)}"]
    if name == "restarting" and event.get("restarts"):
        parts[0] += f" (restart {event['restarts']})"
    if event.get("root_cause"):
        parts[0] += f": {event['root_cause']}"
    if event.get("hint"):
        parts.append(f"What to do: {event['hint']}")
    progress = []
    if event.get("step") is not None:
        target = f"/{event['target_steps']}" if event.get("target_steps") else ""
        progress.append(f"step {event['step']}{target}")
    if event.get("eta_seconds") is not None:
        progress.append(f"ETA {duration(float(event['eta_seconds']))}")
    if event.get("restarts") and name != "restarting":
        progress.append(f"{event['restarts']} restart(s)")
    share = (event.get("goodput") or {}).get("goodput")
    if isinstance(share, int | float):
        progress.append(f"goodput {share * 100:.0f} %")
    if progress:
        line = ", ".join(progress)
        parts.append(line[0].upper() + line[1:])
    if event.get("dashboard"):
        parts.append(f"Dashboard: {event['dashboard']}")
    return ". ".join(p.rstrip(".") for p in parts) + "."


def wants(target: NotifyTarget, name: str) -> bool:
    """Whether `target` is told of event `name` (a test event goes to every target)."""
    return name == TEST_EVENT or name in target.events


def body(target: NotifyTarget, event: Mapping[str, Any]) -> bytes:
    """What `target` is sent: the event, or Slack's {"text": ...}; a command gets the event."""
    document: Mapping[str, Any] = event
    if target.url is not None and target.format == "slack":
        document = {"text": event["text"]}
    return json.dumps(document, sort_keys=True).encode()


def signature(secret: str, payload: bytes) -> str:
    """The signature header's value: "sha256=" and the HMAC-SHA256 of the body, in hex."""
    return "sha256=" + hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()


def target_label(index: int, target: NotifyTarget) -> str:
    """How logs name a target: a webhook by its scheme, host and port only (a path may hold a
    token, as Slack's do), a command by its program."""
    if target.url is not None:
        parts = urlsplit(target.url)
        return f"notify[{index}] {parts.scheme}://{parts.netloc.rpartition('@')[2]}/..."
    return f"notify[{index}] command {target.command[0] if target.command else '?'}"


def dashboard_address(log_text: str) -> str | None:
    """The address of the dashboard `up --dashboard` started, from its log: its first
    "dashboard: URL" line, without the query or fragment (where its token may be); None when
    there is none, or the log says it stopped since."""
    address = None
    for line in log_text.splitlines():
        if line.startswith("dashboard: http") and address is None:
            parts = urlsplit(line.removeprefix("dashboard: ").split()[0])
            address = urlunsplit(
                (parts.scheme, parts.netloc.rpartition("@")[2], parts.path or "/", "", "")
            )
        elif line.startswith("dashboard stopped"):
            address = None
    return address
