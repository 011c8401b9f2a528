"""Telling `notify:` targets of a run's events, without ever holding up or failing the run.

Each target has its own queue and daemon thread (a slow one delays no other, and none delays
the supervisor): a webhook gets three tries (`timeout` seconds each, 1 s and 2 s apart; a 4xx
answer other than 408/429 and a refused certificate are not tried again), a command one run.
A target that did not take an event is said once, with why, through the supervisor's `say`
(its log when detached). At the end the supervisor waits a bounded time for what is still
queued (`Notifier.close`).

What is sent is engine/observe/events.py's; each run's events are claimed once in the state
directory (`RunStore.notified_path`), so a supervisor taking a run over does not repeat them.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from orchestrator import __version__
from orchestrator.boundedread import RECORD_CAP, read_text
from orchestrator.config.notify import SIGNATURE_HEADER
from orchestrator.engine.observe.events import (
    TEST_EVENT,
    body,
    dashboard_address,
    run_event,
    signature,
    target_label,
    wants,
)
from orchestrator.engine.observe.failures import Failure
from orchestrator.engine.observe.goodput import run_account
from orchestrator.engine.observe.snapshot import read_snapshot
from orchestrator.engine.observe.status import RunStatus
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.trackers.tracking import RunTrackers
from orchestrator.errors import JobFailed, OrchestrateError, SecretMissing
from orchestrator.model.inventory import NotifyTarget
from orchestrator.model.printable import printable
from orchestrator.model.records import Restart, RunRecord
from orchestrator.model.vocabulary import FailureKind, WorkerState
from orchestrator.paths import is_loopback

TRIES = 3
BETWEEN_TRIES = (1.0, 2.0)  # seconds before the second and the third try
QUEUE_LIMIT = 32  # events waiting for one target; past it an event is dropped (and said)
CLOSE_LIMIT = 30.0  # the most seconds the end of supervision waits for queued events
ANSWER_LIMIT = 200  # characters of an answer kept for the log


class NotDelivered(Exception):
    """A target did not take an event; the message says why."""

    def __init__(self, why: str, retry: bool = True) -> None:
        super().__init__(why)
        self.why = why
        self.retry = retry


@dataclass(frozen=True)
class Delivery:
    """What a target answered: `notify --test` reports one per target."""

    label: str
    ok: bool
    answer: str  # "HTTP 200 OK", "exit 0", or why not


# Sending one event to one target.


def deliver(
    target: NotifyTarget, event: Mapping[str, Any], base_dir: str, environ: Mapping[str, str]
) -> str:
    """Send `event` to `target`, trying again as the module says; its answer, or
    NotDelivered with why."""
    payload = body(target, event)
    if target.url is None:
        return _run_command(target, payload, base_dir, str(event["event"]))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"orchestrate/{__version__}",
        **target.headers,
    }
    if target.secret_env is not None:
        secret = environ.get(target.secret_env)
        if not secret:
            raise NotDelivered(
                f"secret_env {target.secret_env} is not set in this process's "
                "environment, so the body cannot be signed (not sent)",
                False,
            )
        headers[SIGNATURE_HEADER] = signature(secret, payload)
    for attempt in range(TRIES):
        try:
            return _post(target, payload, headers)
        except NotDelivered as failure:
            if not failure.retry or attempt == TRIES - 1:
                raise
            time.sleep(BETWEEN_TRIES[min(attempt, len(BETWEEN_TRIES) - 1)])
    raise AssertionError("unreachable")  # pragma: no cover


def _post(target: NotifyTarget, payload: bytes, headers: Mapping[str, str]) -> str:
    # Imported here: urllib.request (http.client, email, ssl) would cost every command's start
    # that never sends a webhook (issue 31).
    import ssl
    import urllib.error
    import urllib.request

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        """A redirect is an answer, not followed: a signed body goes where the inventory says
        only."""

        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    assert target.url is not None
    handlers: list[urllib.request.BaseHandler] = [NoRedirects()]
    if target.url.startswith("https://"):
        # Certificates and host names are checked; ca_file replaces the system's CAs.
        context = ssl.create_default_context(cafile=target.ca_file)
        handlers.append(urllib.request.HTTPSHandler(context=context))
    if is_loopback(urlsplit(target.url).hostname or ""):
        handlers.append(urllib.request.ProxyHandler({}))  # this machine: never through a proxy
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(target.url, data=payload, headers=dict(headers), method="POST")
    try:
        with opener.open(request, timeout=target.timeout) as response:
            response.read(65536)
            return _short(f"HTTP {response.status} {response.reason}")
    except urllib.error.HTTPError as error:
        said = _short(error.read(4096).decode("utf-8", "replace")) if error.fp else ""
        why = _short(f"HTTP {error.code} {error.reason}") + (f": {said}" if said else "")
        if 300 <= error.code < 400:
            why += " (redirects are not followed)"
        raise NotDelivered(why, retry=error.code >= 500 or error.code in (408, 429)) from error
    except urllib.error.URLError as error:
        # A certificate refused now is refused on the next try too.
        again = not isinstance(error.reason, ssl.SSLCertVerificationError)
        raise NotDelivered(_reason(error.reason, target.timeout), again) from error
    except (TimeoutError, OSError, ValueError) as error:  # a read that timed out, a reset
        raise NotDelivered(_reason(error, target.timeout)) from error


def _reason(error: object, timeout: int) -> str:
    import ssl

    if isinstance(error, TimeoutError):
        return f"no answer within {timeout} s"
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"the server's certificate was refused: {error.verify_message}"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    return _short(str(error)) or type(error).__name__


def _run_command(target: NotifyTarget, payload: bytes, base_dir: str, name: str) -> str:
    env = {**os.environ, "ORCHESTRATE_EVENT": name}
    try:
        done = subprocess.run(
            list(target.command),
            input=payload,
            capture_output=True,
            cwd=base_dir,
            env=env,
            timeout=target.timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise NotDelivered(f"still running after {target.timeout} s (killed)", False) from error
    except OSError as error:
        raise NotDelivered(
            f"could not start {target.command[0]}: {error.strerror or error}", False
        ) from error
    if done.returncode != 0:
        said = _short(done.stderr.decode("utf-8", "replace"))
        raise NotDelivered(f"exit {done.returncode}" + (f": {said}" if said else ""), False)
    return "exit 0"


def _short(text: str) -> str:
    """A server's or a command's own words (an error body, a reason phrase, stderr), as the
    supervisor's log and `notify --test` show them: one line, printable (an escape sequence in
    a webhook's answer is shown, never sent to a terminal), at most ANSWER_LIMIT characters."""
    line = printable(" ".join(text.split()))
    return line if len(line) <= ANSWER_LIMIT else line[: ANSWER_LIMIT - 3] + "..."


# The queues: one per target.


class _Channel:
    def __init__(
        self,
        index: int,
        target: NotifyTarget,
        send: Callable[[dict[str, Any]], str],
        say: Callable[[str], None],
    ) -> None:
        self.label = target_label(index, target)
        self.target = target
        self.send = send
        self.say = say
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_LIMIT)
        self.pending: list[str] = []  # the events queued or being sent, by name
        self.lock = threading.Lock()
        self.abandoned = False
        self.thread = threading.Thread(target=self._loop, name=f"notify-{index}", daemon=True)
        self.thread.start()

    def put(self, event: dict[str, Any]) -> None:
        with self.lock:
            try:
                self.queue.put_nowait(event)
            except queue.Full:
                self.say(
                    f"{self.label}: '{event['event']}' not sent: {QUEUE_LIMIT} events "
                    "still wait for this target"
                )
                return
            self.pending.append(str(event["event"]))

    def _loop(self) -> None:
        while (event := self.queue.get()) is not None:
            why: str | None = None
            try:
                self.send(event)
            except NotDelivered as failure:
                why = failure.why
            except Exception as error:  # a notification never ends supervision
                why = repr(error)
            with self.lock:  # said here or by abandon(), never both
                self.pending.remove(str(event["event"]))
                if why is not None and not self.abandoned:
                    self.say(f"{self.label}: '{event['event']}' not delivered: {why}")

    def close(self) -> None:
        with suppress(queue.Full):
            self.queue.put_nowait(None)

    def abandon(self) -> None:
        with self.lock:
            self.abandoned = True
            for name in self.pending:
                self.say(
                    f"{self.label}: '{name}' not delivered: still being tried when "
                    "orchestrate stopped waiting"
                )


class Notifier:
    """Sends events to every target that wants them, in the background."""

    def __init__(
        self,
        targets: Sequence[NotifyTarget],
        base_dir: str,
        say: Callable[[str], None],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.channels = [
            _Channel(i, t, lambda e, t=t: deliver(t, e, base_dir, env), say)  # type: ignore[misc]
            for i, t in enumerate(targets)
        ]

    def emit(self, event: dict[str, Any]) -> None:
        for channel in self.channels:
            if wants(channel.target, event["event"]):
                channel.put(event)

    def close(self, limit: float | None = None) -> None:
        """Wait (a bounded time) for the queued events; say which could not be sent in it."""
        if limit is None:
            longest = max((c.target.timeout for c in self.channels), default=0)
            limit = min(CLOSE_LIMIT, longest * TRIES + sum(BETWEEN_TRIES) + 1)
        deadline = time.monotonic() + limit
        for channel in self.channels:
            channel.close()
        for channel in self.channels:
            channel.thread.join(max(0.0, deadline - time.monotonic()))
            if channel.thread.is_alive():
                channel.abandon()


def send_test(
    targets: Sequence[NotifyTarget], base_dir: str, job: str, environ: Mapping[str, str]
) -> list[Delivery]:
    """`notify --test`: a test event to every target at once; each one's answer, in order."""
    event = run_event(
        TEST_EVENT,
        job=job,
        run_id=None,
        status=None,
        at=time.time(),
        event_id=uuid.uuid4().hex,
        root_cause="a test event from 'orchestrate notify --test'",
    )

    def one(index: int, target: NotifyTarget) -> Delivery:
        label = target_label(index, target)
        try:
            return Delivery(label, True, deliver(target, event, base_dir, environ))
        except NotDelivered as failure:
            return Delivery(label, False, failure.why)

    with ThreadPoolExecutor(max(1, len(targets))) as pool:
        return list(pool.map(one, range(len(targets)), targets))


def missing_notify_secrets(
    targets: Sequence[NotifyTarget], environ: Mapping[str, str], doing: str
) -> None:
    """SecretMissing when a target's secret_env is not set here (`up` checks before starting:
    its detached supervisor inherits this environment)."""
    missing = sorted(
        {t.secret_env for t in targets if t.secret_env and not environ.get(t.secret_env)}
    )
    if missing:
        raise SecretMissing(
            f"notify: secret_env {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            f"not set in this shell's environment, and {doing} signs the notifications with it",
            hint=f"export {' '.join(missing)} here (its value is never written down or sent "
            "to the workers), then run the command again",
        )


# A run's events: built from the supervisor's view, claimed once per run.


class RunEvents:
    """The supervisor's (and `down`'s) events of one run; does nothing without targets."""

    def __init__(
        self,
        store: RunStore,
        record: RunRecord,
        say: Callable[[str], None],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.record = record
        targets = record.inventory.notify
        self.notifier = (
            Notifier(targets, record.inventory.base_dir, lambda m: say(f"notify: {m}"), environ)
            if targets
            else None
        )
        self.status: RunStatus | None = None
        tracking = record.inventory.job.tracking
        self.tracker = RunTrackers.of(tracking, lambda m: say(f"tracking: {m}"), store.root,
                                      self._ending)  # fmt: skip

    def seen(self, status: RunStatus) -> None:
        """A poll's status: the run's first one is its `started`."""
        first = self.status is None
        self.status = status
        if first and not status.restarts:
            self._emit("started", "started")

    def queued(self, reason: str) -> None:
        """`up --queue` waits behind another job (once per run)."""
        self._emit("queued", "queued", reason)

    def failure(
        self, failure: Failure, restart: Restart, gave_up: str | None, hint: str | None
    ) -> None:
        """A failure the supervisor restarts from, or gives up on (`gave_up` says why)."""
        attempt = restart.attempt
        cause = restart.describe()
        if failure.kind is FailureKind.STALLED:
            self._emit("stalled", f"stalled-{attempt}", cause, hint)
        if gave_up:
            self._emit("failed", "failed", f"{cause}; {gave_up}", hint)
        elif failure.kind is FailureKind.PREEMPTED:
            self._emit("preempted", f"preempted-{attempt}", f"{cause}; resubmitting", hint,
                       restart=restart)  # fmt: skip
        else:
            done = len(self.status.restarts) if self.status else 0
            self._emit("restarting", f"restarting-{attempt}", cause, hint, restarts=done + 1,
                       restart=restart)  # fmt: skip

    def restarted_alone(self, line: str, restart: Restart) -> None:
        """A ParameterServerStrategy worker started again by itself (the chief went on): told
        as `restarting`, its line first ("worker w1 restarted (2 of 6), the chief continued")."""
        self._emit("restarting", f"alone-{restart.worker}-{restart.at:.3f}",
                   f"{line}: {restart.describe()}", restart=restart)  # fmt: skip

    def lease_lost(self, lost: str, at: float) -> None:
        """A keeper of the run died and what it held could not be leased again: another job
        may take the run's port or GPUs (once per loss, `at` its first sight)."""
        self._emit("lease_lost", f"lease-lost-{at:.3f}", lost,
                   "stop the run ('orchestrate down') or make sure no other job uses these "
                   "ports and GPUs; 'orchestrate jobs' shows who holds them")  # fmt: skip

    def ended(self, status: RunStatus, stopping: bool) -> None:
        """The run's end as the supervisor sees it (a stop by `down` is `down`'s to tell)."""
        self.status = status
        if status.state is WorkerState.SUCCEEDED:
            self._emit("succeeded", "succeeded")
        elif not stopping:  # all exited 75 on hosts: preempted, and the run ends
            chief = status.workers[0] if status.workers else None
            cause = chief.reason if chief else None
            self._emit("preempted", f"preempted-{status.attempt}", cause)

    def failed(self, error: JobFailed) -> None:
        """Supervision ended in JobFailed (a restart that failed, a lost record)."""
        self._emit("failed", "failed", error.message.splitlines()[0], error.hint)

    def stopped(self) -> None:
        """`down` stopped the run (its status as the supervisor last wrote it); nothing when
        the run had ended already."""
        snapshot = read_snapshot(self.store, self.record.run_id)
        self.status = snapshot.status if snapshot else None
        if self.status is not None and self.status.state in (
            WorkerState.SUCCEEDED,
            WorkerState.FAILED,
        ):
            return
        if any(self._claimed(key) for key in ("succeeded", "failed")):
            return
        self._emit("stopped", "stopped", "stopped by 'orchestrate down'")

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.close()
        if self.tracker is not None:
            self.tracker.close()

    def _emit(
        self,
        name: str,
        key: str,
        cause: str | None = None,
        hint: str | None = None,
        restarts: int | None = None,
        *,
        restart: Restart | None = None,
    ) -> None:
        """Tell the targets and the tracker (job.tracking) of event `name`, once per run."""
        if (self.notifier is None and self.tracker is None) or not self._claim(key):
            return
        log = self.store.dashboard_log_path(self.record.run_id)
        try:
            dashboard = dashboard_address(log.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            dashboard = None
        ended = name in ("succeeded", "failed")
        event = run_event(
            name, job=self.record.job_name, run_id=self.record.run_id, status=self.status,
            at=time.time(), event_id=uuid.uuid4().hex, root_cause=cause, hint=hint,
            restarts=restarts,
            dashboard=dashboard, goodput=self._ending()[1] if ended else None,
        )  # fmt: skip
        if self.notifier is not None:
            self.notifier.emit(event)
        if self.tracker is not None:
            self.tracker.event(key, event, restart)

    def _ending(self) -> tuple[RunRecord, dict[str, Any]]:
        """The run's record as the supervisor last saved it, and its account at its end."""
        try:
            record = self.store.load(self.record.run_id)
        except OrchestrateError:
            record = self.record
        return record, run_account(record, self.status, time.time()).to_json()

    def _claimed(self, key: str) -> bool:
        try:
            text = read_text(self.store.notified_path(self.record.run_id), RECORD_CAP)
        except (OSError, ValueError):
            return False
        return key in text.split()

    def _claim(self, key: str) -> bool:
        """Whether this event of the run is still to be sent (then it no longer is)."""
        if self._claimed(key):
            return False
        path = self.store.notified_path(self.record.run_id)
        try:
            with self.store.open_private(path, append=True) as handle:
                handle.write(f"{key}\n".encode())
        except OSError:
            pass  # a full disk: the event is sent anyway
        return True
