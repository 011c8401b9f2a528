"""The queue (`up --queue`, `job.queue: true`): wait for the leases a run needs instead of
failing on a clash, in the order of arrival on every host (the hosts' lease program keeps the
tickets and decides, hostside/leases.py), then take them.

While it waits, the state directory holds `queued.json` (the run id, job, reason and the
waiting process): `status` shows the run as pending with the reason, `down` withdraws it
(SIGTERM to the waiting process, which removes its tickets on the way out).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from orchestrator.backends.capabilities import Leased, Leases
from orchestrator.boundedread import RECORD_CAP, read_text
from orchestrator.engine.store.runstore import RunStore, atomic_write
from orchestrator.errors import LeaseClash, OrchestrateError
from orchestrator.hostside import leasepolicy as policy
from orchestrator.model.inventory import Inventory
from orchestrator.model.leases import queue_reason

POLL_SECONDS = 2.0  # between two asks of the hosts; a ticket is refreshed each time


class Withdrawn(BaseException):
    """The queued run was withdrawn while it waited (`down`, SIGTERM): nothing started."""


@dataclass(frozen=True)
class Pending:
    """A run waiting in the queue, as `queued.json` of the state directory says."""

    run_id: str
    job: str
    since: float
    reason: str
    pid: int
    starttime: int

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "job": self.job, "state": "pending",
                "since": self.since, "reason": self.reason, "pid": self.pid,
                "starttime": self.starttime}  # fmt: skip


def _pending_path(store: RunStore) -> Path:
    return store.root / "queued.json"


def process_start(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks after boot), None when there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def controller_ticket(arrival: float) -> dict[str, Any]:
    """What a host needs to tell whether this process still waits: its pid and start time,
    the boot id and pid namespace where they mean it."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        boot = pidns = ""
    return {
        policy.ARRIVAL_KEY: arrival,
        policy.PID_KEY: os.getpid(),
        policy.STARTTIME_KEY: process_start(os.getpid()) or 0,
        policy.BOOT_ID_KEY: boot,
        policy.PIDNS_KEY: pidns,
    }


def pending(store: RunStore) -> Pending | None:
    """The run waiting in the queue in this state directory, if its waiting process lives."""
    try:
        data = json.loads(read_text(_pending_path(store), RECORD_CAP))
        entry = Pending(str(data["run_id"]), str(data["job"]), float(data["since"]),
                        str(data["reason"]), int(data["pid"]), int(data["starttime"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return entry if process_start(entry.pid) == entry.starttime else None


def withdraw(store: RunStore, entry: Pending, timeout: float = 30.0) -> bool:
    """`down` of a queued run: its waiting process removes its tickets and ends. Whether it
    did within `timeout`."""
    with suppress(ProcessLookupError):
        os.kill(entry.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_start(entry.pid) != entry.starttime:  # it withdrew its tickets and ended
            return True
        time.sleep(0.1)
    return False


@contextmanager
def _withdrawn_on_sigterm() -> Iterator[None]:
    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise Withdrawn()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_for_leases(
    inventory: Inventory,
    run_id: str,
    leasing: Leases | None,
    store: RunStore,
    on_wait: Callable[[str, float], None],
    *,
    poll: float = POLL_SECONDS,
) -> Leased:
    """Take the run's leases, waiting its turn while another job holds (or an earlier ticket
    waits for) what it needs; `on_wait(reason, since)` after each refused try. Its tickets
    and `queued.json` are gone when this returns or raises (Withdrawn on SIGTERM, Ctrl-C)."""
    arrival = time.time()
    ticket = controller_ticket(arrival)
    path = _pending_path(store)
    try:
        with _withdrawn_on_sigterm():
            while True:
                try:
                    if leasing is None:  # nothing to wait for (Backend.leasing)
                        return Leased(inventory)
                    return leasing.take_leases(inventory, run_id, ticket=ticket)
                except LeaseClash as clash:
                    reason = queue_reason(clash.clashes)
                entry = Pending(run_id, inventory.job.name, arrival, reason, ticket[policy.PID_KEY],
                                ticket[policy.STARTTIME_KEY])  # fmt: skip
                atomic_write(path, json.dumps(entry.to_json()))
                on_wait(reason, arrival)
                time.sleep(poll)
    finally:
        with suppress(OrchestrateError):
            if leasing is not None:
                leasing.withdraw_tickets(inventory, run_id)
        with suppress(OSError):
            path.unlink()
