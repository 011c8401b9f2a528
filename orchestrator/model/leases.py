"""Leases of ports and GPUs on hosts (hostside/leases.py keeps them): who holds what, a
clash, and the answers of the lease program, parsed once. Pure.

A holder's record was written by any user of the host: the host program validated it, and what
reaches here is parsed again by type (a wrong type reads as absent), never trusted for more
than display.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.hostside import leasepolicy as policy
from orchestrator.model.reading import integer, number, text

DEFAULT_LEASE_DIR = "/var/tmp/orchestrate-leases"
DEFAULT_PORT_RANGE = (20000, 20099)
# A keeper lets go of a run's leases this long after the last worker or supervisor of the run
# left its host: long enough for a restart's backoff and launch, short enough that a dead run
# frees its ports and GPUs soon.
KEEPER_IDLE_SECONDS = 60.0


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in (integer(item) for item in value) if v is not None)


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: from the holder's record on the host."""

    user: str
    job: str
    run_id: str
    controller: str = ""
    since: float = 0.0
    uid: int | None = None

    @classmethod
    def parse(cls, data: Any) -> Holder:
        data = data if isinstance(data, dict) else {}
        return cls(
            user=text(data.get(policy.USER_KEY)) or "?",
            job=text(data.get(policy.JOB_KEY)) or "?",
            run_id=text(data.get(policy.RUN_ID_KEY)) or "?",
            controller=text(data.get(policy.CONTROLLER_KEY)) or "",
            since=number(data.get(policy.SINCE_KEY)) or 0.0,
            uid=integer(data.get(policy.UID_KEY)),
        )

    @property
    def key(self) -> tuple[int | None, str]:
        return (self.uid, self.run_id)


@dataclass(frozen=True)
class Lease:
    """One keeper's leases on one host."""

    host: str
    holder: Holder
    ports: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    shared_gpus: bool = False

    @classmethod
    def parse(cls, host: str, data: Any) -> Lease:
        data = data if isinstance(data, dict) else {}
        return cls(
            host,
            Holder.parse(data),
            _ints(data.get(policy.PORTS_KEY)),
            _ints(data.get(policy.GPUS_KEY)),
            data.get(policy.SHARED_GPUS_KEY) is True,
        )


@dataclass(frozen=True)
class Ignored:
    """A file of a lease directory that was not taken for a lease record, and why."""

    host: str
    file: str
    reason: str
    owner_uid: int | None = None
    owner_name: str | None = None

    @classmethod
    def parse(cls, host: str, data: Any) -> Ignored:
        data = data if isinstance(data, dict) else {}
        return cls(
            host,
            text(data.get(policy.FILE_KEY)) or "?",
            text(data.get(policy.REASON_KEY)) or "?",
            integer(data.get(policy.OWNER_UID_KEY)),
            text(data.get(policy.OWNER_NAME_KEY)),
        )

    def describe(self) -> str:
        owner = ""
        if self.owner_uid is not None:
            named = f" {self.owner_name}" if self.owner_name else ""
            owner = f" (owner uid {self.owner_uid}{named})"
        return (f"{self.host}: ignored {self.file}{owner}: {self.reason}; it blocks nothing, "
                "its owner or an admin may remove it")  # fmt: skip


@dataclass(frozen=True)
class Clash:
    """What one host cannot give a worker: the resources held, and by whom."""

    host: str
    holder: Holder | None  # None: held without a valid record
    ports: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    wanted: str = ""  # "a port of 20000-20099", "2 GPUs of 0,1,2,3"
    queued: bool = False  # not held: an earlier queued run's ticket waits for them
    uids: tuple[int, ...] = ()  # without a record: the uids the holding processes run as

    def describe(self, now: float | None = None) -> str:
        held = _resources(self.ports, self.gpus)
        verb = "is" if len(self.ports) + len(self.gpus) == 1 else "are"
        if self.queued and self.holder is not None:
            h = self.holder
            return (f"{self.host}: {held} {verb} waited for by {h.user}'s job {h.job} "
                    f"(run {h.run_id}), queued since {clock(h.since, now)}")  # fmt: skip
        if self.holder is None:
            who = _recordless(self.uids)
        else:
            h = self.holder
            who = f"{h.user}'s job {h.job} (run {h.run_id}) since {clock(h.since, now)}"
        return f"{self.host}: {held} {verb} held by {who}"


def _recordless(uids: Sequence[int]) -> str:
    """Who holds a resource without a lease record: a live process, never a file."""
    if not uids:
        return "a process without a valid lease record (see the ignored records)"
    owners = ", ".join(f"uid {uid}" for uid in uids)
    return f"a live process of {owners} without a lease record (not orchestrate's job: ask them)"


def _resources(ports: Sequence[int], gpus: Sequence[int]) -> str:
    parts = []
    if ports:
        parts.append(("port " if len(ports) == 1 else "ports ") + ",".join(map(str, ports)))
    if gpus:
        parts.append(("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus)))
    return " and ".join(parts) or "nothing"


def clock(since: float, now: float | None = None) -> str:
    """10:42 today; with the date before that; `?` for a time no clock shows (a host running an
    older lease program may still send one)."""
    try:
        moment = time.localtime(since)
    except (OverflowError, ValueError, OSError):
        return "?"
    today = time.localtime(time.time() if now is None else now)
    if (moment.tm_year, moment.tm_yday) == (today.tm_year, today.tm_yday):
        return time.strftime("%H:%M", moment)
    return time.strftime("%Y-%m-%d %H:%M", moment)


def parse_clashes(host: str, clashes: Any) -> list[Clash]:
    """The lease program's clash answers, one Clash per holder (ports and GPUs merged)."""
    merged: dict[tuple[int | None, str] | None, dict[str, Any]] = {}
    wanted: list[str] = []
    queued: list[Clash] = []
    for entry in clashes if isinstance(clashes, list) else []:
        if not isinstance(entry, dict):
            continue
        if entry.get(policy.KIND_KEY) == "queue":
            for data in entry.get(policy.HOLDERS_KEY) or []:
                queued.append(
                    Clash(
                        host,
                        Holder.parse(data),
                        _sorted(_ints(data.get(policy.PORTS_KEY))),
                        _sorted(_ints(data.get(policy.GPUS_KEY))),
                        queued=True,
                    )
                )
            continue
        kind = "gpus" if entry.get(policy.KIND_KEY) == "gpus" else "ports"
        wanted.append(_wanted(entry, kind))
        for data in entry.get(policy.HOLDERS_KEY) or []:
            holder = Holder.parse(data)
            slot = merged.setdefault(
                holder.key, {"holder": holder, policy.PORTS_KEY: [], policy.GPUS_KEY: []}
            )
            slot[kind] += _ints(data.get(kind) if isinstance(data, dict) else None)
        unknown = entry.get(policy.UNKNOWN_KEY)
        if isinstance(unknown, dict) and unknown.get(kind):
            slot = merged.setdefault(
                None, {"holder": None, policy.PORTS_KEY: [], policy.GPUS_KEY: [], "uids": []}
            )
            slot[kind] += _ints(unknown.get(kind))
            uids = entry.get(policy.UNKNOWN_UIDS_KEY)
            slot["uids"] += _ints(list(uids.values()) if isinstance(uids, dict) else None)
        if not entry.get(policy.HOLDERS_KEY) and not (
            isinstance(unknown, dict) and unknown.get(kind)
        ):
            merged.setdefault(
                None, {"holder": None, policy.PORTS_KEY: [], policy.GPUS_KEY: [], "uids": []}
            )
    what = "; ".join(dict.fromkeys(w for w in wanted if w))
    return queued + [
        Clash(
            host,
            slot["holder"],
            _sorted(slot[policy.PORTS_KEY]),
            _sorted(slot[policy.GPUS_KEY]),
            what,
            uids=_sorted(slot.get("uids", [])),
        )
        for slot in merged.values()
    ]


def queue_reason(clashes: Sequence[Clash], now: float | None = None) -> str:
    """Why a queued run waits, for status: `queued behind bob's job bert (run ...) on gpu-b:
    port 23456, GPUs 0,1` (the holders of what it needs, or the earlier tickets)."""
    parts = []
    for c in clashes:
        what = ", ".join(_resources(c.ports, c.gpus).split(" and ")) if c.ports or c.gpus else ""
        if c.holder is None:
            who = _recordless(c.uids)
        else:
            queued = ", queued earlier" if c.queued else ""
            who = f"{c.holder.user}'s job {c.holder.job} (run {c.holder.run_id}{queued})"
        parts.append(f"{who} on {c.host}" + (f": {what}" if what else ""))
    return "queued behind " + "; ".join(dict.fromkeys(parts)) if parts else "queued"


def _sorted(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(values)))


def _wanted(entry: Mapping[str, Any], kind: str) -> str:
    if kind == "gpus":
        pool = ",".join(map(str, _ints(entry.get(policy.POOL_KEY))))
        wanted = integer(entry.get(policy.WANTED_GPUS_KEY)) or "?"
        return f"{wanted} GPU(s) of the pool {pool or '(empty)'}"
    span = _ints(entry.get(policy.RANGE_KEY))
    if len(span) == 2:
        return f"a port of {span[0]}-{span[1]}"
    return f"port {integer(entry.get(policy.PORT_KEY)) or '?'}"


def clash_message(clashes: Sequence[Clash], now: float | None = None) -> str:
    """`gpu-b: port 23456 and GPUs 0,1 are held by bob's job bert (run ...) since 10:42`."""
    lines = [c.describe(now) for c in clashes]
    wanted = sorted({f"{c.host} needs {c.wanted}" for c in clashes if c.wanted})
    return "; ".join(lines) + (f" ({'; '.join(wanted)})" if wanted else "")


@dataclass(frozen=True)
class Assignment:
    """What a worker got on its host: its port, and its GPUs when it asked for some."""

    port: int
    gpus: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, data: Any) -> Assignment:
        port = integer(data.get(policy.PORT_KEY)) if isinstance(data, dict) else None
        if port is None:
            raise ValueError(f"no port in {data!r}")
        gpus = data.get(policy.GPUS_KEY)
        return cls(port, None if gpus is None else _ints(gpus))


@dataclass(frozen=True)
class Acquired:
    """The lease program's answer to `acquire` on one machine."""

    assigned: Mapping[str, Assignment] = field(default_factory=dict)
    clashes: tuple[Clash, ...] = ()
    ignored: tuple[Ignored, ...] = ()

    @classmethod
    def parse(cls, host: str, data: Mapping[str, Any]) -> Acquired:
        ignored = tuple(Ignored.parse(host, i) for i in data.get(policy.IGNORED_KEY) or [])
        if data.get(policy.CLASHES_KEY):
            return cls(
                clashes=tuple(parse_clashes(host, data[policy.CLASHES_KEY])), ignored=ignored
            )
        assigned = {str(k): Assignment.parse(v) for k, v in data[policy.ASSIGNED_KEY].items()}
        return cls(assigned=assigned, ignored=ignored)


@dataclass(frozen=True)
class JobLeases:
    """`orchestrate jobs`: one run's leases on the hosts asked, any user."""

    holder: Holder
    hosts: Mapping[str, Lease]

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(sorted({p for lease in self.hosts.values() for p in lease.ports}))

    @property
    def gpus(self) -> dict[str, tuple[int, ...]]:
        return {host: lease.gpus for host, lease in self.hosts.items() if lease.gpus}

    def to_json(self) -> dict[str, Any]:
        h = self.holder
        return {
            "user": h.user, "uid": h.uid, "job": h.job, "run_id": h.run_id,
            "controller": h.controller, "since": h.since,
            "hosts": {name: {"ports": list(lease.ports), "gpus": list(lease.gpus),
                             "shared_gpus": lease.shared_gpus}
                      for name, lease in self.hosts.items()},
        }  # fmt: skip


@dataclass(frozen=True)
class Ticket:
    """A queued run's ticket on one host: who waits, since when, for which fixed ports and
    GPUs of which pools."""

    host: str
    holder: Holder  # `since`: its arrival
    ports: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()  # the GPUs of its pools
    count: int = 0  # how many of them it needs

    @classmethod
    def parse(cls, host: str, data: Any) -> Ticket:
        data = data if isinstance(data, dict) else {}
        needs = data.get(policy.NEEDS_KEY) if isinstance(data.get(policy.NEEDS_KEY), dict) else {}
        pools = [p for p in needs.get(policy.POOLS_KEY) or [] if isinstance(p, dict)]
        return cls(
            host,
            Holder.parse({**data, policy.SINCE_KEY: data.get(policy.ARRIVAL_KEY)}),
            _sorted(_ints(needs.get(policy.PORTS_KEY))),
            _sorted(g for p in pools for g in _ints(p.get(policy.GPUS_KEY))),
            sum(integer(p.get(policy.COUNT_KEY)) or 0 for p in pools),
        )


@dataclass(frozen=True)
class QueuedJob:
    """`orchestrate jobs`: one queued run, its tickets by host; its place in the queue."""

    holder: Holder
    hosts: Mapping[str, Ticket]

    def to_json(self) -> dict[str, Any]:
        h = self.holder
        return {
            "user": h.user, "uid": h.uid, "job": h.job, "run_id": h.run_id,
            "controller": h.controller, "since": h.since,
            "hosts": {name: {"ports": list(t.ports), "gpus": list(t.gpus), "count": t.count}
                      for name, t in self.hosts.items()},
        }  # fmt: skip


def queued_by_run(tickets: Iterable[Ticket]) -> tuple[QueuedJob, ...]:
    """One entry per queued run, in the order of the queue (arrival, user, run)."""
    runs: dict[tuple[int | None, str], tuple[Holder, dict[str, Ticket]]] = {}
    for ticket in tickets:
        _, hosts = runs.setdefault(ticket.holder.key, (ticket.holder, {}))
        hosts[ticket.host] = ticket
    jobs = [QueuedJob(holder, hosts) for holder, hosts in runs.values()]
    return tuple(sorted(jobs, key=lambda j: (j.holder.since, j.holder.uid or 0, j.holder.run_id)))


@dataclass(frozen=True)
class LeaseListing:
    """Every lease on the hosts asked, by run; the records ignored; hosts that did not answer;
    the queued runs in their order."""

    jobs: tuple[JobLeases, ...] = ()
    ignored: tuple[Ignored, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    queued: tuple[QueuedJob, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": [job.to_json() for job in self.jobs],
            "queued": [job.to_json() for job in self.queued],
            "ignored": [
                {
                    "host": i.host,
                    "file": i.file,
                    "reason": i.reason,
                    "owner_uid": i.owner_uid,
                    "owner_name": i.owner_name,
                }
                for i in self.ignored
            ],
            "unreachable": dict(self.failed),
        }


def by_run(leases: Iterable[Lease]) -> tuple[JobLeases, ...]:
    """One entry per run (a user's run id), its hosts in the order first seen; oldest first."""
    runs: dict[tuple[int | None, str], tuple[Holder, dict[str, Lease]]] = {}
    for lease in leases:
        holder, hosts = runs.setdefault(lease.holder.key, (lease.holder, {}))
        merged = lease
        if lease.host in hosts:  # two keepers of one run on a host (a spare, a lost lease)
            old = hosts[lease.host]
            merged = Lease(lease.host, holder, _sorted([*old.ports, *lease.ports]),
                           _sorted([*old.gpus, *lease.gpus]),
                           old.shared_gpus or lease.shared_gpus)  # fmt: skip
        hosts[lease.host] = merged
        if lease.holder.since < holder.since:
            runs[lease.holder.key] = (lease.holder, hosts)
    jobs = [JobLeases(holder, hosts) for holder, hosts in runs.values()]
    return tuple(sorted(jobs, key=lambda j: (j.holder.since, j.holder.run_id)))
