"""Where a test run's time goes: each phase (a cluster's build, a test in its lane) appends one
JSON line to $ORCHESTRATE_PHASE_LOG when scripts/test.sh set it; scripts/phase_table.py prints
the table at the run's end. Without the variable nothing is written."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

PHASE_LOG_VARIABLE = "ORCHESTRATE_PHASE_LOG"


def record(kind: str, name: str, start: float, end: float, **detail: str | float) -> None:
    """Append one phase (wall-clock seconds since the epoch), e.g. ("cluster", "slurm", ...);
    `detail` adds fields: a test's node id, its xdist worker and its CPU seconds."""
    path = os.environ.get(PHASE_LOG_VARIABLE)
    if not path:
        return
    line = json.dumps({"kind": kind, "name": name, "start": start, "end": end, **detail}) + "\n"
    # One write of a short line with O_APPEND: the xdist workers' lines never interleave.
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)


@contextlib.contextmanager
def phase(kind: str, name: str) -> Iterator[None]:
    """Record the block's wall time as a phase, whether it succeeds or not."""
    start = time.time()
    try:
        yield
    finally:
        record(kind, name, start, time.time())
