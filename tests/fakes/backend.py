"""A Backend whose workers are scripts: each probe of a worker returns its next scripted state.

Like httpx's MockTransport, it implements the real interface (backends.base.Backend), so the
supervisor, status, lifecycle and preflight run unchanged on top of it, without processes,
sockets or sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.backends.base import Backend, Leased, Leases
from orchestrator.backends.hosts.checks import partition_findings, run_preflight
from orchestrator.backends.hosts.leases import CLASH_HINT, resolved
from orchestrator.errors import ConnectError, HostError, LeaseClash
from orchestrator.fanout import GroupResult
from orchestrator.machines.kinds import kind_of
from orchestrator.machines.runner import LineSession
from orchestrator.model.answers import (
    BY_DOWN,
    CheckpointListing,
    FileListing,
    SetAside,
    StackAnswer,
    StopAnswer,
    WorkerProbe,
)
from orchestrator.model.findings import CHECK, Finding, PreflightOptions, PreflightReport
from orchestrator.model.inventory import Inventory, WorkerSlot
from orchestrator.model.leases import (
    Assignment,
    Clash,
    Holder,
    Lease,
    LeaseListing,
    by_run,
    clash_message,
)
from orchestrator.model.records import WorkerRecord
from orchestrator.model.workers import Started, WorkerSpec

# A worker's script: attempt number -> the states its probes return in turn (the last repeats).
Script = Mapping[int, Sequence[Mapping[str, Any]]]


def running(step: int, **progress: Any) -> dict[str, Any]:
    return {"exists": True, "pid": 100, "alive": True, "worker_pid": 101,
            "progress": {"step": step, **progress}}  # fmt: skip


def exited(code: int, step: int | None = None, *, error: str | None = None,
           tail: Sequence[str] = (), finished_at: float = 1.0) -> dict[str, Any]:  # fmt: skip
    return {
        "exists": True, "pid": 100, "alive": False,
        "progress": {"step": step} if step is not None else None,
        "exit": {"returncode": code, "error": error, "log_tail": list(tail),
                 "started_at": 0.0, "finished_at": finished_at},
    }  # fmt: skip


@dataclass
class FakeBackend(Backend, Leases):
    scripts: dict[str, Script] = field(default_factory=dict)  # worker name -> its script
    dead_hosts: dict[str, str] = field(default_factory=dict)  # host name -> why unreachable
    # Preflight: host name -> verb -> the hostprobe answer (JSON shape).
    answers: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    attempt: int = -1
    started: list[list[str]] = field(default_factory=list)  # worker names of each start
    stops: list[list[str]] = field(default_factory=list)
    graces: list[float] = field(default_factory=list)  # the grace of each stop
    stopped_by: list[str] = field(default_factory=list)  # who asked, for each stop
    probes: int = 0
    # Worker name -> the stacks its faulthandler writes (absent: it cannot answer).
    stack_texts: dict[str, str] = field(default_factory=dict)
    stack_requests: list[tuple[list[str], float]] = field(default_factory=list)
    # Leases, as a host's lease program keeps them: (host name, "port"|"gpu", number) -> holder
    # (a Holder of another job, or this fake's runs by run id); taking one held by another
    # run is a clash.
    held: dict[tuple[str, str, int], Holder] = field(default_factory=dict)
    lease_calls: list[tuple[str, str]] = field(default_factory=list)  # (take|dry|release, run)
    _polls: dict[str, int] = field(default_factory=dict)

    @property
    def leasing(self) -> Leases:
        return self

    def take_leases(
        self, inventory: Inventory, run_id: str, *, dry_run: bool = False,
        ticket: Mapping[str, Any] | None = None,
    ) -> Leased:  # fmt: skip
        self.lease_calls.append(("dry" if dry_run else "queue" if ticket else "take", run_id))
        mine = Holder("me", inventory.job.name, run_id, uid=0)
        assigned: dict[str, Assignment] = {}
        clashes: dict[tuple[str, tuple[int | None, str]], tuple[Holder, list[int], list[int]]] = {}
        taken: list[tuple[str, str, int]] = []

        def free(key: tuple[str, str, int]) -> bool:
            holder = self.held.get(key)
            if holder is None or holder.key == mine.key:
                return key not in taken
            _, ports, gpus = clashes.setdefault((key[0], holder.key), (holder, [], []))
            (ports if key[1] == "port" else gpus).append(key[2])
            return False

        for host in inventory.hosts:
            if not host.leases:
                continue
            low, high = host.port_range or (host.port, host.port)
            ports = [p for p in range(low, high + 1) if free((host.name, "port", p))]
            pool = [g for g in host.visible_gpus or () if free((host.name, "gpu", g))]
            want = host.gpus or 0
            keep = [g for g in host.leased_gpus or () if g in pool]
            gpus = (keep + [g for g in pool if g not in keep])[:want]
            if not ports or len(gpus) < want:
                continue
            port = host.port if host.port in ports else ports[0]
            taken += [(host.name, "port", port), *((host.name, "gpu", g) for g in gpus)]
            assigned[host.name] = Assignment(port, tuple(sorted(gpus)) if want else None)
        if clashes and any(h.name not in assigned for h in inventory.hosts if h.leases):
            found = [Clash(host, holder, tuple(ports), tuple(gpus))
                     for (host, _), (holder, ports, gpus) in clashes.items()]  # fmt: skip
            raise LeaseClash(clash_message(found), found, hint=CLASH_HINT)
        if not dry_run:
            self.held.update(dict.fromkeys(taken, mine))
        return Leased(resolved(inventory, assigned))

    def withdraw_tickets(self, inventory: Inventory, run_id: str) -> None:
        self.lease_calls.append(("withdraw", run_id))

    def release_leases(self, inventory: Inventory, run_id: str) -> None:
        self.lease_calls.append(("release", run_id))
        self.held = {k: h for k, h in self.held.items() if h.run_id != run_id}

    def leases(self, inventory: Inventory) -> LeaseListing:
        leases = [Lease(key[0], holder, ports=(key[2],) if key[1] == "port" else (),
                        gpus=(key[2],) if key[1] == "gpu" else ())
                  for key, holder in self.held.items()]  # fmt: skip
        return LeaseListing(by_run(leases))

    def preflight(self, inventory: Inventory, options: PreflightOptions = CHECK) -> PreflightReport:
        """The hosts backend's own rounds, over the scripted hostprobe answers."""
        return run_preflight(inventory, self, probe_timeout=options.probe_timeout,
                             min_free_bytes=options.min_free_bytes)  # fmt: skip

    def workdirs(self, hosts: Sequence[WorkerSlot]) -> GroupResult[str, str]:
        ok = {h.name: f"/home/fake/{h.name}" for h in hosts if h.name not in self.dead_hosts}
        failed = {n: ConnectError(n, why) for n, why in self.dead_hosts.items()
                  if any(h.name == n for h in hosts)}  # fmt: skip
        return GroupResult(ok, failed)

    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, Started]:
        self.attempt += 1
        self._polls.clear()
        self.started.append([spec.name for spec in specs])
        return GroupResult({spec.name: Started(pid=1000 + spec.index) for spec in specs})

    def network_problems(self, inventory: Inventory) -> list[Finding]:
        return partition_findings(inventory, self.preflight)

    def reads_in_place(self, host: WorkerSlot) -> bool:
        return kind_of(host).shares_files_with_controller

    def probe(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, WorkerProbe]:
        self.probes += 1
        ok: dict[str, WorkerProbe] = {}
        failed: dict[str, HostError] = {}
        for worker in workers:
            if worker.host.name in self.dead_hosts:
                failed[worker.name] = ConnectError(worker.name, self.dead_hosts[worker.host.name])
                continue
            states = self.scripts.get(worker.name, {}).get(self.attempt) or [exited(0)]
            poll = self._polls.get(worker.name, 0)
            self._polls[worker.name] = poll + 1
            ok[worker.name] = WorkerProbe.parse(states[min(poll, len(states) - 1)], now=2.0)
        return GroupResult(ok, failed)

    def stop(
        self, workers: Sequence[WorkerRecord], grace: float, by: str = BY_DOWN
    ) -> GroupResult[str, StopAnswer]:
        self.stops.append([w.name for w in workers])
        self.graces.append(grace)
        self.stopped_by.append(by)
        return GroupResult({w.name: StopAnswer("stopped") for w in workers})

    def stacks(
        self, workers: Sequence[WorkerRecord], wait: float, native: bool = False
    ) -> GroupResult[str, StackAnswer]:
        self.stack_requests.append(([w.name for w in workers], wait))
        return GroupResult({
            w.name: StackAnswer(self.stack_texts[w.name]) if w.name in self.stack_texts
            else StackAnswer(error=f"it wrote no stacks within {wait:g} s")
            for w in workers
        })  # fmt: skip

    def log_lines(self, worker: WorkerRecord, lines: int) -> list[str]:
        return [f"{worker.name} log line"]

    def follow_log(self, worker: WorkerRecord, lines: int) -> Iterator[str]:
        yield from self.log_lines(worker, lines)

    def checkpoint(self, host: WorkerSlot, directory: str) -> CheckpointListing:
        return CheckpointListing(directory, None, {})

    def adopt_checkpoint(
        self, host: WorkerSlot, directory: str, name: str, checkpoints: Sequence[str]
    ) -> None:
        raise AssertionError("no checkpoint exists, so none is adopted")

    def set_aside(self, host: WorkerSlot, directory: str, stamp: str) -> SetAside:
        return SetAside(directory, None)  # a fake host keeps no checkpoint to set aside

    def list_files(self, host: WorkerSlot, directory: str) -> FileListing:
        return FileListing(directory, {})

    def read_text(self, host: WorkerSlot, path: str) -> str | None:
        return None

    def download(self, host: WorkerSlot, remote: str, local: str) -> None:
        raise AssertionError("nothing to download from a fake host")

    def upload(self, host: WorkerSlot, files: Sequence[tuple[str, str]]) -> None:
        pass

    def unreachable(self, hosts: Sequence[WorkerSlot]) -> dict[str, str]:
        return {h.name: self.dead_hosts[h.name] for h in hosts if h.name in self.dead_hosts}

    def preflight_session(self, host: WorkerSlot) -> LineSession:  # run_preflight's ProbeSessions
        if host.name in self.dead_hosts:
            raise ConnectError(host.name, self.dead_hosts[host.name])
        scripted = self.answers.get(host.name)
        return scripted_session(
            host.name,
            lambda request: scripted[request["verb"]] if scripted else healthy(request),
        )


GOOD_DIRECTORY = {"path": "/w", "writable": True, "checked": "/w", "free_bytes": 50 << 30}


def healthy(request: Mapping[str, Any]) -> dict[str, Any]:
    """What hostprobe answers on a healthy host: its port free, every peer reachable."""
    if request["verb"] == "inspect":
        from orchestrator import __version__

        packages = {"tensorflow": "2.21.0", "tf-orchestrate": __version__}
        directories = [GOOD_DIRECTORY for _ in request["directories"]]
        return {"python": "3.11.2", "packages": packages, "env": {}, "directories": directories,
                "listener_pid": 4242, "port_error": None, "holder": None}  # fmt: skip
    if request["verb"] == "connect":
        return {"peers": {p["name"]: {"status": "ok"} for p in request["peers"]},
                "token_visible": None}  # fmt: skip
    return {"listener_left": False}


def scripted_session(
    name: str, answer: Callable[[Mapping[str, Any]], Mapping[str, Any]]
) -> LineSession:
    """A LineSession whose program answers each request from `answer` (with the request's id,
    as protocol.serve does)."""
    pending: list[bytes] = []

    class Writer:
        def write(self, data: bytes) -> None:
            request = json.loads(data)
            said = {**answer(request), "id": request.get("id")}
            pending.append(json.dumps(said).encode() + b"\n")

        def flush(self) -> None:
            pass

    return LineSession(name, Writer(), lambda _timeout, _limit: pending.pop(0), lambda: None)  # type: ignore[arg-type]
