"""The supervisor's part for the hosts' roles (roles.py decides): once a ParameterServerStrategy
chief exited 0, stop the ps and workers it leaves serving; start a failed evaluator again alone
(its failure is not the training's); once the training succeeded, give the evaluator up to
stall_timeout for the final checkpoint, then SIGTERM it (it evaluates the newest checkpoint it
has not evaluated and exits 0)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.backends.base import Backend
from orchestrator.engine import roles
from orchestrator.engine.lifecycle import start_alone
from orchestrator.engine.state import WorkerState
from orchestrator.engine.status import RunStatus
from orchestrator.errors import OrchestrateError
from orchestrator.model.inventory import ROLE_EVALUATOR
from orchestrator.model.records import RunRecord

STOP_GRACE = 5.0  # a ps or worker of a finished chief: it only serves


@dataclass
class Sidecar:
    backend: Backend
    say: Callable[[str], None]
    restarted: int = 0  # the evaluator's starts alone, this attempt
    _done_at: float | None = None  # when the training was first seen succeeded

    def act(self, record: RunRecord, status: RunStatus) -> RunRecord | None:
        """What the roles ask for now; the record when it did something (None: nothing)."""
        pairs = [(w.role, w.state) for w in status.workers]
        stop = roles.to_stop(pairs)
        if stop:
            names = ", ".join(status.workers[i].name for i in stop)
            self.say(f"the chief finished: stopping {names}")
            self.backend.stop([record.workers[i] for i in stop], STOP_GRACE,
                              roles.STOPPED_AFTER_CHIEF)  # fmt: skip
            return record
        index = roles.evaluator_restart(pairs, self.restarted)
        if index is not None:
            self.restarted += 1
            worker = status.workers[index]
            self.say(f"the evaluator {worker.name} failed ({worker.reason}); starting it again "
                     f"alone ({self.restarted}/{roles.EVALUATOR_RESTARTS})")  # fmt: skip
            try:
                return start_alone(record, self.backend, index, self.restarted)
            except OrchestrateError as error:
                self.say(f"could not start the evaluator again: {error.message}")
                return record
        return self._end_evaluator(record, status)

    def _end_evaluator(self, record: RunRecord, status: RunStatus) -> RunRecord | None:
        training = [w for w in status.workers if w.role != ROLE_EVALUATOR]
        done = roles.run_state((w.role, w.state) for w in training) is WorkerState.SUCCEEDED
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
