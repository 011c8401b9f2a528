"""Every machine the controller works on: one runner and one agent session kept open for each.

Workers that share a machine share a connection, made by the host's connection kind; the
stdlib-only agent (hostside/agent.py) does the work on the machine. Every agent call (probes,
launches, stops, listings) goes through one session kept open per machine, so neither repeated
polls nor the several steps of a start pay a login shell and a Python start each: at 64 hosts
each such round cost as much as reaching the hosts at all. Both backends use it: the hosts
backend for its workers' machines, the Slurm backend for the login node.
"""

from __future__ import annotations

import posixpath
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.errors import ConnectError, HostError
from orchestrator.fanout import GroupResult, fan_out, per_machine
from orchestrator.hostside import protocol
from orchestrator.machines.hostclient import HOSTPROBE, HostAgent
from orchestrator.machines.kinds import kind_of
from orchestrator.machines.runner import LineSession, Runner
from orchestrator.model.answers import (
    BY_DOWN,
    CheckpointListing,
    FileListing,
    SetAside,
    StackAnswer,
    StandbyInfo,
    StopAnswer,
    WorkerProbe,
    parsed,
)
from orchestrator.model.answers import parse_probe as parse_probe_answer
from orchestrator.model.inventory import WorkerSlot
from orchestrator.model.workers import job_dir_of_run

if TYPE_CHECKING:
    from orchestrator.model.records import WorkerRecord
    from orchestrator.model.workers import WorkerSpec

MachineKey = tuple[str, ...]
M = TypeVar("M", bound="Machines")
WAKE_CHECK = 0.1  # seconds between looks at a wait's `woken` (the stop flag)
PROBE_TIMEOUT = 5.0  # seconds a host may take to answer a poll before it counts as silent
# A new session's first answer also waits for the login shell and Python to start, which takes
# seconds on a loaded host or behind a slow ~/.bashrc. Counting that against PROBE_TIMEOUT
# made the first poll of 64 namespace hosts fail, and every failed poll opened another 64
# sessions on top of the ones still starting.
SESSION_START_TIMEOUT = 30.0
BACKOFF_FIRST = 0.25  # seconds a failed watch waits before the next probe; doubles, per failure


def machine_key(host: WorkerSlot) -> MachineKey:
    return kind_of(host).machine_key(host)


def session_key(host: WorkerSlot) -> MachineKey:
    """One agent session per machine and interpreter: the agent runs under the host's own
    `python:` (a wrapper that sets up the environment, a slow-starting venv), as a command per
    host did before sessions were shared."""
    return (*machine_key(host), host.python)


class Machines:
    def __init__(self) -> None:
        self._runners: dict[MachineKey, Runner] = {}
        self._lock = threading.Lock()  # fan-out threads ask for runners at the same time
        self._sessions: dict[MachineKey, LineSession] = {}
        self._busy: dict[MachineKey, threading.Lock] = {}  # one request at a time per session
        self._running: set[tuple[MachineKey, str]] = set()  # run dirs the last probe saw running
        self._watching: dict[MachineKey, LineSession] = {}  # sessions a watch waits in now
        self._failures: dict[MachineKey, int] = {}  # failed requests in a row, per session

    # --- connections ---------------------------------------------------------------------------
    def agent(self, host: WorkerSlot) -> HostAgent:
        return HostAgent(
            self.runner(host),
            host.python,
            lambda verb, wait, fields: self._ask(host, verb, wait, fields),
        )

    def runner(self, host: WorkerSlot) -> Runner:
        key = machine_key(host)
        with self._lock:
            if key not in self._runners:
                self._runners[key] = kind_of(host).runner(host)
            return self._runners[key]

    def _forget(self, key: MachineKey, session: LineSession | None) -> None:
        """Drop a machine's connection after it stopped answering: the next call connects
        afresh (a new TCP connection works at once when the network is back, where the old
        one may sit in retransmission backoff). Closed in the background: closing a
        connection to a silent host can block."""
        with self._lock:
            runner = self._runners.pop(key, None)
        closers: list[Callable[[], None]] = []
        if session is not None:
            closers.append(session.close)
        if runner is not None:
            closers.append(runner.close)
        threading.Thread(target=_close_quietly, args=(closers,), daemon=True).start()

    def __enter__(self: M) -> M:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        # All machines at once, without waiting for each agent to exit (it does at end of
        # input): one after the other, waiting, closing 64 hosts took seconds.
        sessions, runners = dict(self._sessions), dict(self._runners)
        self._sessions.clear()
        self._runners.clear()
        fan_out(sessions, lambda key: sessions[key].drop())
        fan_out(runners, lambda key: runners[key].close())

    # --- workers on their machines ------------------------------------------------------------
    def workdirs(self, hosts: Sequence[WorkerSlot]) -> GroupResult[str, str]:
        def resolve(group: list[WorkerSlot]) -> dict[str, str]:
            home = self.agent(group[0]).info().home
            return {host.name: _absolute(host.workdir, home) for host in group}

        return per_machine(hosts, lambda h: h.name, machine_key, resolve)

    def probe(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, WorkerProbe]:
        def ask(group: list[WorkerRecord]) -> dict[str, WorkerProbe]:
            probes = self._probe_machine(group[0].host, [w.run_dir for w in group])
            return {w.name: probes[w.run_dir] for w in group if w.run_dir in probes}

        return per_machine(workers, lambda w: w.name, lambda w: machine_key(w.host), ask)

    def wait_for_change(self, workers: Sequence[WorkerRecord], timeout: float,
                        woken: Callable[[], bool] = lambda: False) -> bool:  # fmt: skip
        """The wait between two probes, ended by the first machine whose agent tells of a
        worker's exit (its `watch`), or by `woken` (looked at every WAKE_CHECK: `down`'s stop
        request), which wakes the watches still waiting at once (a `wake` line in their
        sessions). One watch per machine lasts the whole wait: no request per tick. The
        workers watched are those the last probe saw running, so that one ending between that
        probe and this wait is told at once too. Only machines with a session open already are
        asked: a pause never opens a connection (the next probe does, with its own timeout);
        with none to ask this is a sleep. A machine that fails to answer ends the wait too,
        after a back-off (`backoff`): the probe that follows says what became of it."""
        groups: dict[MachineKey, list[WorkerRecord]] = {}
        for worker in workers if timeout > 0 else ():
            key = session_key(worker.host)
            if key in self._sessions and (key, worker.run_dir) in self._running:
                groups.setdefault(key, []).append(worker)
        if not groups:
            sleep_unless(woken, timeout)
            return False
        answers: dict[MachineKey, bool] = {}
        done, ending = threading.Event(), threading.Event()

        def watch(key: MachineKey) -> None:
            group = groups[key]
            fields = {
                protocol.RUN_DIRS_KEY: [w.run_dir for w in group],
                protocol.TIMEOUT_KEY: timeout,
            }
            try:
                answer = self._ask(group[0].host, protocol.WATCH, timeout + PROBE_TIMEOUT, fields)
                answers[key] = bool(answer.get(protocol.CHANGED_KEY))
            except HostError:
                # The probe that follows says what became of it, after a pause that doubles
                # with each failure in a row: a host that fails at once is not asked in a loop.
                ending.wait(min(timeout, self.backoff(key)))
                answers[key] = True
            if answers[key] or len(answers) == len(groups):
                done.set()

        threads = {key: threading.Thread(target=watch, args=(key,), daemon=True) for key in groups}
        for thread in threads.values():
            thread.start()
        try:
            while not done.wait(WAKE_CHECK):
                if woken():
                    break
        finally:  # a change, a stop request, Ctrl-C: no watch may keep its session busy
            ending.set()
            while any(thread.is_alive() for thread in threads.values()):
                for key, thread in threads.items():
                    if thread.is_alive():
                        self._wake(key)
                for thread in threads.values():
                    thread.join(WAKE_CHECK)
        return any(answers.values())

    def _wake(self, key: MachineKey) -> None:
        """End the watch that waits in the machine's session (a line on its input; one that
        arrives after the watch ended is read and ignored by the agent)."""
        session = self._watching.get(key)
        if session is not None:
            with suppress(OSError, HostError):
                session.notify({protocol.VERB: protocol.WAKE})

    def backoff(self, key: MachineKey) -> float:
        """Seconds to wait after the machine's latest failure: BACKOFF_FIRST, doubled with each
        failure in a row since its last answer."""
        return BACKOFF_FIRST * 2 ** min(self._failures.get(key, 1) - 1, 10)

    def _probe_machine(self, host: WorkerSlot, run_dirs: list[str]) -> dict[str, WorkerProbe]:
        answer = self._ask(host, protocol.PROBE, PROBE_TIMEOUT, {protocol.RUN_DIRS_KEY: run_dirs})
        key = session_key(host)
        try:
            probes = parsed(host.name, parse_probe_answer, answer)
        except HostError:  # an answer it cannot read: the session is not trusted again
            self._failures[key] = self._failures.get(key, 0) + 1
            self._drop_session(key, host)
            raise
        for run_dir, probe in probes.items():  # what wait_for_change watches
            if probe.alive and probe.exit is None:
                self._running.add((key, run_dir))
            else:
                self._running.discard((key, run_dir))
        return probes

    def _ask(
        self, host: WorkerSlot, verb: str, wait: float, fields: dict[str, Any]
    ) -> dict[str, Any]:
        """One request through the machine's open agent session, answered within `wait` (a
        session opened now: at least SESSION_START_TIMEOUT, its program has to start first).
        A session that fails is dropped and the host reported as not answering: retrying at
        once would freeze the live view for the length of a network outage. The next call
        opens a fresh session. An {"error": ...} answer keeps the session."""
        key = session_key(host)
        with self._lock:
            busy = self._busy.setdefault(key, threading.Lock())
        with busy:
            session = self._sessions.pop(key, None)
            if session is None:
                wait = max(wait, SESSION_START_TIMEOUT)
            try:
                session = session or HostAgent(self.runner(host), host.python).session()
                if verb == protocol.WATCH:
                    self._watching[key] = session  # _wake ends it early
                answer = session.request({protocol.VERB: verb, **fields}, timeout=wait)
            except HostError:
                self._failures[key] = self._failures.get(key, 0) + 1
                self._forget(machine_key(host), session)
                raise
            finally:
                self._watching.pop(key, None)
            self._sessions[key] = session
            self._failures.pop(key, None)
        if protocol.ERROR_KEY in answer:
            error = answer[protocol.ERROR_KEY]
            raise HostError(host.name, f"the agent could not {verb}: {error}")
        return answer

    def _drop_session(self, key: MachineKey, host: WorkerSlot) -> None:
        with self._lock:
            busy = self._busy.setdefault(key, threading.Lock())
        with busy:
            session = self._sessions.pop(key, None)
        self._forget(machine_key(host), session)

    def stop(
        self, workers: Sequence[WorkerRecord], grace: float, by: str = BY_DOWN
    ) -> GroupResult[str, StopAnswer]:
        def stop(group: list[WorkerRecord]) -> dict[str, StopAnswer]:
            answers = self.agent(group[0].host).stop([w.run_dir for w in group], grace, by)
            return {w.name: answers.get(w.run_dir, StopAnswer("not running")) for w in group}

        return per_machine(workers, lambda w: w.name, lambda w: machine_key(w.host), stop)

    def stacks(
        self, workers: Sequence[WorkerRecord], wait: float, native: bool = False
    ) -> GroupResult[str, StackAnswer]:
        def ask(group: list[WorkerRecord]) -> dict[str, StackAnswer]:
            answers = self.agent(group[0].host).stacks([w.run_dir for w in group], wait,
                                                       native=native)  # fmt: skip
            return {w.name: answers.get(w.run_dir, StackAnswer()) for w in group}

        return per_machine(workers, lambda w: w.name, lambda w: machine_key(w.host), ask)

    def start_standbys(self, specs: Sequence[WorkerSpec], linger: float) -> GroupResult[str, str]:
        def start(group: list[WorkerSpec]) -> dict[str, str]:
            answers = self.agent(group[0].host).standby([s.standby_request(linger) for s in group])
            return {s.name: answers[s.run_dir] for s in group if s.run_dir in answers}

        return per_machine(specs, lambda s: s.name, lambda s: machine_key(s.host), start)

    def discard_standbys(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, str]:
        def discard(group: list[WorkerRecord]) -> dict[str, str]:
            answers = self.agent(group[0].host).discard_standbys([w.run_dir for w in group])
            return {w.name: answers[w.run_dir] for w in group if w.run_dir in answers}

        return per_machine(workers, lambda w: w.name, lambda w: machine_key(w.host), discard)

    def linger_standbys(
        self, workers: Sequence[WorkerRecord], seconds: float
    ) -> GroupResult[str, str]:
        def release(group: list[WorkerRecord]) -> dict[str, str]:
            answers = self.agent(group[0].host).linger_standbys([w.run_dir for w in group],
                                                                seconds)  # fmt: skip
            return {w.name: answers[w.run_dir] for w in group if w.run_dir in answers}

        return per_machine(workers, lambda w: w.name, lambda w: machine_key(w.host), release)

    def standbys(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, StandbyInfo | None]:
        def listing(group: list[WorkerRecord]) -> dict[str, StandbyInfo | None]:
            jobs = sorted({job_dir_of_run(w.run_dir) for w in group})
            found = self.agent(group[0].host).standbys(jobs)
            return {
                w.name: next((s for s in found.get(job_dir_of_run(w.run_dir), [])
                              if s.name == w.name), None)
                for w in group
            }  # fmt: skip

        return per_machine(workers, lambda w: w.name, lambda w: machine_key(w.host), listing)

    def log_lines(self, worker: WorkerRecord, lines: int) -> list[str]:
        result = self.runner(worker.host).run(_tail_argv(worker.log_path, lines, follow=False))
        if not result.ok and "No such file" not in result.stderr:
            raise HostError(worker.name, f"cannot read {worker.log_path}: {result.tail(2)}")
        return result.stdout.splitlines()

    def follow_log(self, worker: WorkerRecord, lines: int) -> Iterator[str]:
        return self.runner(worker.host).stream(_tail_argv(worker.log_path, lines, follow=True))

    # --- files on a host -----------------------------------------------------------------------
    def checkpoint(self, host: WorkerSlot, directory: str) -> CheckpointListing:
        return self.agent(host).checkpoint(directory)

    def adopt_checkpoint(
        self, host: WorkerSlot, directory: str, name: str, checkpoints: Sequence[str]
    ) -> None:
        self.agent(host).adopt_checkpoint(directory, name, list(checkpoints))

    def set_aside(self, host: WorkerSlot, directory: str, stamp: str) -> SetAside:
        return self.agent(host).set_aside(directory, stamp)

    def list_files(self, host: WorkerSlot, directory: str) -> FileListing:
        return self.agent(host).files(directory)

    def read_text(self, host: WorkerSlot, path: str) -> str | None:
        result = self.runner(host).run(["cat", path], timeout=20)
        return result.stdout if result.ok else None

    def download(self, host: WorkerSlot, remote: str, local: str) -> None:
        self.runner(host).get(remote, local)

    def upload(self, host: WorkerSlot, files: Sequence[tuple[str, str]]) -> None:
        if not files:
            return
        self._make_dirs(host, files, [])
        self._put(host, files)

    def _make_dirs(
        self, host: WorkerSlot, files: Sequence[tuple[str, str]], private: list[str]
    ) -> None:
        directories = sorted({posixpath.dirname(remote) for _, remote in files})
        self.agent(host).make_dirs(directories, private)

    def _put(self, host: WorkerSlot, files: Sequence[tuple[str, str]]) -> None:
        runner = self.runner(host)
        for local, remote in files:
            runner.put(local, remote)

    def stream(self, host: WorkerSlot, argv: Sequence[str]) -> Iterator[str]:
        return self.runner(host).stream(argv)

    # --- reaching hosts ------------------------------------------------------------------------
    def unreachable(self, hosts: Sequence[WorkerSlot]) -> dict[str, str]:
        answers = fan_out(hosts, lambda host: self.agent(host).info())
        return {
            host.name: error.message
            for host, error in answers.failed.items()
            if isinstance(error, ConnectError)
        }

    def preflight_session(self, host: WorkerSlot) -> LineSession:
        return self.agent(host).session(HOSTPROBE)


def _close_quietly(closers: list[Callable[[], None]]) -> None:
    for close in closers:
        try:
            close()
        except Exception:
            continue


def _absolute(path: str, home: str) -> str:
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    return path if path.startswith("/") else f"{home}/{path}"


def _tail_argv(log_path: str, lines: int, follow: bool) -> list[str]:
    # -F keeps following across the log being created late or rotated.
    return ["tail", "-n", str(lines), *(["-F"] if follow else []), log_path]


def expand_uploads(uploads: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Directories become the files under them (caches left out)."""
    files: list[tuple[str, str]] = []
    for local, remote in uploads:
        source = Path(local)
        if source.is_dir():
            files.extend(
                (str(path), posixpath.join(remote, path.relative_to(source).as_posix()))
                for path in sorted(source.rglob("*"))
                if path.is_file() and "__pycache__" not in path.parts
            )
        else:
            files.append((local, remote))
    return files


def sleep_unless(woken: Callable[[], bool], timeout: float) -> None:
    """Sleep `timeout` seconds, or less: until `woken()` says so (looked at every WAKE_CHECK)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0 and not woken():
        time.sleep(min(left, WAKE_CHECK))
