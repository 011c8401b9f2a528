"""Supervision: watch a run, and when a worker fails, restart the whole cluster from the latest
checkpoint. In MultiWorkerMirroredStrategy one dead worker stops everyone (the others fail within
seconds or hang), and TensorFlow restarts nothing, so the controller must.

A worker has failed when it exited non-zero, vanished, its host stopped answering, it made no
first step within the job's start_timeout, or its step has not moved for its stall_timeout since.
Then every remaining worker is stopped, the chief's
latest checkpoint is made present on every host, and the cluster starts again with identical
TF_CONFIG, up to max_restarts times, with a doubling backoff: Supervisor._restart says the order
and why. What counts as a failure and
whether it is worth a restart is policy.py's; re-planning around dead hosts is replan.py's; the
locks are locks.py's and `down`/`attach` talk to this loop as control.py says.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from typing import NoReturn

from orchestrator.backends.base import Backend
from orchestrator.engine.observe import rolepolicy
from orchestrator.engine.observe.failures import Failure, early_exit, explain
from orchestrator.engine.observe.goodput import closed
from orchestrator.engine.observe.logs import last_lines
from orchestrator.engine.observe.notify import RunEvents
from orchestrator.engine.observe.snapshot import write_snapshot
from orchestrator.engine.observe.status import RunStatus, collect_status
from orchestrator.engine.store.checkpoints import Mirror
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.hangs import at_stall
from orchestrator.engine.supervision.leasewatch import LeaseWatch
from orchestrator.engine.supervision.policy import (
    HOST_LOCAL_FAILURES,
    StallWatch,
    awaits_cause,
    backoff,
    failed_restarts,
    file_mtime,
    first_failure,
    give_up_message,
    give_up_reason,
    linger_seconds,
    preemption,
    survivors_grace,
    worker_budget_spent,
)
from orchestrator.engine.supervision.replan import plan_cluster
from orchestrator.engine.supervision.sidecar import Sidecar, only
from orchestrator.engine.workers.lifecycle import (
    end_standbys,
    launch_attempt,
    release_leases,
    start_standbys,
    stop_run,
)
from orchestrator.errors import (
    HostErrors,
    JobFailed,
    OrchestrateError,
    RunStateError,
)
from orchestrator.model.inventory import ROLE_EVALUATOR
from orchestrator.model.records import Restart, RunRecord
from orchestrator.model.vocabulary import AttemptEnd, FailureKind, WorkerState

# A standby waits this long past the restart's backoff after its attempt ended for the next one
# to claim it (the stop, a checkpoint's spread, a partition's wait); then it exits by itself.
STANDBY_SLACK = 120.0


class Supervisor:
    def __init__(
        self,
        store: RunStore,
        backend: Backend,
        record: RunRecord,
        *,
        show: Callable[[RunStatus], None] = lambda status: None,
        say: Callable[[str], None] = lambda message: None,
        interval: float = 1.0,
    ) -> None:
        self.store = store
        self.backend = backend
        self.record = record
        self.show = show
        self.say = say
        self.interval = interval
        job = record.inventory.job
        self.watch = StallWatch(job.stall_timeout, job.start_limit)  # start-up has its own
        self.mirror = Mirror(store.mirror_path(record.run_id))
        self._mirrored_step = -1
        self._standbys_for = -1  # the attempt whose slots last got standbys
        self._answered = ""  # the id of the last stop request this supervisor carried out
        self._consequence_seen: float | None = None  # when a peer-lost failure was first seen
        self._status: RunStatus | None = None  # the latest poll's
        self.linger = linger_seconds(record.inventory.job, os.environ)
        self.events = RunEvents(store, record, say)  # notify: targets, told in the background
        # what the hosts' roles ask of the loop
        self.sidecar = Sidecar(backend, say, self.events.restarted_alone)
        self.leasewatch = LeaseWatch(
            backend.leasing, max(interval, 2.0)
        )  # a dead keeper: re-leased

    def run(self) -> RunStatus:
        """Supervise until the run succeeds, is stopped, or fails for good (JobFailed). Once it
        ended, its standbys stay job.linger seconds for the job's next `up` (end_standbys);
        supervision that ends otherwise (Ctrl-C, an error) leaves none behind."""
        ended = False
        try:
            status = self._run()
            ended = True
            # First: a queued neighbour waits for the leases, not for the standbys or the
            # notifications below (they hold none).
            release_leases(self.record.inventory, self.record.run_id, self.backend.leasing)
        except JobFailed as error:
            ended = True
            release_leases(self.record.inventory, self.record.run_id, self.backend.leasing)
            self.events.failed(error)  # unless _restart told it already
            raise
        finally:
            with suppress(OrchestrateError):  # a host not answering: its standbys linger out
                end_standbys(
                    self.record, self.backend.keeper, self.backend, self.linger if ended else 0
                )
            self.events.close()  # a bounded wait for the notifications still queued
        return status

    def _run(self) -> RunStatus:
        while True:
            if not self.store.exists(self.record.run_id):
                raise RunStateError(f"the record of run {self.record.run_id} was removed")
            status = collect_status(self.record, self.backend, self.backend.scheduler)
            self._status = status  # goodput: the attempt's spans as it ends (_close_attempt)
            self.events.seen(status)
            self.show(status)
            write_snapshot(self.store, status)  # the dashboard serves this; no second probe
            stopping = self.store.stop_flag(self.record.run_id).exists()
            if status.state is WorkerState.STOPPED and not stopping:
                preempted = preemption(status) if self.backend.resubmits_preempted else None
                if preempted is not None:
                    self._close_attempt(AttemptEnd.PREEMPTED)
                    self._restart(preempted)
                    continue
            if status.state in (WorkerState.SUCCEEDED, WorkerState.STOPPED):
                ended = (
                    AttemptEnd.FINISHED
                    if status.state is WorkerState.SUCCEEDED
                    else AttemptEnd.STOPPED
                )
                saved = preemption(status) is not None and not stopping  # down --save: a stop
                self._close_attempt(AttemptEnd.PREEMPTED if saved else ended)
                self.events.ended(status, stopping)
                return status
            if stopping:
                # `down` is stopping the run: what ends now is no failure to recover from.
                if status.state.finished:
                    self._close_attempt(AttemptEnd.STOPPED)
                    return status
                if self._stop_as_asked():
                    continue
                self._pause()
                continue
            self._mirror_new_checkpoint(status)
            acted = self.sidecar.act(self.record, status)  # roles: chief done, the evaluator
            if acted is not None:
                self.record = acted
                self.store.save(acted)
                continue
            pairs = [(w.role, w.state) for w in status.workers]
            training = only(status, rolepolicy.training(pairs))
            failure = first_failure(training) or self.watch.check(
                only(status, rolepolicy.watched(pairs)), time.monotonic()
            )
            if failure is not None and self._awaits_cause(failure, training):
                self._pause()  # ends at once when the next exit is recorded
                continue
            self._consequence_seen = None
            if failure is not None:
                done = [w.name for w in status.workers if w.state is WorkerState.SUCCEEDED]
                failure = early_exit(failure, done)
                # At the verdict, before the stop.
                self._close_attempt(AttemptEnd.of_failure(failure.kind))
                self._restart(failure)
            else:
                self._check_leases(status)
                self._start_standbys(status)
                self._pause()

    def _check_leases(self, status: RunStatus) -> None:
        """Never run unleased silently: a dead keeper's port and GPUs are leased again, or
        the loss is said (output, `status`, the `lease_lost` notification) while it lasts."""
        active = {w.name for w in status.workers if not w.state.finished}
        found = self.leasewatch.check(self.record.inventory, self.record.run_id, active,
                                      time.monotonic())  # fmt: skip
        if found is None:
            return
        for line in found.reclaimed:
            self.say(f"warning: lease of {line}")
        lost = "; ".join(found.lost) or None
        if lost == self.record.leases_lost:
            return
        self.record = replace(self.record, leases_lost=lost)
        self.store.save(self.record)
        if lost is not None:
            self.say(f"WARNING: the run is running unleased: {lost}")
            self.events.lease_lost(lost, time.time())
        else:
            self.say("the run's leases are held again")

    def _awaits_cause(self, failure: Failure, training: RunStatus) -> bool:
        """A peer's aborted collective is a consequence: its cause (the peer that died) may be
        recorded a moment later; look again within policy.CAUSE_WINDOW before acting."""
        now = time.monotonic()
        if self._consequence_seen is None:
            self._consequence_seen = now
        return awaits_cause(failure, training, now - self._consequence_seen)

    def _stop_as_asked(self) -> bool:
        """Carry out `down`'s stop request over this supervisor's sessions and answer it; False
        if there is none left to answer (then `down` stops the workers itself)."""
        request = self.store.stop_request(self.record.run_id)
        if request is None or request.id == self._answered:
            return False
        self._answered = request.id
        path = self.store.stop_answer_path(self.record.run_id)
        self.store.write_file(path, json.dumps({"request": request.id}))
        self.say(f"stopping the workers for 'orchestrate down' (grace {request.grace:g} s)")
        try:
            report = stop_run(self.record, self.backend, request.grace)
        except OrchestrateError as error:  # `down` sees no answer once this supervisor lets go
            self.say(f"could not stop the workers: {error.message}")
            raise
        self.store.write_file(path, json.dumps({"request": request.id, **report.to_json()}))
        return True

    def _pause(self) -> None:
        """Wait one interval, or less: a worker that exits ends the wait at once where the
        backend is told (Backend.wait_for_change); `down` touches the stop flag when it starts
        and again once it has stopped the workers; the supervisor then polls at once, sees the
        run stopped and lets go, instead of keeping `down` waiting up to a whole interval."""
        flag = self.store.stop_flag(self.record.run_id)
        seen = file_mtime(flag)
        # One wait for the whole interval (on hosts: one watch per machine, no request per
        # tick); the flag is looked at locally every tick and ends it at once.
        self.backend.wait_for_change(self.record.workers, self.interval,
                                     lambda: file_mtime(flag) != seen)  # fmt: skip

    def _start_standbys(self, status: RunStatus) -> None:
        """Once every worker of the attempt made its first step (so the standbys' imports do not
        slow the attempt's own start), a standby per slot, for the next attempt while a
        restart is left, and for the job's next run when the run's end leaves them lingering."""
        job = self.record.inventory.job
        spent = len(failed_restarts(self.record.restarts))  # as _restart counts them
        if (
            not job.warm
            or self._standbys_for == self.record.attempt
            or (spent >= job.max_restarts and not self.linger)  # none for a restart, nor after
            or not all(w.state is WorkerState.RUNNING and w.stepped for w in status.workers
                       if w.role != ROLE_EVALUATOR)
        ):  # fmt: skip
            return
        self._standbys_for = self.record.attempt
        linger = backoff(job, spent) + STANDBY_SLACK  # past the backoff _restart will wait
        try:
            answers = start_standbys(self.record, self.backend.keeper, self.backend, linger)
        except OrchestrateError as error:  # a secret gone from the environment: cold restarts
            self.say(f"no standbys for a warm restart: {error.message}")
            return
        for name, answer in answers.items():
            if answer not in ("started", "kept"):
                self.say(f"no standby for {name} (its restart will start cold): {answer}")

    def _give_up(
        self, failure: Failure, restart: Restart, why: str, tail: tuple[str, ...], role: str
    ) -> NoReturn:
        """The run's end: its outcome (with the fix, where one is known) saved for `status` and
        the dashboard, and JobFailed naming the root cause."""
        outcome = f"gave up: {restart.describe()}; {why}"
        advice = explain(failure.kind, tail)
        if advice:  # `status` and the dashboard show the outcome: the fix goes with it
            outcome += f". What to do: {advice}"
        self.record = replace(self.record, outcome=outcome)
        self.store.save(self.record)
        raise JobFailed(give_up_message(failure, tail, why, len(self.record.restarts), role),
                        hint="'orchestrate tail' shows every worker's log")  # fmt: skip

    def _restart(self, failure: Failure) -> None:
        """A failed attempt's restart, as one ordered sequence (attempt 0's start is
        engine/start/start.py's). The order, and why:
        1. at a stall, every worker's stacks, kept, before anything is stopped: which worker the
           others wait for becomes the failed one (hangs.at_stall); then the Restart recorded,
           timed when the failure was seen;
        2. the survivors stopped, and the failed worker's log tail read: one that exited wrote
           its whole log, and its survivors block in a collective without it, so they are
           stopped first and its tail read after; a stalled one still writes, so before. The
           standbys and the leases stay: the next attempt takes them;
        3. the verdict: a worker's or the run's restarts spent, or a failure no restart mends,
           ends the run here (told, saved, JobFailed naming the root cause, policy.py);
        4. the backoff, doubling with each restart spent (none after a preemption, which spends
           none); `down` meanwhile ends the restart;
        5. the next attempt numbered and the restart counted, then relaunched: dead hosts
           replaced by spares or dropped, hosts back again taken back (replan.py); a partition
           waited out, no restart spent; the launch (lifecycle.launch_attempt) takes the leases
           again where a keeper died, makes the machines ready (sync, setup), spreads the
           chief's latest checkpoint to every host (or this machine's mirror of it) and starts
           each slot's worker, handed to the slot's standby where one waits (started once the
           last attempt stepped: _start_standbys);
        6. the watches reset for the new attempt.
        """
        failure, restart = self._seen(failure)
        tail = self._stop_survivors(failure)
        self._verdict(failure, restart, tail)
        if not self._backoff(failure, restart):
            return  # `down` asked during the backoff
        self.record = replace(self.record, attempt=self.record.attempt + 1,
                              restarts=(*self.record.restarts, restart))  # fmt: skip
        if self._relaunch(failure, restart):
            self.watch.reset()
            self.sidecar.reset()

    def _seen(self, failure: Failure) -> tuple[Failure, Restart]:
        """Step 1: a stall's stacks (where every worker is, before they are stopped), and the
        Restart that the record will keep."""
        detected = time.time()
        if failure.kind is FailureKind.STALLED:
            failure, kept = at_stall(self.store, self.record, self.backend, failure)
            if kept is not None:
                self.say(f"stacks of every worker at the stall: {kept}")
        restart = Restart(detected, self.record.attempt, failure.worker, failure.reason,
                          failure.step, failure.kind)  # fmt: skip
        return failure, restart

    def _stop_survivors(self, failure: Failure) -> tuple[str, ...]:
        """Step 2: the survivors stopped (standbys and leases kept); the failed worker's log
        tail, read after the stop for a worker that exited, before it for a stalled one."""
        stalled = failure.kind is FailureKind.STALLED
        tail = self._log_tail(failure.worker) if stalled else ()
        grace = survivors_grace(failure, self.record.inventory.job)
        stop_run(self.record, self.backend, grace=grace, standbys=False,
                 by=f"after {failure.worker} ended the attempt")  # fmt: skip
        return tail if stalled else self._log_tail(failure.worker)

    def _verdict(self, failure: Failure, restart: Restart, tail: tuple[str, ...]) -> None:
        """Step 3: the failure told; the run given up (JobFailed) when no restart is left for
        it or none would mend it."""
        job = self.record.inventory.job
        role = next((w.host.role for w in self.record.workers if w.name == failure.worker),
                    "worker")  # fmt: skip
        why = worker_budget_spent(failure, role, self.record.alone, job) or give_up_reason(
            failure, self.record.restarts, job
        )
        self.events.failure(failure, restart, why, explain(failure.kind, tail))
        if why:
            self._give_up(failure, restart, why, tail, role)

    def _backoff(self, failure: Failure, restart: Restart) -> bool:
        """Step 4: said and waited; False when `down` asked meanwhile (no restart then)."""
        job = self.record.inventory.job
        spent = len(failed_restarts(self.record.restarts))
        if failure.kind is FailureKind.PREEMPTED:
            wait = 0.0
            self.say(f"{restart.describe()}; resubmitting from the checkpoint (a preemption "
                     f"spends no restart: {spent}/{job.max_restarts} used)")  # fmt: skip
        else:
            wait = backoff(job, spent)
            self.say(
                f"{restart.describe()}; restarting the cluster "
                f"({spent + 1}/{job.max_restarts}) in {wait:g} s"
            )
        time.sleep(wait)
        return not self.store.stop_flag(self.record.run_id).exists()

    def _relaunch(self, failure: Failure, restart: Restart) -> bool:
        """Step 5: re-planned around dead hosts, a partition waited out, then launched; False
        when `down` asked meanwhile (nothing launched). A restart that cannot be made ends the
        run (JobFailed)."""
        try:
            self._replace_dead_hosts()
            self._wait_until_reachable(failure)
            if self.store.stop_flag(self.record.run_id).exists():
                return False
            self.record = launch_attempt(self.record, self.store, self.backend, self.say)
        except (HostErrors, OrchestrateError) as error:
            raise JobFailed(
                f"the restart after {restart.describe()} failed: {error.message}",
                hint=error.hint,
            ) from error
        return True

    @property
    def last_status(self) -> RunStatus | None:
        """The latest poll's status (the end of `up` accounts the run's goodput with it)."""
        return self._status

    def _close_attempt(self, end: AttemptEnd) -> None:
        """Goodput: keep the ended attempt's spans in the record (its workers' run directories
        are the next attempt's no more), with how it ended."""
        attempts = self.record.attempts
        if self._status is None or not attempts or attempts[-1].end is not None:
            return
        last = closed(attempts[-1], self._status, end, time.time())
        self.record = replace(self.record, attempts=(*attempts[:-1], last))
        self.store.save(self.record)

    def _mirror_new_checkpoint(self, status: RunStatus) -> None:
        """Keep a remote chief's newest checkpoint on this machine too: if its host is lost,
        the run resumes from here."""
        chief = self.record.workers[0]
        step = status.workers[0].checkpoint_step
        if self.backend.reads_in_place(chief.host) or step is None:
            return
        if self.backend.shared_checkpoints:  # a shared filesystem keeps them (Slurm)
            return
        if step <= self._mirrored_step:
            return
        try:
            if self.mirror.update(chief.host, chief.checkpoint_dir, self.backend):
                self.say(f"copied checkpoint at step {step} from {chief.name} to this machine")
            self._mirrored_step = step
        except OrchestrateError as error:
            self.say(f"could not copy {chief.name}'s checkpoint: {error.message}")

    def _replace_dead_hosts(self) -> None:
        """Before a restart: hosts that cannot be reached are replaced by spares, in order; with
        no spare left they are dropped while at least min_hosts remain (TF_CONFIG is rebuilt
        for the survivors); hosts dropped earlier that answer again come back."""
        inventory, dropped = self.record.inventory, list(self.record.dropped)
        dead = self.backend.unreachable([*inventory.hosts, *dropped])
        plan = plan_cluster(inventory, dropped, dead)
        for line in plan.changes:
            self.say(line)
        if plan.problem:
            raise JobFailed(plan.problem, hint=plan.hint)
        new_inventory = replace(inventory, hosts=plan.hosts, spares=plan.spares)
        self.record = replace(self.record, inventory=new_inventory, dropped=plan.dropped)

    def _wait_until_reachable(self, failure: Failure) -> None:
        """A partition between hosts would fail every restart the same way: after a failure
        that may be one, check the hosts' TensorFlow ports from each other first, and wait
        with backoff (no restart spent) until they reach each other or partition_timeout."""
        if failure.kind in HOST_LOCAL_FAILURES:
            return
        job = self.record.inventory.job
        deadline = time.monotonic() + job.partition_timeout
        wait = 2.0
        while True:
            blocked = self.backend.network_problems(self.record.inventory)
            if not blocked:
                return
            details = "; ".join(f"{f.host}: {f.detail}" for f in blocked)
            left = deadline - time.monotonic()
            if left <= 0:
                raise JobFailed(
                    f"the cluster cannot be restarted: the hosts still cannot reach each other "
                    f"after {job.partition_timeout} s: {details}",
                    hint=blocked[0].hint or "check the network between the hosts",
                )
            self.say(f"restart waits for the network: {details}; checking again in {wait:g} s")
            time.sleep(min(wait, left))
            wait = min(wait * 2, 30.0)
            if self.store.stop_flag(self.record.run_id).exists():
                return

    def _log_tail(self, name: str) -> tuple[str, ...]:
        workers = [w for w in self.record.workers if w.name == name]
        try:
            return tuple(line for _, line in last_lines(workers, self.backend, 10))
        except OrchestrateError:
            return ()
