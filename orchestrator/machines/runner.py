"""How the controller touches a host: run a command given as an argument list, stream one.

Everything above this module (up, status, tail, down) is written once against `Runner`; the local
implementation runs subprocesses, the SSH one (Fabric) runs the same argument lists remotely.
Commands are argument lists, never shell strings: values from the inventory cannot inject.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import shutil
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from orchestrator.errors import HostAnswerError, HostError
from orchestrator.hostside import protocol
from orchestrator.machines.answerline import LINE_CAP, decode_answer

CHUNK = 65536  # bytes read from a session's output at a time


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


class LineReader:
    """Lines of a program's output, each one whole within its own deadline: `recv(timeout)`
    returns what arrived within `timeout` seconds (b"" at the end, TimeoutError when nothing
    came). A host that dribbles its answer a byte at a time is as late as one that says nothing:
    the timeout is for the answer, not for its first byte."""

    def __init__(self, recv: Callable[[float], bytes]) -> None:
        self._recv = recv
        self._buffer = bytearray()
        self._ended = False

    def read_line(self, timeout: float, limit: int) -> bytes:
        """One line with its end of line, at most `limit` bytes (a longer line's first
        `limit`), or what was left at the end of the output."""
        deadline = time.monotonic() + timeout
        searched = 0
        while (end := self._buffer.find(b"\n", searched)) < 0:
            searched = len(self._buffer)
            if searched >= limit or self._ended:
                break
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                chunk = self._recv(left)
            except TimeoutError as exc:
                came = f"no whole answer ({searched} bytes of one came)"
                raise TimeoutError(
                    f"{came if searched else 'no answer'} within {timeout:g} s"
                ) from exc
            self._ended = not chunk
            self._buffer += chunk
        cut = min(end + 1 if end >= 0 else len(self._buffer), limit)
        line = bytes(self._buffer[:cut])
        del self._buffer[:cut]
        return line


class LineSession:
    """A command kept running on a host that answers one JSON line per JSON line it reads:
    several requests for the price of one process start. Closing its input ends it.
    `read_line(timeout, limit)` returns one line of at most `limit` bytes (answerline.py decodes
    it: a host's answer is untrusted, and is never read whole before it is bounded)."""

    def __init__(
        self,
        host_name: str,
        writer: IO[bytes],
        read_line: Callable[[float, int], bytes],
        close: Callable[[], None],
        errors: Callable[[], bytes] = lambda: b"",
        *,
        drop: Callable[[], None] | None = None,
    ) -> None:
        self.host_name = host_name
        self._writer = writer
        self._read_line = read_line
        self._close = close
        self._errors = errors
        self._drop = drop or close
        self._writing = threading.Lock()  # notify() may write while a request waits
        self._numbers = itertools.count(1)  # each request's id, echoed in its answer

    def _write(self, message: dict[str, Any]) -> None:
        with self._writing:
            self._writer.write(json.dumps(message).encode() + b"\n")
            self._writer.flush()

    def notify(self, message: dict[str, Any]) -> None:
        """Write a line that gets no answer (the agent's `wake`), also while a request waits
        for its answer in another thread."""
        try:
            self._write(message)
        except (OSError, ValueError) as exc:  # ValueError: the input was closed meanwhile
            raise HostError(self.host_name, f"the session ended: {exc}") from exc

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The answer to `message`, whole within `timeout` seconds. An answer that is not this
        request's (its id is another's or none: one answer too many came before it) is a
        HostAnswerError: the session is out of step for good, and its caller drops it."""
        number = next(self._numbers)
        try:
            self._write({**message, protocol.ID: number})
            line = self._read_line(timeout, LINE_CAP + 1)
        except (OSError, TimeoutError, EOFError) as exc:
            # A socket timeout says nothing by itself (its str() is empty).
            why = str(exc) or (
                f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            )
            raise HostError(self.host_name, f"the session ended: {why}") from exc
        if not line:
            said = self._errors().decode("utf-8", "replace").strip().splitlines()[-3:]
            raise HostError(
                self.host_name,
                "the program ended without answering" + (f": {' '.join(said)}" if said else ""),
                hint="check that the host's 'python' is a working Python 3",
            )
        verb = str(message.get(protocol.VERB, "?"))
        answer = decode_answer(self.host_name, verb, line)
        said = answer.pop(protocol.ID, None)
        if said != number or isinstance(said, bool):
            raise HostAnswerError(
                self.host_name,
                verb,
                f"an answer to another request (id {str(said)[:20]}, not "
                f"{number}): an answer came unasked, and every later one would be out of step",
            )
        return answer

    def close(self) -> None:
        """End of input, then wait (a while) for the program to exit."""
        self._close()

    def drop(self) -> None:
        """End of input without waiting for the program's exit: it ends by itself at end of
        input, and nothing depends on when (a controller closing its sessions at exit)."""
        self._drop()


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
    def session(self, argv: Sequence[str]) -> LineSession:
        """Start a command that reads requests on stdin and answers on stdout, line by line."""

    @abstractmethod
    def stream(self, argv: Sequence[str]) -> Iterator[str]:
        """Yield the command's output lines as they come, until it ends or the caller stops."""

    def make_dirs(self, paths: Sequence[str], private: bool = False) -> None:
        """Create directories (parents too); `private`: the named ones 0700 (a run's)."""
        made = self.run(["mkdir", "-p", *(["-m", "700"] if private else []), *paths])
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

    def session(self, argv: Sequence[str]) -> LineSession:
        try:
            process = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except FileNotFoundError as exc:
            raise HostError(self.host_name, f"cannot run {argv[0]!r}: not found") from exc
        assert process.stdin and process.stdout and process.stderr
        stdin, stdout, stderr = process.stdin, process.stdout, process.stderr

        def recv(timeout: float) -> bytes:
            if not select.select([stdout], [], [], timeout)[0]:
                raise TimeoutError
            return os.read(stdout.fileno(), CHUNK)

        def close() -> None:
            # Its output closed first: a program blocked writing an answer nobody reads (one
            # refused as too long) ends with EPIPE instead of holding this wait.
            with contextlib.suppress(OSError):
                stdin.close()
            stdout.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            stderr.close()

        # stderr is read only once the program has ended: it writes there only when it fails.
        return LineSession(self.host_name, stdin, LineReader(recv).read_line, close, stderr.read)

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
