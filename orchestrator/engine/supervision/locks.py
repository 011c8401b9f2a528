"""One `up` at a time in a state directory and one supervisor per run (file locks), and what
becomes of a run whose launcher died half-way: stopped, never adopted."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from orchestrator.backends.base import Backend
from orchestrator.backends.registry import open_backend, serves
from orchestrator.engine.observe.status import collect_status
from orchestrator.engine.store.runstore import RunStore, private_dir, writing_state
from orchestrator.engine.supervision.policy import STOP_GRACE
from orchestrator.engine.workers.lifecycle import launch_attempt, stop_run
from orchestrator.errors import (
    RunStateError,
)
from orchestrator.model.records import RunRecord
from orchestrator.model.vocabulary import ACTIVE, WorkerState


class FileLock:
    """An flock on a lock file: released by the kernel when its holder dies."""

    def __init__(self, path: Path, *, in_state_root: bool = False) -> None:
        self.path = path
        self._in_state_root = in_state_root  # the start lock: its folder is the state root
        self._fd: int | None = None

    def acquire(self) -> bool:
        with writing_state(self.path):  # a full or read-only state directory: exit 3, named
            private_dir(self.path.parent, own_link_ok=self._in_state_root)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
            except OSError:
                os.close(fd)
                raise
        self._fd = fd
        return True

    def held_elsewhere(self) -> bool:
        if self.acquire():
            self.release()
            return False
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def wait_released(self, timeout: float) -> bool:
        """Whether the holder let go within `timeout` seconds (the lock is not kept)."""
        deadline = time.monotonic() + timeout
        while self.held_elsewhere():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def wait(self, timeout: float) -> bool:
        """Acquire, waiting up to `timeout` seconds for the holder to let go. A supervisor
        starts with it too: `status` and `attach` learn whether a run is supervised by taking
        its lock for an instant (held_elsewhere), and one starting in that instant must not
        conclude that another holds the run."""
        deadline = time.monotonic() + timeout
        while not self.acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True


SupervisorLock = FileLock  # one per run: `{run_id}.lock`


def wait_held(lock: FileLock, alive: Callable[[], bool], timeout: float) -> bool:
    """Whether another process came to hold `lock` within `timeout` seconds, while `alive()`
    (the process expected to take it) says it is still there."""
    deadline = time.monotonic() + timeout
    while not lock.held_elsewhere():
        if time.monotonic() >= deadline or not alive():
            return False
        time.sleep(0.05)
    return True


START_WAIT = 300.0  # seconds a second `up` waits for the first to finish launching


@contextmanager
def exclusive_start(store: RunStore, say: Callable[[str], None]) -> Iterator[None]:
    """Only one `up` at a time in a state directory, from its check for an active run through
    the launch: two concurrent ones would both pass the check and start one job twice."""
    lock = FileLock(store.start_lock_path(), in_state_root=True)
    if not lock.acquire():
        say("another 'orchestrate up' is starting a run in this state directory; waiting for it")
        if not lock.wait(START_WAIT):
            raise RunStateError(
                f"another 'orchestrate up' has been starting a run in {store.root} for "
                f"{START_WAIT:g} s",
                hint="'orchestrate status' shows what runs; try again when it has started",
            )
    try:
        yield
    finally:
        lock.release()


def interrupted_launch(store: RunStore, record: RunRecord, *, holding_start: bool = False) -> bool:
    """An attempt whose launcher died before every worker started: nobody is launching it
    (the start lock is free, or held by the caller) and nobody supervises it (a supervisor's
    own restart holds its run's lock)."""
    start = FileLock(store.start_lock_path(), in_state_root=True)
    return (
        not record.launched
        and (holding_start or not start.held_elsewhere())
        and not FileLock(store.lock_path(record.run_id)).held_elsewhere()
    )


def stop_interrupted_launch(
    store: RunStore, backend: Backend, record: RunRecord, say: Callable[[str], None]
) -> RunRecord:
    """Stop what a dead launcher had started (the rest would wait forever for the missing
    peers) and mark the attempt as over, so it neither wedges the state directory nor orphans
    a worker. Returns the record as saved."""
    status = collect_status(record, backend, backend.scheduler)
    started = [w.name for w in status.workers if w.state is not WorkerState.PENDING]
    say(
        f"run {record.run_id}: the launch of attempt {record.attempt} was interrupted "
        f"({len(started)} of {len(record.workers)} workers had started); stopping them"
    )
    stop_run(record, backend, grace=STOP_GRACE, by="after its launch was interrupted")
    record = replace(record, launched=True)
    store.save(record)
    return record


def relaunch(
    store: RunStore, backend: Backend, record: RunRecord, say: Callable[[str], None]
) -> RunRecord:
    """A half-launched attempt is not adopted: stopped, and the next attempt started afresh
    (no restart is counted: nothing failed)."""
    record = stop_interrupted_launch(store, backend, record, say)
    return launch_attempt(replace(record, attempt=record.attempt + 1), store, backend, say)


def refuse_if_active(
    store: RunStore, backend: Backend, say: Callable[[str], None] = lambda message: None
) -> None:
    """A second copy of a job would fight the first for its ports and checkpoints. A previous
    run whose launch was interrupted is stopped instead (it can never run). Called by the
    holder of the start lock (exclusive_start)."""
    if store.current_id() is None:
        return
    previous = store.load()
    if interrupted_launch(store, previous, holding_start=True):
        record = stop_interrupted_launch(store, backend, previous, say)
        if not record.outcome:
            store.save(replace(record, outcome="its launch was interrupted; stopped"))
        return
    supervised = is_supervised(store, previous.run_id)
    # The earlier run may live elsewhere (hosts, or a Slurm cluster): ask its own backend,
    # or this one when it serves both (its sessions then serve the launch too).
    if serves(backend, previous.inventory):
        status = collect_status(previous, backend, backend.scheduler)
    else:
        with open_backend(previous.inventory) as own:
            status = collect_status(previous, own, own.scheduler)
    if status.state in ACTIVE or supervised:
        state = status.state.value if status.state in ACTIVE else "being restarted"
        raise RunStateError(
            f"run {previous.run_id} of job '{previous.job_name}' is still {state}",
            hint="watch it with 'orchestrate attach' or 'orchestrate status', "
            "or stop it with 'orchestrate down' before starting another",
        )


def is_supervised(store: RunStore, run_id: str) -> bool:
    """Whether another process supervises this run now: a failed worker it shows is about to
    be restarted, not the run's end."""
    return SupervisorLock(store.lock_path(run_id)).held_elsewhere()


def supervised_run(store: RunStore) -> RunRecord | None:
    """This state directory's latest run while a process supervises it (a live run), else
    None. Cheap: no host is asked."""
    if store.current_id() is None:
        return None
    record = store.load()
    return record if is_supervised(store, record.run_id) else None
