"""How other processes talk to a run's supervisor: `down`'s two-phase stop (a request the live
supervisor carries out over the sessions it holds, else the workers stopped from here) and
`attach`'s watch of a run another process supervises."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Backend
from orchestrator.backends.capabilities import Lifecycle, Scheduler
from orchestrator.boundedread import RECORD_CAP, read_text
from orchestrator.engine.observe.status import RunStatus, collect_status
from orchestrator.engine.store.runstore import RunStore, StopRequest
from orchestrator.engine.supervision.locks import FileLock, SupervisorLock
from orchestrator.engine.workers.lifecycle import StopReport, stop_run
from orchestrator.errors import RecordDamaged
from orchestrator.model.records import RunRecord

WAKE_CHECK = 0.1  # seconds between looks at the stop flag while the supervisor waits


# How long `down` waits for a live supervisor to take its stop request (at most a poll's time
# when it is between polls) before stopping the workers itself; once taken, it waits the grace
# plus the slack for the answer, then LET_GO_TIMEOUT for the supervisor to exit.
PICKUP_TIMEOUT = 3.0


STOP_ANSWER_SLACK = 30.0


LET_GO_TIMEOUT = 15.0


def stop_everything(store: RunStore, backend: Backend, run_id: str | None,
                    grace: float) -> tuple[RunRecord, StopReport]:  # fmt: skip
    """`down`: flag the run so its supervisor starts no new attempt. A live supervisor stops the
    workers itself, over the agent sessions it holds open (no connection, no Python start per
    host: issue 18's down at 64 hosts). Without one, or one that does not take the request
    (busy in a restart's backoff or launch), stop the workers from here, wait for the supervisor
    to let go, and stop the attempt it may have started meanwhile."""
    record = store.load(run_id)
    request = store.request_stop(record.run_id, grace)
    lock = SupervisorLock(store.lock_path(record.run_id))
    if lock.held_elsewhere():
        answer = _supervisor_stopped(store, record.run_id, request, lock)
        if answer is not None:
            return store.load(record.run_id), answer
        store.withdraw_stop_request(record.run_id)
    report = stop_run(record, backend, grace)
    # Touched again: the supervisor, waiting for its next poll, polls now and lets go.
    store.stop_flag(record.run_id).touch()
    lock.wait_released(grace + 15)
    newer = store.load(record.run_id)
    if newer.attempt != record.attempt:
        report = stop_run(newer, backend, grace)
    elif backend.keeper is not None:  # a standby the supervisor started while the stop was
        backend.keeper.discard_standbys(newer.workers)  # on its way
    return newer, report


def stop_unrecorded(store: RunStore, damaged: RecordDamaged, grace: float) -> StopReport:
    """`down` of a run whose record cannot be read: its live supervisor holds the record it
    started with and stops the workers over its own sessions. Without one that answers,
    `damaged` again, saying so: where the workers are is written only in that record."""
    run_id = damaged.run_id
    request = store.request_stop(run_id, grace)  # the flag also keeps a new attempt from starting
    lock = SupervisorLock(store.lock_path(run_id))
    answer = _supervisor_stopped(store, run_id, request, lock) if lock.held_elsewhere() else None
    if answer is None:
        store.withdraw_stop_request(run_id)
        raise RecordDamaged(
            run_id,
            damaged.message + "; no supervisor of the run answered, and only the record says "
            "where its workers are",
            hint="stop the run's workers on their hosts (each runs under a minder in its run "
            "directory)",
        )
    return answer


def _supervisor_stopped(store: RunStore, run_id: str, request: StopRequest,
                        lock: FileLock) -> StopReport | None:  # fmt: skip
    """The live supervisor's answer to `request`, once it has stopped the workers and let go;
    None if it does not take the request within PICKUP_TIMEOUT, or lets go without an answer."""
    path = store.stop_answer_path(run_id)
    deadline = time.monotonic() + PICKUP_TIMEOUT
    taken = False
    while time.monotonic() < deadline:
        answer = _read_answer(path, request)
        if answer is not None and "outcome" in answer:
            lock.wait_released(LET_GO_TIMEOUT)  # its standbys are discarded once it lets go
            return StopReport.from_json(answer)
        if answer is not None and not taken:
            taken = True
            deadline = time.monotonic() + request.grace + STOP_ANSWER_SLACK
        if not lock.held_elsewhere():
            return None  # it ended (or died) without answering: stop from here
        time.sleep(WAKE_CHECK / 2)
    return None


def _read_answer(path: Path, request: StopRequest) -> dict[str, Any] | None:
    try:
        data = json.loads(read_text(path, RECORD_CAP))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("request") == request.id else None


def watch(store: RunStore, lifecycle: Lifecycle, scheduler: Scheduler | None, run_id: str, *,
          show: Callable[[RunStatus], None], interval: float) -> RunStatus:  # fmt: skip
    """Follow a run another process supervises, until it has ended and that process let go."""
    lock = SupervisorLock(store.lock_path(run_id))
    while True:
        final = collect_status(store.load(run_id), lifecycle, scheduler)
        show(final)
        if final.state.finished and not lock.held_elsewhere():
            return final
        time.sleep(interval)
