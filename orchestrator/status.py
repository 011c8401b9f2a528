"""Ask every machine of a run about its workers (one round trip per machine) and classify them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.connect import MachineKey, Machines, machine_key
from orchestrator.errors import HostError
from orchestrator.fanout import fan_out
from orchestrator.runstore import Restart, RunRecord, WorkerRecord
from orchestrator.state import WorkerState, classify, overall


@dataclass(frozen=True)
class WorkerStatus:
    name: str
    index: int
    host: str
    state: WorkerState
    reason: str | None
    pid: int | None
    step: int | None
    target_steps: int | None
    loss: float | None
    accuracy: float | None
    checkpoint_step: int | None
    steps_per_sec: float | None
    uptime: float | None
    cpu_percent: float | None
    rss_bytes: int | None
    exit_code: int | None
    finished_at: float | None
    devices: tuple[str, ...]
    log_tail: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "log_tail"}
        data["state"] = self.state.value
        return data


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    job: str
    state: WorkerState
    workers: tuple[WorkerStatus, ...]
    attempt: int = 0
    restarts: tuple[Restart, ...] = ()
    outcome: str | None = None

    def to_json(self) -> dict[str, Any]:
        last = self.restarts[-1] if self.restarts else None
        return {
            "run_id": self.run_id,
            "job": self.job,
            "state": self.state.value,
            "attempt": self.attempt,
            "restarts": len(self.restarts),
            "last_restart": last.__dict__ if last else None,
            "outcome": self.outcome,
            "workers": [w.to_json() for w in self.workers],
        }


def worker_status(
    worker: WorkerRecord, probe: dict[str, Any] | None, now: float, unreachable: str | None = None
) -> WorkerStatus:
    verdict = classify(probe)
    probe = probe or {}
    progress = probe.get("progress") or {}
    exit_record = probe.get("exit") or {}
    usage = probe.get("usage") or {}
    alive = bool(probe.get("alive"))
    started = usage.get("create_time") or exit_record.get("started_at")
    ended = exit_record.get("finished_at") if not alive else None
    uptime = ((ended or now) - started) if started else None
    return WorkerStatus(
        name=worker.name,
        index=worker.index,
        host=worker.host.address,
        state=verdict.state,
        reason=unreachable or verdict.reason,
        pid=probe.get("worker_pid") or worker.pid,
        step=progress.get("step"),
        target_steps=progress.get("target_steps"),
        loss=progress.get("loss"),
        accuracy=progress.get("accuracy"),
        checkpoint_step=progress.get("checkpoint_step"),
        steps_per_sec=progress.get("steps_per_sec"),
        uptime=uptime,
        cpu_percent=usage.get("cpu_percent") if alive else None,
        rss_bytes=usage.get("rss_bytes") if alive else None,
        exit_code=exit_record.get("returncode"),
        finished_at=exit_record.get("finished_at"),
        devices=tuple(progress.get("devices") or ()),
        log_tail=tuple(exit_record.get("log_tail") or ()),
    )


def collect_status(record: RunRecord, machines: Machines) -> RunStatus:
    by_machine: dict[MachineKey, list[WorkerRecord]] = {}
    for worker in record.workers:
        by_machine.setdefault(machine_key(worker.host), []).append(worker)

    def probe(key: MachineKey) -> dict[str, Any]:
        workers = by_machine[key]
        return machines.probe(workers[0].host, [w.run_dir for w in workers])

    answers = fan_out(by_machine, probe)
    statuses = []
    for key, workers in by_machine.items():
        answer = answers[key]
        for worker in workers:
            if isinstance(answer, HostError):
                statuses.append(worker_status(worker, None, 0.0, unreachable=answer.message))
            else:
                statuses.append(
                    worker_status(worker, answer["runs"][worker.run_dir], answer["now"])
                )
    statuses.sort(key=lambda s: s.index)
    return RunStatus(
        run_id=record.run_id,
        job=record.job_name,
        attempt=record.attempt,
        restarts=record.restarts,
        outcome=record.outcome,
        state=overall(s.state for s in statuses),
        workers=tuple(statuses),
    )
