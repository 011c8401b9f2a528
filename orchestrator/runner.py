"""How the controller touches a host: run a command given as an argument list, stream one.

Everything above this module (up, status, tail, down) is written once against `Runner`; the local
implementation runs subprocesses, the SSH one (Fabric) runs the same argument lists remotely.
Commands are argument lists, never shell strings: values from the inventory cannot inject.
"""

from __future__ import annotations

import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from orchestrator.errors import HostError


@dataclass(frozen=True)
class CommandResult:
    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 10) -> str:
        text = (self.stderr or self.stdout).rstrip()
        return "\n".join(text.splitlines()[-lines:])


class Runner(ABC):
    """One connection to one machine."""

    def __init__(self, host_name: str) -> None:
        self.host_name = host_name

    @abstractmethod
    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        """Run to completion; a non-zero exit is a result, not an exception."""

    @abstractmethod
    def put(self, local: str, remote: str) -> None:
        """Copy a file of this machine to the host; the remote directory must exist."""

    @abstractmethod
    def get(self, remote: str, local: str) -> None:
        """Copy a file of the host to this machine."""

    @abstractmethod
    def stream(self, argv: Sequence[str]) -> Iterator[str]:
        """Yield the command's output lines as they come, until it ends or the caller stops."""

    def make_dirs(self, paths: Sequence[str]) -> None:
        made = self.run(["mkdir", "-p", *paths])
        if not made.ok:
            raise HostError(self.host_name, f"cannot create {', '.join(paths)}: {made.tail(2)}")

    def close(self) -> None:  # noqa: B027 - optional for runners that hold nothing
        """Release the connection."""

    def describe(self, argv: Sequence[str]) -> str:
        # The agent's source travels inline; naming it keeps error messages readable.
        shown = ["<agent>" if len(part) > 200 else part for part in argv]
        return " ".join(shown)


class LocalRunner(Runner):
    """Runs commands as local processes: the localhost simulation of a cluster."""

    def __init__(self, host_name: str) -> None:
        super().__init__(host_name)
        self._streams: set[subprocess.Popen[str]] = set()

    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        try:
            completed = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise HostError(
                self.host_name,
                f"cannot run {argv[0]!r}: not found",
                hint="check the host's 'python' setting in the inventory",
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise HostError(
                self.host_name, f"'{self.describe(argv)}' did not finish within {timeout:.0f} s"
            ) from exc
        return CommandResult(
            self.host_name, tuple(argv), completed.returncode, completed.stdout, completed.stderr
        )

    def put(self, local: str, remote: str) -> None:
        self._copy(local, remote)

    def get(self, remote: str, local: str) -> None:
        self._copy(remote, local)

    def _copy(self, source: str, target: str) -> None:
        try:
            shutil.copyfile(source, target)
        except OSError as exc:
            raise HostError(self.host_name, f"cannot copy {source} to {target}: {exc}") from exc

    def stream(self, argv: Sequence[str]) -> Iterator[str]:
        process = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self._streams.add(process)
        try:
            assert process.stdout is not None
            for line in process.stdout:
                yield line.rstrip("\n")
        finally:
            self._end(process)

    def _end(self, process: subprocess.Popen[str]) -> None:
        if process.poll() is None:
            process.terminate()
        process.wait()
        self._streams.discard(process)

    def close(self) -> None:
        # Streams read by daemon threads never reach their `finally`: end them here.
        for process in list(self._streams):
            self._end(process)
