"""The supervisor's status snapshot: written into the state directory at each poll, so a
dashboard next to a running supervisor serves it instead of probing every host again."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from orchestrator.engine.runstore import RunStore
from orchestrator.engine.status import RunStatus


def write_snapshot(store: RunStore, status: RunStatus) -> None:
    document = {"written_at": time.time(), "pid": os.getpid(), "status": status.to_json()}
    # A full disk must not end supervision: the dashboard then polls the hosts itself.
    with contextlib.suppress(OSError):
        store.write_file(store.snapshot_path(status.run_id), json.dumps(document))


def read_snapshot(store: RunStore, run_id: str) -> dict[str, Any] | None:
    """The latest snapshot of the run (None when there is none or it is being replaced)."""
    try:
        document = json.loads(store.snapshot_path(run_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and "status" in document else None
