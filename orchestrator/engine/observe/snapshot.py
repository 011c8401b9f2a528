"""The supervisor's status snapshot: written into the state directory at each poll, so a
dashboard next to a running supervisor serves it instead of probing every host again."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass

from orchestrator.boundedread import RECORD_CAP, read_text
from orchestrator.engine.observe.status import RunStatus
from orchestrator.engine.store.runstore import RunStore


@dataclass(frozen=True)
class Snapshot:
    """A run's status as its supervisor last wrote it, with when and by which process."""

    written_at: float  # time.time() of the write; 0.0 when the file does not say
    pid: int | None  # the supervisor that wrote it
    status: RunStatus


def write_snapshot(store: RunStore, status: RunStatus) -> None:
    document = {"written_at": time.time(), "pid": os.getpid(), "status": status.to_json()}
    # A full disk must not end supervision: the dashboard then polls the hosts itself.
    with contextlib.suppress(OSError):
        store.write_file(store.snapshot_path(status.run_id), json.dumps(document))


def read_snapshot(store: RunStore, run_id: str) -> Snapshot | None:
    """The latest snapshot of the run (None when there is none, it is being replaced, or it
    holds no status RunStatus.from_json can read)."""
    try:
        document = json.loads(read_text(store.snapshot_path(run_id), RECORD_CAP))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    status = RunStatus.from_json(document.get("status"))
    if status is None:
        return None
    written_at, pid = document.get("written_at"), document.get("pid")
    return Snapshot(
        written_at=_seconds(written_at),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        status=status,
    )


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
