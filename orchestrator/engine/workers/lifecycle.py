"""Start and stop the workers of a run through the backend."""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.backends.base import Backend
from orchestrator.backends.capabilities import Leases, Lifecycle, Reach, Standbys
from orchestrator.engine.observe.rolepolicy import stop_order
from orchestrator.engine.store.checkpoints import Mirror, spread_latest_checkpoint
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.workers.plan import new_run_id, plan_workers
from orchestrator.engine.workers.secretenv import secret_values
from orchestrator.errors import HostErrors, OrchestrateError
from orchestrator.fanout import GroupResult
from orchestrator.model.answers import BY_DOWN, StopAnswer
from orchestrator.model.inventory import Inventory
from orchestrator.model.records import Attempt, RunRecord, WorkerRecord
from orchestrator.model.workers import Started, WorkerSpec, job_dir_of_run

DEFAULT_GRACE = 10.0
# A standby's own linger until the run's end releases it (end_standbys sets its `until` next).
STANDBY_START_LINGER = 120.0


def start_run(
    inventory: Inventory,
    store: RunStore,
    backend: Backend,
    say: Callable[[str], None] = lambda message: None,
    *,
    force_setup: bool = False,
    prepared: bool = False,
    run_id: str | None = None,
    queue_seconds: float = 0.0,
) -> RunRecord:
    """Record a new run and start its first attempt (`prepared`: hostprep ran already; `run_id`:
    the one first_standbys started the standbys for; `queue_seconds`: `up --queue`'s wait)."""
    record = RunRecord(run_id=run_id or new_run_id(), inventory=inventory, created_at=time.time(),
                       queue_seconds=queue_seconds)  # fmt: skip
    return launch_attempt(record, store, backend, say, force_setup=force_setup, prepared=prepared)


def launch_attempt(
    record: RunRecord,
    store: RunStore,
    backend: Backend,
    say: Callable[[str], None] = lambda message: None,
    *,
    force_setup: bool = False,
    prepared: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> RunRecord:
    """Start every worker of the record's current attempt detached, after syncing and setting
    up the hosts (hostprep) and making the chief's latest checkpoint present on every host; on
    a partial failure stop what started. The values of job.secret_env come from `environ` (this
    process's), before anything starts."""
    secrets = secret_values(record.inventory.job.secret_env, environ, doing="starting the workers")
    # The run's leases (port: auto, gpus: N): kept while its keeper lives, taken again if it
    # died (the same port and GPUs when free); a clash raises LeaseClash naming the holder.
    record = replace(
        record, inventory=take_leases(record.inventory, record.run_id, backend.leasing, say)
    )
    inventory = record.inventory
    workdirs = backend.workdirs(inventory.hosts).raise_if_failed("reaching the hosts")
    if not prepared:
        backend.prepare(inventory, workdirs, say, force_setup=force_setup,
                        spares=record.attempt == 0)  # fmt: skip
    specs = plan_workers(inventory, record.run_id, dict(workdirs), record.attempt, secrets,
                         reads_in_place=backend.reads_in_place)  # fmt: skip
    spread = spread_latest_checkpoint(specs, backend, Mirror(store.mirror_path(record.run_id)))
    if spread.name:
        copied = f"copied to {', '.join(spread.copied_to)}" if spread.copied_to else "on every host"
        size = f"{spread.size_bytes / 2**20:.1f} MiB"
        origin = " (from this machine's copy)" if spread.source == "mirror" else ""
        say(f"resuming from checkpoint {spread.name}{origin} ({size}), {copied}")
    record = replace(record, workers=tuple(_record(spec) for spec in specs), launched=False,
                     attempts=_launched(record.attempts, record.attempt))  # fmt: skip
    store.save(record)  # before launching: a half-started run can still be found and stopped
    started = backend.start(specs)
    for job in dict.fromkeys(s.job_id for s in started.ok.values() if s.job_id is not None):
        record = replace(record, scheduler_jobs=(*record.scheduler_jobs, job))
        say(f"submitted batch job {job}")
    for spec in specs:
        if spec.name in started.ok:
            say(f"started {spec.name} ({spec.host.endpoint})")
    record = replace(record, workers=tuple(_started(w, started.ok) for w in record.workers),
                     launched=True)  # fmt: skip
    store.save(record)
    if started.failed:
        # The started workers would wait forever for the missing peers.
        stop_run(record, backend, grace=2.0, by="after a peer failed to start")
        raise HostErrors(list(started.failed.values()), "starting the workers")
    return record


def start_alone(
    record: RunRecord, lifecycle: Lifecycle, reach: Reach, index: int, alone: int
) -> RunRecord:
    """Start the worker at `index` again by itself (the evaluator, whose failure is not the
    training's; a ParameterServerStrategy worker, whose chief goes on), with the same TF_CONFIG
    and port, in a run directory of its own; the record with its new place."""
    secrets = secret_values(record.inventory.job.secret_env, os.environ, doing="starting it")
    workdirs = lifecycle.workdirs(record.inventory.hosts).raise_if_failed("reaching the hosts")
    specs = plan_workers(record.inventory, record.run_id, dict(workdirs), record.attempt, secrets,
                         reads_in_place=reach.reads_in_place, alone=alone)  # fmt: skip
    spec = specs[index]
    started = lifecycle.start([spec]).raise_if_failed(f"starting {spec.name}")
    workers = list(record.workers)
    workers[index] = _started(_record(spec), started)
    return replace(record, workers=tuple(workers))


def _launched(attempts: tuple[Attempt, ...], number: int) -> tuple[Attempt, ...]:
    """Goodput's record of the attempt's launch (a half-launched one started afresh: again)."""
    return (*(a for a in attempts if a.number != number), Attempt(number, time.time()))


def _started(worker: WorkerRecord, started: Mapping[str, Started]) -> WorkerRecord:
    """The worker with what its start said (nothing, for one that did not start)."""
    answer = started.get(worker.name, Started())
    return replace(worker, pid=answer.pid, job_id=answer.job_id)


def _record(spec: WorkerSpec) -> WorkerRecord:
    return WorkerRecord(
        name=spec.name,
        index=spec.index,
        host=spec.host,
        run_dir=spec.run_dir,
        log_path=spec.log_path,
        checkpoint_dir=spec.checkpoint_dir,
    )


def take_leases(
    inventory: Inventory, run_id: str, leasing: Leases | None, say: Callable[[str], None],
    *, dry_run: bool = False,
) -> Inventory:  # fmt: skip
    """The inventory with the run's leased ports and GPUs; the lease records that were
    ignored (another user's, malformed or hostile) are named."""
    if leasing is None:  # nothing to lease (Backend.leasing): the inventory as written
        return inventory
    leased = leasing.take_leases(inventory, run_id, dry_run=dry_run)
    for ignored in leased.ignored:
        say(f"warning: {ignored.describe()}")
    return leased.inventory


@contextmanager
def held_leases(
    inventory: Inventory, run_id: str, leasing: Leases | None, say: Callable[[str], None]
) -> Iterator[Inventory]:
    """`up`: the run's leases from before its checks (its ports are what they check) through
    its launch; let go again if `up` fails before the run is recorded as started."""
    leased = take_leases(inventory, run_id, leasing, say)
    try:
        yield leased
    except BaseException:
        release_leases(leased, run_id, leasing)
        raise


def release_leases(inventory: Inventory, run_id: str, leasing: Leases | None) -> None:
    """The run ended: its ports and GPUs are free for other jobs. A host that does not answer
    frees them itself once no worker of the run is left there."""
    if leasing is not None:
        with suppress(OrchestrateError):
            leasing.release_leases(inventory, run_id)


@dataclass(frozen=True)
class StopReport:
    outcome: dict[str, str]  # worker name -> stopped | killed | not running | unreachable: ...
    leftovers: dict[str, list[int]]  # worker name -> pids still alive after SIGKILL

    @property
    def unreachable(self) -> list[str]:
        return [name for name, outcome in self.outcome.items() if outcome.startswith("unreachable")]

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "leftovers": self.leftovers}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StopReport:
        return cls({str(k): str(v) for k, v in data["outcome"].items()},
                   {str(k): [int(p) for p in v] for k, v in data["leftovers"].items()})  # fmt: skip


@contextmanager
def first_standbys(
    inventory: Inventory, run_id: str, backend: Backend, linger: float
) -> Iterator[None]:
    """`up` (issue 18, time to first step): the first attempt's standbys, started before the
    checks so that TensorFlow's import overlaps the preflight, the checkpoint's spread and the
    launch, which hands each slot's attempt to its standby (importing or done). Only for a warm
    job, after sync and setup (they may change what a standby would import). Discarded if `up`
    fails before the launch; a standby nobody launched leaves by itself after `linger`."""
    keeper = backend.keeper
    if not inventory.job.warm or keeper is None:
        yield
        return
    workdirs = backend.workdirs(inventory.hosts).raise_if_failed("reaching the hosts")
    specs, _ = _slot_standbys(inventory, run_id, dict(workdirs), 0, keeper=keeper,
                              reach=backend, linger=linger, environ=os.environ)  # fmt: skip
    try:  # a slot without a standby starts cold
        yield
    except BaseException:
        with suppress(OrchestrateError):
            keeper.discard_standbys([_record(spec) for spec in specs])
        raise


def start_standbys(
    record: RunRecord,
    keeper: Standbys | None,
    reach: Reach,
    linger: float,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """A standby for each worker slot of the record's current attempt, with the environment the
    next attempt's worker would get (job.secret_env's values read now, as a launch does); what
    happened per worker, failures included (a slot without a standby just starts cold)."""
    if keeper is None:  # Backend.keeper: this backend keeps none
        return {}  # every attempt starts cold
    workdirs = {w.name: posixpath.dirname(job_dir_of_run(w.run_dir)) for w in record.workers}
    _, answers = _slot_standbys(record.inventory, record.run_id, workdirs, record.attempt,
                                keeper=keeper, reach=reach, linger=linger,
                                environ=environ)  # fmt: skip
    return {**answers.ok, **{name: f"error: {e.message}" for name, e in answers.failed.items()}}


def _slot_standbys(
    inventory: Inventory,
    run_id: str,
    workdirs: Mapping[str, str],
    attempt: int,
    *,
    keeper: Standbys,
    reach: Reach,
    linger: float,
    environ: Mapping[str, str],
) -> tuple[list[WorkerSpec], GroupResult[str, str]]:
    """Start a standby per slot of `attempt`, with the environment its worker would get (a
    backend that keeps them)."""
    secrets = secret_values(inventory.job.secret_env, environ, doing="starting the standbys")
    specs = plan_workers(inventory, run_id, dict(workdirs), attempt, secrets,
                         reads_in_place=reach.reads_in_place)  # fmt: skip
    return specs, keeper.start_standbys(specs, linger)


def end_standbys(
    record: RunRecord,
    keeper: Standbys | None,
    reach: Reach,
    linger: float,
    environ: Mapping[str, str] = os.environ,
) -> GroupResult[str, str]:
    """The run ended (succeeded, failed or stopped): its slots' standbys stay `linger` seconds
    for the job's next `up` on the same hosts (job.linger), or go now (0). A slot without one
    (a run too short for the supervisor to start them) gets one now, importing while the user
    reads the result. A run `down` stopped discarded them already: that holds (the agent
    keeps a discarded run's marker and starts none for it)."""
    if keeper is None:
        return GroupResult()  # none were kept
    if linger > 0 and record.inventory.job.warm:
        with suppress(OrchestrateError):  # a secret gone from the environment: the ones there
            start_standbys(record, keeper, reach, STANDBY_START_LINGER, environ)
        return keeper.linger_standbys(record.workers, linger)
    return keeper.discard_standbys(record.workers)


def stop_run(
    record: RunRecord,
    backend: Backend,
    grace: float = DEFAULT_GRACE,
    *,
    standbys: bool = True,
    by: str = BY_DOWN,
) -> StopReport:
    """SIGTERM every worker's process group, SIGKILL what is left after `grace` seconds; with
    `standbys`, the slots' standbys and the run's leases go too (the run ends; a restart keeps
    them). `by` says who stopped them, in their status. A ParameterServerStrategy chief is
    stopped before its ps and workers (rolepolicy.stop_order)."""
    answers: GroupResult[str, StopAnswer] = GroupResult()
    for group in stop_order([w.host.role for w in record.workers]):
        stopped = backend.stop([record.workers[i] for i in group], grace, by)
        answers = GroupResult({**answers.ok, **stopped.ok}, {**answers.failed, **stopped.failed})
    if standbys:
        if backend.keeper is not None:  # a host not answering: its standby lingers out
            backend.keeper.discard_standbys(record.workers)
        release_leases(record.inventory, record.run_id, backend.leasing)
    outcome: dict[str, str] = {}
    leftovers: dict[str, list[int]] = {}
    for worker in record.workers:
        if worker.name in answers.failed:
            outcome[worker.name] = f"unreachable: {answers.failed[worker.name].message}"
            continue
        answer = answers.ok[worker.name]
        outcome[worker.name] = answer.outcome
        if answer.left:
            leftovers[worker.name] = list(answer.left)
    return StopReport(outcome, leftovers)
