"""The product's exception tree. Only the CLI prints these and turns them into exit codes.

OrchestrateError
├── InventoryError      the inventory file is unreadable or invalid (exit 2)
├── RunStateError       no run to act on, or a run is already active (exit 4)
│   ├── RecordDamaged   a run's record cannot be read (exit 4)
│   └── LeaseClash      a port or GPU the run needs is leased to another job (exit 4)
├── QueueWithdrawn      a queued `up` stopped waiting (Ctrl-C, `down`): nothing started (130)
├── HostError           a host could not be reached or a command on it failed (exit 3)
│   ├── ConnectError    the host could not be reached or logged into
│   └── HostAnswerError a host program answered what orchestrate will not read (a lost host)
├── PreflightFailed     `check` found a problem that blocks the run (exit 5)
├── ExportRefused       `export` would print what the target would reject (exit 2)
├── ScriptRefused       a value would end a generated script's embedded text early (exit 2)
├── SecretMissing       a job.secret_env variable is not set where its value is needed (exit 2)
└── JobFailed           the training job ended with a failed worker (exit 1)
FileRefused (an OSError) a file to read is no regular file or is over its size cap

Every error carries a one-paragraph message and, where there is one, a hint that says what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class OrchestrateError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class Problem:
    """One finding in an inventory file: where it is and what was expected."""

    path: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class InventoryError(OrchestrateError):
    exit_code = 2

    def __init__(self, problems: Sequence[Problem], hint: str | None = None) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        header = f"the inventory has {count} problem{'s' if count != 1 else ''}"
        super().__init__(
            header + ":\n" + "\n".join(f"  {p}" for p in self.problems),
            hint=hint
            or "fix the keys named above; inventory/cluster.example.yaml documents every key",
        )


class RunStateError(OrchestrateError):
    exit_code = 4


class RecordDamaged(RunStateError):
    """A run's record cannot be read (truncated, nested too deep, over its size cap): `down`
    still asks the run's live supervisor to stop its workers."""

    def __init__(self, run_id: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.run_id = run_id


class LeaseClash(RunStateError):
    """A port or GPU the run needs is held by another job's lease; `clashes` says by whom
    (model.leases.Clash entries, per host and holder)."""

    def __init__(self, message: str, clashes: Sequence[Any], hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.clashes = list(clashes)


class QueueWithdrawn(OrchestrateError):
    """A queued run stopped waiting for its turn (Ctrl-C, `down`): its tickets are withdrawn
    and nothing started."""

    exit_code = 130


class HostError(OrchestrateError):
    exit_code = 3

    def __init__(self, host: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{host}: {message}", hint)
        self.host = host


class ConnectError(HostError):
    """The host could not be reached or logged into (as opposed to a command failing there)."""


class HostAnswerError(HostError):
    """A host program's answer broke the decoder's bounds (size, encoding, nesting, shape): it is
    untrusted input, so the host counts as lost, never as a traceback (machines/answerline.py)."""

    def __init__(self, host: str, verb: str, message: str) -> None:
        super().__init__(
            host,
            f"answered `{verb}` with {message}",
            hint="something other than orchestrate's host program answered, or it was damaged on "
            "the way: check the host's 'python' and what its login shell prints",
        )
        self.verb = verb


class HostErrors(OrchestrateError):
    """Several hosts failed in one fan-out: every one is reported, not only the first."""

    exit_code = 3

    def __init__(
        self, errors: Sequence[HostError], action: str, partial: Mapping[Any, Any] | None = None
    ) -> None:
        self.errors = list(errors)
        self.partial = dict(partial or {})  # the hosts that did answer, by key
        lines = "\n".join(
            f"  {e.message}" + (f"\n    hint: {e.hint}" if e.hint else "") for e in errors
        )
        super().__init__(f"{action} failed on {len(self.errors)} host(s):\n{lines}")


class PreflightFailed(OrchestrateError):
    """`check` found something that would stop or hang the run."""

    exit_code = 5


class ExportRefused(OrchestrateError):
    """The exported manifest or script would be rejected where it is meant to go."""

    exit_code = 2


class ScriptRefused(OrchestrateError):
    """A value would end the batch script's embedded plan or launcher early (it holds their
    here-documents' end marker): refused before a script is written."""

    exit_code = 2


class SecretMissing(OrchestrateError):
    """A variable named in job.secret_env is absent from the environment that must supply it."""

    exit_code = 2


class MissingTool(OrchestrateError):
    """A program this command needs is missing or would not start."""

    exit_code = 2


class PartialFailure(OrchestrateError):
    """An action reached some hosts but not all of them."""

    exit_code = 3


class JobFailed(OrchestrateError):
    exit_code = 1


class FileRefused(OSError):
    """A file the controller will not read (boundedread.py): not a regular file (a device, a
    fifo), or over its size cap. An OSError, so every reader that reports an unreadable file
    reports this one; its strerror says what the file is and the cap."""
