"""The one failure classification: from what a worker left behind to a kind, a signature and
whether a restart can help. Pure.

Supervision, the root-cause report and (later) the Slurm backend all read failures through here;
none keeps its own rules. A kind is decided from the exit record (code, signal) and the last lines
of the log, where TensorFlow and Python name the cause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from orchestrator.contract import EXIT_PREEMPTED, EXIT_USAGE


class FailureKind(str, Enum):
    KILLED = "killed"  # a signal, usually SIGKILL from a person or the OOM killer
    PREEMPTED = "preempted"  # saved a checkpoint on SIGTERM and exited 75
    STALLED = "stalled"  # no new step for stall_timeout
    NOT_STARTED = "not started"  # its supervisor never came up
    UNREACHABLE = "unreachable"  # its host stopped answering
    VANISHED = "vanished"  # its process disappeared without an exit record
    USAGE = "usage"  # the worker refused its flags, TF_CONFIG or task (exit 2)
    IMPORT_ERROR = "import error"  # a module the script needs is missing on the host
    KERAS_API = "keras api"  # Keras 2 code under Keras 3
    OUT_OF_MEMORY = "out of memory"
    DISK_FULL = "disk full"
    PORT_BUSY = "port busy"  # the gRPC server could not bind its port
    PEER_LOST = "peer lost"  # a collective failed because another worker went away
    EARLY_EXIT = "early exit"  # exit 0 below the target step
    CRASHED = "crashed"  # any other non-zero exit


# Failures that a restart cannot heal: the same code on the same host fails the same way.
# (Usage errors are exit code 2, which the job lists as permanent by default.)
DETERMINISTIC = frozenset({FailureKind.IMPORT_ERROR, FailureKind.KERAS_API})

# Checked in order against the log tail: the first match names the kind.
_LOG_PATTERNS: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    (FailureKind.DISK_FULL, re.compile(r"No space left on device|ENOSPC|Disk quota exceeded")),
    (FailureKind.OUT_OF_MEMORY,
     re.compile(r"ResourceExhaustedError|OOM when allocating|MemoryError|[Oo]ut of memory")),
    (FailureKind.PORT_BUSY,
     re.compile(r"Could not start gRPC server|Address already in use|Failed to add port")),
    (FailureKind.KERAS_API,
     re.compile(r"has no attribute '(reset_states|_distribution_strategy)'|"
                r"unsupported type \(<class '[\w.]*PerReplica'>\)")),
    (FailureKind.IMPORT_ERROR, re.compile(r"\b(ModuleNotFoundError|ImportError)\b")),
    (FailureKind.PEER_LOST,
     re.compile(r"Collective ops is aborted|[Uu]nhealthy|UnavailableError|Socket closed|"
                r"Connection reset by peer|failed to connect to all addresses")),
)  # fmt: skip


def classify_exit(returncode: int | None, log_tail: Sequence[str]) -> FailureKind:
    """The kind of a worker's failed exit (negative: killed by that signal)."""
    if returncode == 0:
        return FailureKind.EARLY_EXIT
    if returncode == EXIT_PREEMPTED:
        return FailureKind.PREEMPTED
    if returncode == EXIT_USAGE:
        return FailureKind.USAGE
    text = "\n".join(log_tail)
    for kind, pattern in _LOG_PATTERNS:
        if pattern.search(text):
            return kind
    if returncode is not None and (returncode < 0 or returncode > 128):
        return FailureKind.KILLED
    return FailureKind.CRASHED


@dataclass(frozen=True)
class Failure:
    worker: str
    kind: FailureKind
    reason: str  # for people: may carry varying details (temp file names, times)
    step: int | None
    exit_code: int | None = None

    @property
    def signature(self) -> tuple[str, str, int | None]:
        """What "the same failure" means: the same worker, the same kind, the same step."""
        return (self.worker, self.kind.value, self.step)


def permanent_reason(
    failure: Failure,
    previous: tuple[str, str, int | None] | None,
    permanent_exit_codes: Sequence[int],
) -> str | None:
    """Why restarting would not help, or None when a restart is worth it."""
    if failure.exit_code is not None and failure.exit_code in permanent_exit_codes:
        return f"exit code {failure.exit_code} is marked permanent"
    if failure.kind in DETERMINISTIC:
        return f"a {failure.kind.value} failure repeats on every restart"
    if previous is not None and previous == failure.signature:
        return "it failed the same way at the same step twice in a row"
    return None
