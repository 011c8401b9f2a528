"""The progress file: one small JSON object per worker that the controller polls.

Standard library only (no TensorFlow, no numpy import), so any training script can report progress
with `report(step=..., loss=...)` even if it does not use worker.train.

Each write goes to a temporary file in the same directory and is then renamed over the real one
(os.replace is atomic on POSIX within one file system), so a reader sees either the previous
complete object or the new one, never a half-written file. There is no fsync: the file guards
against a process dying mid-write, not against the machine losing power, and it is rewritten every
few seconds anyway.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import time
from typing import Any

from orchestrator.contract import PROGRESS_FILE_ENV


class ProgressWriter:
    """Keeps the fields written so far and rewrites the whole file on each write.

    write() merges: fields not named keep their previous value, so callers only pass what changed.
    With path None nothing is written, which lets the training loop call it unconditionally.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fields: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def fields(self) -> dict[str, Any]:
        """A copy of everything written so far (including "time")."""
        with self._lock:
            return dict(self._fields)

    def write(self, **fields: Any) -> None:
        with self._lock:
            self._fields.update({key: _plain(value) for key, value in fields.items()})
            self._fields["time"] = time.time()
            if self.path is not None:
                _write_atomically(self.path, self._fields)


_writers: dict[str, ProgressWriter] = {}
_writers_lock = threading.Lock()


def report(**fields: Any) -> None:
    """Writes fields to $ORCHESTRATE_PROGRESS_FILE, merged with earlier report() calls.

    Does nothing when the variable is unset, so a script runs the same with or without the
    controller.
    """
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return
    with _writers_lock:
        writer = _writers.setdefault(path, ProgressWriter(path))
    writer.write(**fields)


def _plain(value: Any) -> Any:
    """Makes a value strict-JSON safe.

    numpy and TensorFlow values become Python ones (through .numpy() and .tolist(), without
    importing either library); NaN and infinities become None because strict JSON has no spelling
    for them and readers such as jq reject Python's NaN.
    """
    if hasattr(value, "numpy") and callable(value.numpy):
        value = value.numpy()
    if hasattr(value, "tolist") and callable(value.tolist):
        value = value.tolist()  # numpy scalar -> Python number, numpy array -> nested lists
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value


def _write_atomically(path: str, fields: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    text = json.dumps(fields, allow_nan=False, sort_keys=True) + "\n"
    # Same directory as the target: os.replace cannot be atomic across file systems.
    fd, tmp_path = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
        # mkstemp creates 0600; others (a monitoring user, a web view) may read progress.
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise
