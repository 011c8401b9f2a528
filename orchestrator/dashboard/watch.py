"""One shared poll per watched run, whatever the number of viewers.

A `RunWatch` thread builds the run's dashboard document every interval and pushes it to every
subscriber (a browser's event stream) as one serialized string. Next to a live supervisor it
reads the status snapshot the supervisor writes at each poll, so the hosts are probed once, by the
supervisor; with no supervisor it probes them itself, once per interval for all viewers. The
workers' logs are followed by one `tail -F` per worker (through the same runners `tail -f`
uses), and the chief's progress history is read every few seconds, earlier attempts only once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import psutil

from orchestrator.backends.base import Backend
from orchestrator.backends.registry import open_backend
from orchestrator.boundedread import RECORD_CAP, read_text
from orchestrator.dashboard import model
from orchestrator.dashboard.model import HISTORY_FILE
from orchestrator.engine.observe.snapshot import Snapshot, read_snapshot
from orchestrator.engine.observe.status import RunStatus, collect_status
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.hangs import kept as kept_stacks
from orchestrator.engine.supervision.locks import is_supervised
from orchestrator.engine.trackers.tracking import run_link, tracking_json
from orchestrator.engine.workers.plan import RUN_ID_PATTERN
from orchestrator.errors import HostError, OrchestrateError
from orchestrator.model.inventory import Inventory
from orchestrator.model.leases import LeaseListing
from orchestrator.model.printable import finite
from orchestrator.model.records import RunRecord, WorkerRecord

LOG_BACKLOG = 300  # lines kept per run for a viewer that connects late
HISTORY_EVERY = 3.0  # seconds between reads of the chief's progress history
RUNS_EVERY = 10.0  # seconds between rereads of the earlier runs' records
LEASES_EVERY = 15.0  # seconds between looks at the leases on the run's hosts (one call each)
IDLE_AFTER = 60.0  # a watch nobody looked at for this long stops polling
QUEUE_LIMIT = 500  # events held for a slow viewer before it misses some

Publish = Callable[[str, str], None]


def attempt_dir(run_dir: str, attempt: int) -> str:
    """The same worker's run directory in another attempt (…/attempt-{n}/{worker})."""
    attempt_parent = posixpath.dirname(run_dir)
    root = posixpath.dirname(attempt_parent)
    return posixpath.join(root, f"attempt-{attempt}", posixpath.basename(run_dir))


class LogFollower:
    """`tail -F` on every worker log of one attempt, each line handed to `on_line`."""

    def __init__(
        self,
        workers: tuple[WorkerRecord, ...],
        on_line: Callable[[str, str], None],
        inventory: Inventory | None = None,
    ) -> None:
        self.backend = open_backend(inventory)  # the run's own backend: hosts or Slurm
        self.on_line = on_line
        for worker in workers:
            threading.Thread(target=self._pump, args=(worker,), daemon=True).start()

    def _pump(self, worker: WorkerRecord) -> None:
        try:
            for line in self.backend.follow_log(worker, LOG_BACKLOG):
                self.on_line(worker.name, line)
        except HostError as error:
            self.on_line(worker.name, f"[orchestrate] stopped following: {error.message}")
        except (OSError, ValueError):
            return  # the follower was stopped while reading

    def stop(self) -> None:
        self.backend.close()  # ends every tail; their threads then finish


class RunWatch:
    def __init__(self, store: RunStore, run_id: str, interval: float) -> None:
        self.store = store
        self.run_id = run_id
        self.interval = interval
        self.last_used = time.monotonic()
        self.stopped = threading.Event()
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._subscribers: dict[asyncio.Queue[tuple[str, str]], asyncio.AbstractEventLoop] = {}
        self._document: dict[str, Any] = {}
        self._serialized = ""
        self._logs: deque[dict[str, Any]] = deque(maxlen=LOG_BACKLOG * 4)
        self._log_seq = 0
        self._follower: LogFollower | None = None
        self._following: tuple[Any, ...] = ()
        self._width = 0
        self._indexes: dict[str, int] = {}
        self._history: dict[int, list[dict[str, Any]]] = {}
        self._history_final: set[int] = set()  # attempts read after they ended
        self._history_at = 0.0
        self._runs: list[dict[str, Any]] = []
        self._runs_at = 0.0
        self._leases: dict[str, Any] | None = None
        self._leases_at = 0.0
        self.polls = 0  # how many times the hosts were probed (the benchmark reads it)
        self._thread = threading.Thread(target=self._run, name=f"watch-{run_id}", daemon=True)
        self._thread.start()

    # -- what viewers call (from the event loop) ---------------------------------------------

    def subscribe(self) -> asyncio.Queue[tuple[str, str]]:
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue(QUEUE_LIMIT)
        with self._lock:
            self.last_used = time.monotonic()
            if self._serialized:
                queue.put_nowait(("dashboard", self._serialized))
            backlog = list(self._logs)
            if backlog:
                queue.put_nowait(("log", json.dumps(backlog)))
            self._subscribers[queue] = asyncio.get_running_loop()
        return queue

    def unsubscribe(self, queue: asyncio.Queue[tuple[str, str]]) -> None:
        with self._lock:
            self._subscribers.pop(queue, None)
            self.last_used = time.monotonic()

    def document(self, timeout: float = 60.0) -> dict[str, Any]:
        """The latest document, waiting for the first poll."""
        self.last_used = time.monotonic()
        self.ready.wait(timeout)
        with self._lock:
            return self._document

    def log_lines(self) -> list[dict[str, Any]]:
        self.last_used = time.monotonic()
        self.ready.wait(10)
        with self._lock:
            return list(self._logs)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    # -- the poll thread ---------------------------------------------------------------------

    def _publish(self, event: str, data: str) -> None:
        with self._lock:
            targets = list(self._subscribers.items())
        for queue, loop in targets:
            loop.call_soon_threadsafe(_offer, queue, (event, data))

    def _run(self) -> None:
        try:
            inventory: Inventory | None = self.store.load(self.run_id).inventory
        except OrchestrateError:
            inventory = None  # no such run (yet): the poll below says so
        backend = open_backend(inventory)
        try:
            while not self.stopped.is_set():
                finished = self._safe_tick(backend)
                idle = time.monotonic() - self.last_used > IDLE_AFTER
                if idle and not self.subscribers:
                    break
                # A finished run changes no more; look again now and then (a new `up` resumes).
                self.stopped.wait(max(self.interval, 5.0) if finished else self.interval)
        finally:
            self.stopped.set()
            backend.close()
            if self._follower is not None:
                self._follower.stop()

    def stop(self) -> None:
        self.stopped.set()

    def _safe_tick(self, backend: Backend) -> bool:
        """A tick that cannot end the thread: whatever a run's files hold, viewers get an
        answer (the error) at once instead of waiting for a document that never comes."""
        try:
            return self._tick(backend)
        except Exception as error:  # the poll must outlive any one bad tick
            self._set({"run_id": self.run_id, "error": f"this run's page failed: {error!r}"})
            return False

    def _tick(self, backend: Backend) -> bool:
        try:
            record = self.store.load(self.run_id)
        except OrchestrateError as error:
            self._set({"run_id": self.run_id, "error": error.message})
            return True
        status, source = self._status(record, backend)
        self._follow_logs(record)
        self._read_history(record, backend)
        document = {
            "run_id": record.run_id,
            "job": record.job_name,
            "source": source,
            "status": status.to_json(),
            "workers": [model.worker_view(w) for w in status.workers],
            "timeline": model.timeline(
                record,
                {
                    attempt: sorted(files)
                    for attempt, files in kept_stacks(self.store, record.run_id).items()
                },
            ),
            "root_cause": model.root_cause(record, status),
            "goodput": model.goodput(record, status, time.time()),
            "charts": model.charts(record, self._history),
            "preflight": model.run_preflight(self._read_json(self.store.preflight_path()), record),
            "leases": self._lease_listing(record, backend),
            "tensorboard": self._tensorboard(),
            "mlflow": mlflow_link(record),
            "tracking": tracking_json(record.inventory.job.tracking),  # as `status --json`
            "supervised": is_supervised(self.store, record.run_id),  # as `status --json`
            "runs": [
                {**run, "state": status.state.value} if run["run_id"] == record.run_id else run
                for run in self._earlier_runs()
            ],
            "latest_run_id": self.store.current_id(),
            "created_at": record.created_at,
            "polled_at": time.time(),
        }
        self._set(document)
        return status.state.finished

    def _set(self, document: dict[str, Any]) -> None:
        document = finite(document)  # NaN has no JSON spelling: the browser's parser rejects it
        serialized = json.dumps(document, allow_nan=False)
        with self._lock:
            self._document = document
            self._serialized = serialized
        self.ready.set()
        self._publish("dashboard", serialized)

    def _status(self, record: RunRecord, backend: Backend) -> tuple[RunStatus, str]:
        snapshot = read_snapshot(self.store, record.run_id)
        if snapshot is not None and _fresh(snapshot, self.interval):
            return snapshot.status, "supervisor"
        self.polls += 1
        return collect_status(record, backend, backend.scheduler), "dashboard"

    def _follow_logs(self, record: RunRecord) -> None:
        key = (record.attempt, tuple((w.name, w.log_path) for w in record.workers))
        if key == self._following:
            return
        if self._follower is not None:
            self._follower.stop()
            self._line("", f"[orchestrate] attempt {record.attempt} started")
        self._following = key
        self._width = max((len(w.name) for w in record.workers), default=0)
        self._indexes = {w.name: w.index for w in record.workers}
        self._follower = LogFollower(record.workers, self._line, record.inventory)

    def _line(self, name: str, line: str) -> None:
        index = self._indexes.get(name, -1)
        entry = {
            "seq": self._log_seq,
            "worker": name,
            "prefix": model.log_prefix(name, self._width) if name else "",
            "colour": model.LOG_COLOURS[index % len(model.LOG_COLOURS)] if index >= 0 else "",
            "line": line,
        }
        with self._lock:
            self._log_seq += 1
            self._logs.append(entry)
        self._publish("log", json.dumps([entry]))

    def _read_history(self, record: RunRecord, backend: Backend) -> None:
        now = time.monotonic()
        current = record.attempt
        if now - self._history_at < HISTORY_EVERY and current in self._history:
            return
        self._history_at = now
        chief = record.workers[0]
        for attempt in range(current + 1):
            if attempt in self._history_final:
                continue  # an earlier attempt's history does not change any more
            path = posixpath.join(attempt_dir(chief.run_dir, attempt), HISTORY_FILE)
            try:
                text = backend.read_text(chief.host, path)
            except HostError:
                continue
            self._history[attempt] = model.parse_history(text) if text is not None else []
            if attempt != current:
                self._history_final.add(attempt)

    def _lease_listing(self, record: RunRecord, backend: Backend) -> dict[str, Any] | None:
        """Every job holding leases on the run's hosts (any user), for a run that leases; the
        records come from other users: the page shows them as text only."""
        if not any(h.leases for h in record.inventory.hosts):
            return None
        now = time.monotonic()
        if now - self._leases_at >= LEASES_EVERY or self._leases is None:
            self._leases_at = now
            with contextlib.suppress(OrchestrateError):
                leasing = backend.leasing
                listing = leasing.leases(record.inventory) if leasing else LeaseListing()
                self._leases = listing.to_json()
        return self._leases

    def _read_json(self, path: Any) -> Any:
        try:
            return json.loads(read_text(path, RECORD_CAP))
        except (OSError, ValueError, RecursionError):
            return None

    def _tensorboard(self) -> dict[str, Any] | None:
        served = self._read_json(self.store.tensorboard_path())
        if not isinstance(served, dict) or not web_link(served.get("url")):
            return None  # only an http(s) address becomes a link: never `javascript:`
        pid = served.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or not psutil.pid_exists(pid):
            return None
        return served

    def _earlier_runs(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        if now - self._runs_at < RUNS_EVERY and self._runs:
            return self._runs
        self._runs_at = now
        self._runs = run_summaries(self.store)
        return self._runs


def run_summaries(store: RunStore) -> list[dict[str, Any]]:
    """Every run of the state directory, newest first; one whose record cannot be read is
    listed with why (`unreadable`), so one bad file hides neither the others nor itself."""
    current = store.current_id()
    runs = []
    for run_id in reversed(store.run_ids()):
        try:
            record = store.load(run_id)
        except OrchestrateError as error:
            runs.append(model.unreadable_summary(run_id, error.message, current))
            continue
        runs.append(model.run_summary(record, read_snapshot(store, run_id), current))
    return runs


def mlflow_link(record: RunRecord) -> str | None:
    """The run's MLflow run (job.tracking) on its server, when it has one to link to."""
    tracking = record.inventory.job.tracking
    link = run_link(tracking) if tracking is not None else None
    return link if web_link(link) else None


def web_link(url: object) -> bool:
    """An http(s) address with a host: what may go into a link's href."""
    if not isinstance(url, str) or not url.isprintable() or any(c.isspace() for c in url):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in {"http", "https"} and bool(parts.netloc)


def _offer(queue: asyncio.Queue[tuple[str, str]], item: tuple[str, str]) -> None:
    if not queue.full():  # a viewer that stopped reading misses updates instead of growing
        queue.put_nowait(item)


def _fresh(snapshot: Snapshot, interval: float) -> bool:
    """Written recently by a process that still lives: a live supervisor polls for us."""
    age = time.time() - snapshot.written_at
    return age < max(3 * interval, 5.0) and psutil.pid_exists(snapshot.pid or -1)


class Hub:
    """Every run being watched, one RunWatch each; `pinned` is the run `/` shows (else the
    latest of the state directory)."""

    def __init__(self, store: RunStore, interval: float, pinned: str | None = None) -> None:
        self.store = store
        self.interval = interval
        self.pinned = pinned
        self._watches: dict[str, RunWatch] = {}
        self._lock = threading.Lock()

    def default_run(self) -> str | None:
        return self.pinned or self.store.current_id()

    @staticmethod
    def is_run_id(run_id: str) -> bool:
        return RUN_ID_PATTERN.fullmatch(run_id) is not None

    def exists(self, run_id: str) -> bool:
        """A run of the state directory: a name of the run-id pattern with a record (never
        another file of runs/, such as `x.status`, whose name a bare exists() accepts)."""
        return self.is_run_id(run_id) and self.store.exists(run_id)

    def watch(self, run_id: str) -> RunWatch:
        with self._lock:
            watch = self._watches.get(run_id)
            if watch is None or watch.stopped.is_set():
                watch = self._watches[run_id] = RunWatch(self.store, run_id, self.interval)
            watch.last_used = time.monotonic()
            return watch

    def close(self) -> None:
        with self._lock:
            for watch in self._watches.values():
                watch.stop()
