"""The checks of the hosts' `role:` against the job and the host source, with lines. Pure.

MultiWorkerMirroredStrategy (the default, and every task job) makes worker 0 the chief: a
`role: chief` there is a mistake. `job.strategy: parameter-server` (a ParameterServerStrategy
`script:`, or the built-in loop's ClusterCoordinator for a `task:`) needs exactly one chief, at
least one ps and one worker; its cluster cannot shrink or take a spare (a ps holds variables no
spare has; a lost worker is started again at its own address). `max_worker_restarts` is its
alone. At most one evaluator, which evaluates the chief's checkpoints: it must see the chief's
checkpoint directory. A host source whose hosts cannot carry roles says how it refuses them (its
`RoleRule`: Ansible sources stay all-worker); one that gives roles its own way checks them itself
(its `check_roles`: Slurm's `slurm.roles` counts), and the job's keys of one strategy here.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from orchestrator.config.report import Report, line_of
from orchestrator.config.sources.base import OwnRoles, RoleRule
from orchestrator.contract import STRATEGY_PS
from orchestrator.machines import kinds
from orchestrator.model.inventory import (
    ROLE_CHIEF,
    ROLE_EVALUATOR,
    ROLE_PS,
    ROLE_WORKER,
    Job,
    WorkerSlot,
)
from orchestrator.model.workers import job_dir
from orchestrator.yamlsource import LineMap

Placed = tuple[str, int | None, WorkerSlot]


def check_roles(
    placed: Sequence[Placed],
    spares: Sequence[Placed],
    job: Job,
    document: LineMap,
    report: Report,
    *,
    refused: RoleRule | None = None,
    own: OwnRoles | None = None,
) -> None:
    """Every problem of the roles at once (report.add with the file's lines); `refused`: how
    the inventory's host source refuses roles, if it does; `own`: its own check of the roles it
    gives (instead of the hosts' `role:` checks)."""
    found = document.get("job")
    block: LineMap = found if isinstance(found, LineMap) else LineMap()
    strategy_line = line_of(block, "strategy") if "strategy" in block else block.line
    ps_job = job.strategy == STRATEGY_PS
    if refused is not None:
        if refused.host is not None:  # else its hosts cannot carry a role at all
            for where, line, host in placed:
                if host.role != ROLE_WORKER:
                    report.add(line, f"{where}.role", refused.host.format(role=host.role))
        if ps_job:
            report.add(strategy_line, "job.strategy", refused.strategy)
        if ps_job or refused.host is not None:
            return
    if own is not None:
        _check_job_keys(job, block, report)
        own(placed, job, document, report)
        if ps_job and "min_hosts" in document:
            report.add(line_of(document, "min_hosts"), "min_hosts", "not under "
                       "job.strategy: parameter-server: a lost ps or chief restarts the "
                       "whole cluster")  # fmt: skip
        return
    for where, line, host in spares:
        if host.role != ROLE_WORKER:
            report.add(line, f"{where}.role",
                       f"{host.role}: a spare takes a worker's place; it is a worker")  # fmt: skip
    _check_strategy(placed, job, block, strategy_line, report)
    if ps_job:
        for key in ("spares", "min_hosts"):
            if key in document:
                report.add(line_of(document, key), key, "not under job.strategy: "
                           "parameter-server: a lost ps or chief restarts the whole cluster "
                           "as listed (its ps hold the variables), a lost worker restarts at "
                           "its address")  # fmt: skip
    _check_evaluator(placed, job, report)


def _check_strategy(
    placed: Sequence[Placed], job: Job, block: LineMap, strategy_line: int | None, report: Report
) -> None:
    counts = {role: [p for p in placed if p[2].role == role] for role in
              (ROLE_CHIEF, ROLE_PS, ROLE_WORKER)}  # fmt: skip
    _check_job_keys(job, block, report)
    if job.strategy != STRATEGY_PS:
        for where, line, host in counts[ROLE_CHIEF] + counts[ROLE_PS]:
            report.add(line, f"{where}.role", (
                f"{host.role} needs job.strategy: parameter-server"
                + (f"; under {job.strategy} the first worker is the chief: leave role unset"
                   if host.role == ROLE_CHIEF else "")))  # fmt: skip
        return
    found = ", ".join(f"{len(counts[r])} {r}" for r in counts)
    if len(counts[ROLE_CHIEF]) != 1 or not counts[ROLE_PS] or not counts[ROLE_WORKER]:
        report.add(strategy_line, "job.strategy", f"parameter-server needs exactly one "
                   f"'role: chief', at least one 'role: ps' and one 'role: worker' host; "
                   f"found {found}")  # fmt: skip


def _check_job_keys(job: Job, block: LineMap, report: Report) -> None:
    """The job's keys that belong to one strategy, whatever the host source."""
    if job.strategy != STRATEGY_PS and "max_worker_restarts" in block:
        report.add(line_of(block, "max_worker_restarts"), "job.max_worker_restarts",
                   "applies under job.strategy: parameter-server only (there a lost "
                   "worker restarts by itself); this job restarts the whole cluster: "
                   "max_restarts")  # fmt: skip
    if job.strategy == STRATEGY_PS and job.task is not None and job.steps_per_call > 1:
        report.add(line_of(block, "steps_per_call"), "job.steps_per_call", "not under "
                   "job.strategy: parameter-server: each step is a closure the chief "
                   "schedules on a worker; leave it at 1")  # fmt: skip


def _check_evaluator(placed: Sequence[Placed], job: Job, report: Report) -> None:
    evaluators = [p for p in placed if p[2].role == ROLE_EVALUATOR]
    for where, line, _ in evaluators[1:]:
        report.add(line, f"{where}.role", f"at most one evaluator; {evaluators[0][0]} is one")
    trainers = [p for p in placed if p[2].role != ROLE_EVALUATOR]
    if evaluators and not trainers:
        where, line, _ = evaluators[0]
        report.add(line, f"{where}.role", "an evaluator needs hosts that train")
    if not evaluators or not trainers:
        return
    chief = next((p for p in trainers if p[2].role == ROLE_CHIEF), trainers[0])
    where, line, evaluator = evaluators[0]
    if not same_checkpoints(evaluator, chief[2], job):
        report.add(line, f"{where}.role", (
            f"the evaluator reads the chief's checkpoints, but {chief[2].name}'s are on "
            "another machine or in another directory; put the evaluator on the chief's "
            "machine with the same workdir (or set an absolute job.checkpoint_dir)"))  # fmt: skip


def same_checkpoints(one: WorkerSlot, other: WorkerSlot, job: Job) -> bool:
    """Whether the two hosts' workers see one checkpoint directory: the same machine (or both
    sharing this machine's files) and the same path there."""
    kind_one, kind_other = kinds.kind_of(one), kinds.kind_of(other)
    shared = kind_one.shares_files_with_controller and kind_other.shares_files_with_controller
    if not shared and kind_one.machine_key(one) != kind_other.machine_key(other):
        return False
    path = posixpath.join(job_dir(job, one.workdir), job.checkpoint_dir)
    return path == posixpath.join(job_dir(job, other.workdir), job.checkpoint_dir)


def chief_first(hosts: Sequence[WorkerSlot]) -> tuple[WorkerSlot, ...]:
    """The hosts with the chief first and the evaluator last, the others in file order: the
    first host of a run is its chief everywhere (its checkpoints, its mirror, its export)."""
    rank = {ROLE_CHIEF: 0, ROLE_EVALUATOR: 2}
    return tuple(sorted(hosts, key=lambda host: rank.get(host.role, 1)))
