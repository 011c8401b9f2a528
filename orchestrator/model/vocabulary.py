"""The words a run's records and its status are told in: how a worker stands (`WorkerState`),
how a worker failed (`FailureKind`) and how an attempt ended (`AttemptEnd`). Pure.

They differ in what they describe and when: a worker's *state* is what a probe shows now and
changes at every poll; a *failure kind* is the cause of one worker's failure, decided once from
its exit record and log (engine/observe/failures.py) and kept in a `Restart`; an *attempt end* is
how the whole cluster's attempt ended, one of five words kept in the attempt's goodput record: a
failure kind other than a preemption or a stall ends an attempt as `crashed`.

Each is a `str` enum whose value is the word the records and status documents have always held,
so the JSON they are written as is unchanged, and `format()` gives the word (as the plain
string did) on every Python this project supports.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar


class Word(str, Enum):
    """A str enum that formats as its value (Python 3.11's `str, Enum` formats as its name)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str(self), spec)


class WorkerState(Word):
    """One worker process now, classified from a probe of its run directory (engine/observe/state.py
    says each word's meaning and the moves between them)."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    UNKNOWN = "unknown"

    @property
    def finished(self) -> bool:
        return self in (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED)


# The states of a worker that has not ended (nor been lost from sight).
ACTIVE = (WorkerState.PENDING, WorkerState.STARTING, WorkerState.RUNNING)


class FailureKind(Word):
    """The cause of one worker's failure (engine/observe/failures.py decides it; its MEANINGS say
    each for people, and the manual's failure reference is generated from them)."""

    KILLED = "killed"
    PREEMPTED = "preempted"
    STALLED = "stalled"
    NOT_STARTED = "not started"
    UNREACHABLE = "unreachable"
    VANISHED = "vanished"
    USAGE = "usage"
    IMPORT_ERROR = "import error"
    KERAS_API = "keras api"
    OUT_OF_MEMORY = "out of memory"
    DISK_FULL = "disk full"
    PORT_BUSY = "port busy"
    PEER_LOST = "peer lost"
    COORDINATOR_UNREACHABLE = "coordinator unreachable"  # job.keras: jax
    COLLECTIVES_UNREACHABLE = "collectives unreachable"  # job.keras: jax, gloo's own connections
    EARLY_EXIT = "early exit"
    LEFT_EARLY = "left early"
    STOPPED_SHORT = "stopped short"
    BAD_PROGRESS = "bad progress"
    CRASHED = "crashed"


class AttemptEnd(Word):
    """How one attempt of the whole cluster ended, as goodput accounts its last moments."""

    FINISHED = "finished"  # every worker succeeded
    STOPPED = "stopped"  # `down` stopped it
    PREEMPTED = "preempted"  # the cluster saved on SIGTERM and is resubmitted
    STALLED = "stalled"  # no step within start_timeout or stall_timeout
    CRASHED = "crashed"  # any other failure

    @classmethod
    def of_failure(cls, kind: FailureKind) -> AttemptEnd:
        """The end of an attempt that a worker's failure of this kind ended."""
        if kind is FailureKind.PREEMPTED:
            return cls.PREEMPTED
        return cls.STALLED if kind is FailureKind.STALLED else cls.CRASHED


W = TypeVar("W", bound=Word)


def known(enum: type[W], word: str) -> W | str:
    """`word` as the member of `enum` that holds it; a word this version does not know (a record
    or snapshot of another orchestrate) stays as written, so it reads back and is written again
    unchanged."""
    try:
        return enum(word)
    except ValueError:
        return word
