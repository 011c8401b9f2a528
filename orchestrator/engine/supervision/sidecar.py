"""The supervisor's part for the hosts' roles (rolepolicy.py and policy.py decide): once a
ParameterServerStrategy chief exited 0, stop the ps and workers it leaves serving; start a failed
ParameterServerStrategy worker again by itself while the chief and the ps go on (its own budget,
job.max_worker_restarts, kept in the run's record); start a failed evaluator again alone
(its failure is not the training's); once the training succeeded, give the evaluator up to
stall_timeout for the final checkpoint, then SIGTERM it (it evaluates the newest checkpoint it
has not evaluated and exits 0)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from orchestrator.backends.base import Backend
from orchestrator.engine.observe import rolepolicy
from orchestrator.engine.observe.status import RunStatus
from orchestrator.engine.supervision.policy import worker_failure, worker_restart
from orchestrator.engine.workers.lifecycle import start_alone
from orchestrator.errors import OrchestrateError
from orchestrator.model.inventory import ROLE_EVALUATOR
from orchestrator.model.records import Restart, RunRecord, alone_counts, restarted_alone
from orchestrator.model.vocabulary import WorkerState

STOP_GRACE = 5.0  # a ps or worker of a finished chief: it only serves


def _no_event(line: str, restart: Restart) -> None:
    pass


@dataclass
class Sidecar:
    backend: Backend
    say: Callable[[str], None]
    # Told of each worker restarted by itself (the notify targets): its line and why.
    told: Callable[[str, Restart], None] = _no_event
    restarted: int = 0  # the evaluator's starts alone, this attempt
    # The evaluator's restarts in place already said (the workers' are in the record).
    _seen: set[tuple[str, float]] = field(default_factory=set)
    _done_at: float | None = None  # when the training was first seen succeeded

    def act(self, record: RunRecord, status: RunStatus) -> RunRecord | None:
        """What the roles ask for now; the record when it did something (None: nothing)."""
        mirrored = self._mirror_in_place(record, status)
        acted = self._act(mirrored or record, status)
        return acted or mirrored

    def _mirror_in_place(self, record: RunRecord, status: RunStatus) -> RunRecord | None:
        """The restarts in place that workers' launchers made since the last poll (Slurm),
        told and recorded as the supervisor's own restarts alone are: a worker's spend its
        job.max_worker_restarts in the record; the evaluator's are said. None: none new."""
        known = {(r.worker, r.at) for r in record.alone} | self._seen
        new = [r for w in status.workers for r in w.restarted if (r.worker, r.at) not in known]
        if not new:
            return None
        roles_of = {w.name: w.role for w in status.workers}
        for restart in sorted(new, key=lambda r: r.at):
            if roles_of[restart.worker] == ROLE_EVALUATOR:
                self._seen.add((restart.worker, restart.at))
                count = sum(1 for name, _ in self._seen if name == restart.worker)
                self.say(f"the evaluator {restart.worker} failed ({restart.reason}); its "
                         f"launcher started it again in place ({count})")  # fmt: skip
                continue
            record, _ = self._record_alone(record, restart)
        return record

    def _record_alone(self, record: RunRecord, restart: Restart) -> tuple[RunRecord, int]:
        """A worker's restart by itself, spent from its budget in the record, said and told;
        the record, and which of the worker's restarts it is."""
        record = replace(record, alone=(*record.alone, restart))
        number = alone_counts(record.alone)[restart.worker]
        line = restarted_alone(restart.worker, number, record.inventory.job.max_worker_restarts)
        self.say(f"{line}: {restart.describe()}")
        self.told(line, restart)
        return record, number

    def _act(self, record: RunRecord, status: RunStatus) -> RunRecord | None:
        pairs = [(w.role, w.state) for w in status.workers]
        stop = rolepolicy.to_stop(pairs)
        if stop:
            names = ", ".join(status.workers[i].name for i in stop)
            self.say(f"the chief finished: stopping {names}")
            self.backend.stop([record.workers[i] for i in stop], STOP_GRACE,
                              rolepolicy.STOPPED_AFTER_CHIEF)  # fmt: skip
            return record
        if self.backend.restarts_in_place:  # the launchers restart, _mirror_in_place tells
            return self._end_evaluator(record, status)
        index = worker_restart(status, record.alone, record.inventory.job)
        if index is not None:
            return self._restart_worker(record, status, index)
        index = rolepolicy.evaluator_restart(pairs, self.restarted)
        if index is not None:
            self.restarted += 1
            worker = status.workers[index]
            self.say(f"the evaluator {worker.name} failed ({worker.reason}); starting it again "
                     f"alone ({self.restarted}/{rolepolicy.EVALUATOR_RESTARTS})")  # fmt: skip
            try:
                return start_alone(record, self.backend, self.backend, index, self.restarted)
            except OrchestrateError as error:
                self.say(f"could not start the evaluator again: {error.message}")
                return record
        return self._end_evaluator(record, status)

    def _restart_worker(self, record: RunRecord, status: RunStatus, index: int) -> RunRecord:
        """Start the failed worker at `index` again by itself, at its address; the record
        counts the restart whether or not the start worked (a start that failed is tried
        again at the next poll, while the budget lasts)."""
        worker = status.workers[index]
        failure = worker_failure(worker)
        restart = Restart(time.time(), record.attempt, worker.name, failure.reason, worker.step,
                          failure.kind)  # fmt: skip
        record, number = self._record_alone(record, restart)
        try:
            return start_alone(record, self.backend, self.backend, index, number)
        except OrchestrateError as error:
            self.say(f"could not start {worker.name} again: {error.message}")
            return record

    def _end_evaluator(self, record: RunRecord, status: RunStatus) -> RunRecord | None:
        training = [w for w in status.workers if w.role != ROLE_EVALUATOR]
        done = rolepolicy.run_state((w.role, w.state) for w in training) is WorkerState.SUCCEEDED
        waiting = [i for i, w in enumerate(status.workers)
                   if w.role == ROLE_EVALUATOR and not w.state.finished]  # fmt: skip
        if not done or not waiting:
            return None
        now = time.monotonic()
        if self._done_at is None:
            self._done_at = now
        timeout = record.inventory.job.stall_timeout
        if now - self._done_at < timeout:
            return None
        self.say(f"the training finished {timeout} s ago: stopping the evaluator (it evaluates "
                 "the newest checkpoint first)")  # fmt: skip
        self.backend.stop([record.workers[i] for i in waiting], float(timeout),
                          "after the training finished")  # fmt: skip
        self._done_at = float("inf")  # asked once
        return record

    def reset(self) -> None:
        """A new attempt: its evaluator has every restart again."""
        self.restarted, self._done_at = 0, None


def only(status: RunStatus, positions: list[int]) -> RunStatus:
    """The status with only the workers at `positions` (what failures and stalls look at)."""
    return replace(status, workers=tuple(status.workers[i] for i in positions))
