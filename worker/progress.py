"""The progress file: one small JSON object per worker that the controller polls.

Standard library only (no TensorFlow, no numpy import), so any training script can report progress
with `report(step=..., loss=...)` even if it does not use the built-in loop (worker.loop).

Each write goes to a temporary file in the same directory and is then renamed over the real one
(os.replace is atomic on POSIX within one file system), so a reader sees either the previous
complete object or the new one, never a half-written file. There is no fsync: the file guards
against a process dying mid-write, not against the machine losing power, and it is rewritten every
few seconds anyway.

Beside it, `progress-history.jsonl` keeps the curve behind the dashboard: one line per progress
write that carries a metric (step, time, loss, accuracy, steps/s), and a line of its own (step,
time, val_loss, val_accuracy) per write that carries an evaluation. It is bounded: past
HISTORY_LIMIT lines it is rewritten with every other older point dropped, so a run of any length
keeps its whole shape in at most HISTORY_LIMIT lines, denser towards the present. The worker keeps
it (not the supervisor) so it survives the loss of the controller.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from orchestrator.contract import (
    ACCURACY,
    CHECKPOINT_AT,
    CHECKPOINT_SECONDS,
    CHECKPOINT_STEP,
    EVAL_SECONDS,
    FIRST_STEP_AT,
    HISTORY_FILE,
    LOSS,
    PROGRESS_FILE_ENV,
    START_STEP,
    STEP,
    STEP_CALL_SECONDS,
    STEP_SECONDS,
    STEPS_PER_SEC,
    TIMED_CHECKPOINT,
    TIMED_EVALUATION,
    VAL_ACCURACY,
    VAL_LOSS,
    WRITTEN_AT,
)

HISTORY_LIMIT = 1000
HISTORY_FIELDS = (STEP, LOSS, ACCURACY, STEPS_PER_SEC)
METRICS = (LOSS, ACCURACY, STEPS_PER_SEC)
# An evaluation's line: the step, the time and these, written when a write carries them.
EVAL_FIELDS = (VAL_LOSS, VAL_ACCURACY)


def history_path(progress_path: str) -> str:
    """The history file that belongs to a progress file: the same directory."""
    return os.path.join(os.path.dirname(os.path.abspath(progress_path)), HISTORY_FILE)


class ProgressWriter:
    """Keeps the fields written so far and rewrites the whole file on each write.

    write() merges: fields not named keep their previous value, so callers only pass what changed.
    With path None nothing is written, which lets the training loop call it unconditionally.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fields: dict[str, Any] = {}
        self._lock = threading.RLock()  # add_seconds holds it across its write
        self._history = History(history_path(path)) if path is not None else None

    @property
    def fields(self) -> dict[str, Any]:
        """A copy of everything written so far (including "time")."""
        with self._lock:
            return dict(self._fields)

    def write(self, **fields: Any) -> None:
        with self._lock:
            saved = self._fields.get(CHECKPOINT_STEP)
            self._fields.update({key: _plain(value) for key, value in fields.items()})
            self._fields[WRITTEN_AT] = time.time()
            if self._fields.get(CHECKPOINT_STEP) not in (None, saved):
                # Goodput's lost work: the steps after it are what a crash throws away.
                self._fields[CHECKPOINT_AT] = self._fields[WRITTEN_AT]
            if self._fields.get(FIRST_STEP_AT) is None and _stepped(self._fields):
                # Goodput's end of start-up: the first write past the step the attempt began at.
                self._fields[FIRST_STEP_AT] = self._fields[WRITTEN_AT]
            if self.path is not None:
                _write_atomically(self.path, self._fields)
            if self._history is not None and any(fields.get(key) is not None for key in METRICS):
                self._history.append(self._fields)
            if self._history is not None and any(fields.get(k) is not None for k in EVAL_FIELDS):
                self._history.append_evaluation(self._fields)

    def add_seconds(self, key: str, seconds: float, **fields: Any) -> None:
        """Adds `seconds` to the running sum under `key` (checkpoint_seconds, eval_seconds) and
        writes it with `fields`: one write, so the sum and the step it belongs to agree."""
        with self._lock:  # held across the write: two threads' sums never overwrite each other
            total = self._fields.get(key)
            total = (total if isinstance(total, int | float) else 0.0) + max(0.0, seconds)
            self.write(**fields, **{key: total})


def write_start(
    progress: ProgressWriter,
    *,
    start_step: int,
    restored_step: int | None,
    target_steps: int,
    task_index: int,
    num_workers: int,
    devices: list[str],
    num_replicas: int,
) -> None:
    """The built-in loop's first write (under TensorFlow and JAX alike): every key present, the
    values known before any step."""
    progress.write(
        step=start_step,
        start_step=start_step,
        target_steps=target_steps,
        loss=None,
        accuracy=None,
        checkpoint_step=restored_step,
        steps_per_sec=None,
        task_index=task_index,
        num_workers=num_workers,
        devices=devices,
        num_replicas=num_replicas,
        preempted=False,
        val_loss=None,
        val_accuracy=None,
        eval_step=None,
        # Goodput: the built-in loop measures both (0 so far), a script may not (unknown).
        **{
            STEP_CALL_SECONDS: None,
            STEP_SECONDS: None,
            FIRST_STEP_AT: None,
            CHECKPOINT_AT: None,
            CHECKPOINT_SECONDS: 0.0,
            EVAL_SECONDS: 0.0,
        },
    )


def _stepped(fields: dict[str, Any]) -> bool:
    """Whether the fields report a step made in this process: past start_step where one is
    written (the built-in loop's first write is its start step), else past 0 (a script)."""
    step, start = fields.get(STEP), fields.get(START_STEP)
    if not isinstance(step, int) or isinstance(step, bool):
        return False
    return step > (start if isinstance(start, int) and not isinstance(start, bool) else 0)


class History:
    """The bounded progress history: appended line by line, thinned when it grows too long."""

    def __init__(self, path: str, limit: int = HISTORY_LIMIT) -> None:
        self.path = path
        self.limit = limit
        self._lines: int | None = None  # counted on first use: a restarted writer may append
        self._last_step: Any = None

    def append(self, fields: dict[str, Any]) -> None:
        if fields.get(STEP) is None or fields.get(STEP) == self._last_step:
            return
        self._last_step = fields[STEP]
        self._write({WRITTEN_AT: fields[WRITTEN_AT], **{k: fields.get(k) for k in HISTORY_FIELDS}})

    def append_evaluation(self, fields: dict[str, Any]) -> None:
        """A line of its own for an evaluation (its step often has a training line already)."""
        if fields.get(STEP) is None:
            return
        point = {WRITTEN_AT: fields[WRITTEN_AT], STEP: fields[STEP],
                 **{key: fields.get(key) for key in EVAL_FIELDS}}  # fmt: skip
        self._write(point)

    def _write(self, point: dict[str, Any]) -> None:
        line = json.dumps(point, allow_nan=False, sort_keys=True) + "\n"
        if self._lines is None:
            self._lines = _count_lines(self.path)
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(line)
        self._lines += 1
        if self._lines > self.limit:
            self._thin()

    def _thin(self) -> None:
        with open(self.path, encoding="utf-8") as file:
            lines = file.readlines()
        # The newest quarter stays as it is; every other line of the rest goes. Evaluations,
        # rarer, are kept while they are few (at most a quarter of the limit), else halved too.
        keep_recent = self.limit // 4
        older, recent = lines[:-keep_recent], lines[-keep_recent:]
        evals = [i for i, line in enumerate(older) if '"val_' in line]
        steps = [i for i, line in enumerate(older) if '"val_' not in line]
        keep = set(steps[::2]) | set(evals if len(evals) <= self.limit // 4 else evals[::2])
        kept = [line for i, line in enumerate(older) if i in keep] + recent
        directory = os.path.dirname(self.path)
        fd, tmp_path = tempfile.mkstemp(prefix=f".{HISTORY_FILE}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.writelines(kept)
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, self.path)
        self._lines = len(kept)


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as file:
            return sum(1 for _ in file)
    except FileNotFoundError:
        return 0


_writers: dict[str, ProgressWriter] = {}
_writers_lock = threading.Lock()


def report(**fields: Any) -> None:
    """Writes fields to $ORCHESTRATE_PROGRESS_FILE, merged with earlier report() calls.

    Does nothing when the variable is unset, so a script runs the same with or without the
    controller.
    """
    writer = script_writer()
    if writer is not None:
        writer.write(**fields)


def script_writer() -> ProgressWriter | None:
    """The process's writer of $ORCHESTRATE_PROGRESS_FILE (one per file, shared by report() and
    timed()); None when the variable is unset."""
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return None
    with _writers_lock:
        return _writers.setdefault(path, ProgressWriter(path))


TIMED_KEYS = {TIMED_CHECKPOINT: CHECKPOINT_SECONDS, TIMED_EVALUATION: EVAL_SECONDS}


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """For a script: `with worker.progress.timed("checkpoint"): manager.save()` adds the
    block's seconds to the progress file's checkpoint_seconds ("evaluation": eval_seconds), so
    its goodput can tell them from training; without it they are shown as unknown."""
    key = TIMED_KEYS[kind]
    started = time.monotonic()
    try:
        yield
    finally:
        writer = script_writer()
        if writer is not None:
            writer.add_seconds(key, time.monotonic() - started)


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
    replace_text(path, json.dumps(fields, allow_nan=False, sort_keys=True) + "\n")


def replace_text(path: str, text: str) -> None:
    """Writes `text` to a temporary file beside `path` and renames it over `path`: a reader
    sees the old file or the new one, never a part."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
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
