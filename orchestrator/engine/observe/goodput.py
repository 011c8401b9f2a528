"""Goodput: what share of a run's machine time trained the model, and where the rest went. Pure.

Every worker slot's wall time, attempt by attempt, is split into parts that sum to it:

  productive  steps the final model kept (the step loop's time, less saves and evaluations)
  startup     the first attempt's launch to its first step (process, TensorFlow import,
              strategy connect, build and trace: the first step itself is in it)
  checkpoint  the step loop blocked in checkpoint saves (the worker's checkpoint_seconds)
  evaluation  the step loop blocked in evaluations (eval_seconds)
  lost        steps computed and then thrown away: a restart resumed from an earlier
              checkpoint (steps past it, at the attempt's mean step time, and the time after
              the last report up to the crash)
  restart     a failure (or a preemption) to the next attempt's first step: stop, backoff,
              relaunch, start-up again
  stall       a stalled attempt's last report to the supervisor's verdict
  queue       waiting for leases (`up --queue`) and in a scheduler's queue (Slurm PENDING)
  shutdown    the last report to the worker's exit (export, process end)
  unknown     a script that reports no step: its time cannot be split, and is not guessed

`goodput = productive / total`, summed over the training workers (chief and workers: a ps
or an evaluator trains nothing itself; under ParameterServerStrategy the chief alone, the one
that reports steps). A live attempt is accounted up to each worker's last
progress report. A script that reports steps but not its blocked time leaves checkpoint and
evaluation unmeasured (inside productive): the goodput is then at most the figure shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract import STRATEGY_PS
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.model.inventory import ROLE_CHIEF, ROLE_WORKER
from orchestrator.model.records import Attempt, RunRecord, WorkerSpan
from orchestrator.model.vocabulary import AttemptEnd, WorkerState

PARTS = ("productive", "startup", "checkpoint", "evaluation", "lost", "restart", "stall",
         "queue", "shutdown", "unknown")  # fmt: skip
LABELS = {"productive": "training", "startup": "start-up", "checkpoint": "checkpoints",
          "evaluation": "evaluation", "lost": "lost work", "restart": "restart downtime",
          "stall": "stalls", "queue": "queue", "shutdown": "shutdown",
          "unknown": "unknown"}  # fmt: skip
TRAINING_ROLES = (ROLE_CHIEF, ROLE_WORKER)
# How a worker's time in an attempt ended is how the attempt did (Attempt.end), or in the one
# that runs how the worker did, LIVE while it runs.
LIVE = None
# Where the time from a worker's last report to its attempt's end goes, by how it ended.
TAIL: dict[AttemptEnd | str | None, str] = {
    AttemptEnd.FINISHED: "shutdown",
    AttemptEnd.STOPPED: "shutdown",
    AttemptEnd.PREEMPTED: "restart",
    AttemptEnd.STALLED: "stall",
    AttemptEnd.CRASHED: "lost",
    LIVE: "productive",
}


@dataclass(frozen=True)
class Account:
    """Seconds per part (PARTS); `unmeasured`: parts a script did not report (counted in
    productive), so the goodput is an upper bound."""

    seconds: Mapping[str, float] = field(default_factory=dict)
    unmeasured: frozenset[str] = frozenset()

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def part(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    @property
    def goodput(self) -> float | None:
        """productive / total; None with no time, or with time that cannot be split."""
        if self.total <= 0 or self.part("unknown") > 0:
            return None
        return self.part("productive") / self.total

    def __add__(self, other: Account) -> Account:
        names = dict.fromkeys([*self.seconds, *other.seconds])
        return Account({n: self.part(n) + other.part(n) for n in names},
                       self.unmeasured | other.unmeasured)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        total = self.total
        return {
            "goodput": self.goodput,
            "total_seconds": total,
            "seconds": {name: self.part(name) for name in PARTS},
            "shares": {name: self.part(name) / total if total > 0 else None for name in PARTS},
            "unmeasured": sorted(self.unmeasured),
        }


@dataclass(frozen=True)
class RunAccount:
    cluster: Account
    workers: Mapping[str, Account]
    attempts: tuple[Account, ...]
    restarts: int

    def to_json(self) -> dict[str, Any]:
        return {**self.cluster.to_json(), "restarts": self.restarts,
                "workers": {name: a.to_json() for name, a in self.workers.items()},
                "attempts": [a.to_json() for a in self.attempts]}  # fmt: skip


def span_of(worker: WorkerStatus) -> WorkerSpan:
    """A live worker's span, from its status."""
    return WorkerSpan(
        name=worker.name, role=worker.role, started_at=worker.started_at,
        start_step=worker.start_step, first_step_at=worker.first_step_at, step=worker.step,
        reported_at=worker.reported_at, checkpoint_step=worker.checkpoint_step,
        checkpoint_at=worker.checkpoint_at,
        checkpoint_seconds=worker.checkpoint_seconds, eval_seconds=worker.eval_seconds,
        finished_at=worker.finished_at, failed=worker.state is WorkerState.FAILED,
    )  # fmt: skip


def closed(attempt: Attempt, status: RunStatus, end: AttemptEnd, ended_at: float) -> Attempt:
    """The attempt as it ended: its workers' spans from the last status, how and when."""
    spans = tuple(span_of(w) for w in status.workers)
    return Attempt(attempt.number, attempt.launched_at, spans, ended_at, end)


def run_account(record: RunRecord, live: RunStatus | None, now: float) -> RunAccount:
    """The run's account from its record's attempts, the one still running from `live`."""
    attempts = _attempts(record, live)
    # Under ParameterServerStrategy only the chief reports the steps (its workers run closures).
    roles = (ROLE_CHIEF,) if record.inventory.job.strategy == STRATEGY_PS else TRAINING_ROLES
    cells: list[tuple[str, int, Account]] = []
    for index, attempt in enumerate(attempts):
        begin = _failed_at(attempts[index - 1]) if index else attempt.launched_at
        after = attempts[index + 1] if index + 1 < len(attempts) else None
        for span in attempt.workers:
            if span.role not in roles:
                continue
            account = _cell(span, _Frame(
                begin=begin, end=_end(attempt, span, now), how=_how(attempt, span),
                resume=_resume(span, after, _how(attempt, span)), lead="restart" if index else
                "startup", script=record.inventory.job.script is not None,
                scheduled=record.inventory.source_settings is not None))  # fmt: skip
            if index == 0 and record.queue_seconds > 0:
                account += Account({"queue": record.queue_seconds})
            cells.append((span.name, index, account))
    return RunAccount(
        cluster=_sum(a for _, _, a in cells),
        workers={n: _sum(a for name, _, a in cells if name == n) for n in _names(cells)},
        attempts=tuple(_sum(a for _, i, a in cells if i == n) for n in range(len(attempts))),
        restarts=len(record.restarts),
    )


def _attempts(record: RunRecord, live: RunStatus | None) -> list[Attempt]:
    attempts = list(record.attempts)
    if not attempts:  # a record from before goodput: the current attempt, from its start
        attempts = [Attempt(record.attempt, record.created_at)]
    current = attempts[-1]
    if current.end is None:
        spans = tuple(span_of(w) for w in live.workers) if live else current.workers
        attempts[-1] = Attempt(current.number, current.launched_at, spans)
    return attempts


def _names(cells: Sequence[tuple[str, int, Account]]) -> list[str]:
    return list(dict.fromkeys(name for name, _, _ in cells))


def _sum(accounts: Iterable[Account]) -> Account:
    total = Account()
    for account in accounts:
        total += account
    return total


def _failed_at(attempt: Attempt) -> float:
    """When an ended attempt failed: its first failed worker's exit (a crash), else when the
    supervisor saw it end (a stall's verdict, a preemption noticed)."""
    exits = [s.finished_at for s in attempt.workers if s.failed and s.finished_at is not None]
    if attempt.end == AttemptEnd.CRASHED and exits:
        return min(exits)
    return attempt.ended_at if attempt.ended_at is not None else attempt.launched_at


def _how(attempt: Attempt, span: WorkerSpan) -> AttemptEnd | str | None:
    if attempt.end is not None:
        return attempt.end
    if span.finished_at is None:
        return LIVE
    return AttemptEnd.CRASHED if span.failed else AttemptEnd.FINISHED


def _end(attempt: Attempt, span: WorkerSpan, now: float) -> float:
    """Where the worker's time in the attempt ends: the attempt's failure; its own exit once
    it finished; while it runs, its last report (or now, before its first step)."""
    how = _how(attempt, span)
    if (
        how in (AttemptEnd.CRASHED, AttemptEnd.STALLED, AttemptEnd.PREEMPTED)
        and attempt.end is not None
    ):
        return _failed_at(attempt)
    if span.finished_at is not None:
        return span.finished_at
    if how is LIVE:
        return span.reported_at if span.first_step_at is not None and span.reported_at else now
    return attempt.ended_at if attempt.ended_at is not None else now


def _resume(span: WorkerSpan, after: Attempt | None, how: AttemptEnd | str | None) -> int | None:
    """The step the model kept of this attempt's work: the step the next attempt of the slot
    began at; for the run's last attempt all it reached when it finished, else its last
    checkpoint (a run that gave up keeps that); None when nothing says (a script's)."""
    if after is not None:
        nxt = next((s for s in after.workers if s.name == span.name), None)
        if nxt is not None and nxt.start_step is not None:
            return nxt.start_step
        return span.checkpoint_step
    if how in (AttemptEnd.FINISHED, LIVE):
        return span.step
    return span.checkpoint_step


@dataclass(frozen=True)
class _Frame:
    begin: float  # the attempt's launch, or the previous attempt's failure
    end: float
    how: AttemptEnd | str | None  # None: LIVE
    resume: int | None
    lead: str  # what the time before the first step is: startup, or restart
    script: bool
    scheduled: bool  # a scheduler placed the worker: launch to process start is its queue


def _cell(span: WorkerSpan, frame: _Frame) -> Account:
    """One worker's time in one attempt, split into parts that sum to end - begin."""
    begin, end = frame.begin, max(frame.end, frame.begin)
    if span.first_step_at is None:  # never stepped, or stepped without saying when
        stepped = span.step is not None and span.step > (span.start_step or 0)
        silent = (
            frame.script
            and span.step is None
            and frame.how in (AttemptEnd.FINISHED, AttemptEnd.STOPPED, LIVE)
        )
        return Account({"unknown" if stepped or silent else frame.lead: end - begin})
    first = _clamp(span.first_step_at, begin, end)
    last = _clamp(span.reported_at or first, first, end)
    parts = dict.fromkeys(PARTS, 0.0)
    queued = 0.0
    if frame.scheduled and span.started_at is not None:
        queued = _clamp(span.started_at, begin, first) - begin
    parts["queue"] = queued
    parts[frame.lead] = first - begin - queued
    reported = {"checkpoint": span.checkpoint_seconds, "evaluation": span.eval_seconds}
    unmeasured = {name for name, value in reported.items() if value is None}
    body = last - first
    saves, evals = span.checkpoint_seconds or 0.0, span.eval_seconds or 0.0
    scale = min(1.0, body / (saves + evals)) if saves + evals > 0 else 1.0
    parts["checkpoint"], parts["evaluation"] = saves * scale, evals * scale
    stepping = body - parts["checkpoint"] - parts["evaluation"]
    lost = _lost(span, frame.resume, stepping, last - max(first, span.checkpoint_at or first))
    if lost is None:
        unmeasured.add("lost")
        lost = 0.0
    parts["lost"] = lost
    parts["productive"] = stepping - lost
    parts[TAIL[frame.how]] += end - last
    return Account({k: v for k, v in parts.items() if v > 0}, frozenset(unmeasured))


def _lost(span: WorkerSpan, resume: int | None, stepping: float, since: float) -> float | None:
    """The step loop's time spent on steps past `resume`: `since` its checkpoint was reported
    (the usual resume: from the checkpoint the worker reported last), else at the attempt's
    mean step time (its steps after the first, which start-up holds); None when the resume
    is unknown."""
    if span.step is None:
        return 0.0
    start = span.start_step or 0
    if resume is None:
        return None
    if resume >= span.step:  # nothing past what was kept (the last checkpoint, or the end)
        return 0.0
    if resume == span.checkpoint_step and span.checkpoint_at is not None:
        return min(stepping, max(0.0, since))
    counted = span.step - start - 1
    thrown = span.step - max(resume, start + 1)
    if counted <= 0 or thrown <= 0:
        return 0.0
    return min(stepping, stepping * thrown / counted)


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def share(account: Account, name: str) -> float:
    total = account.total
    return account.part(name) / total if total > 0 else 0.0


def summary(account: RunAccount) -> str:
    """One line: "goodput 91 %: start-up 4 %, checkpoints 2 %, lost to 1 restart 3 %"."""
    cluster = account.cluster
    if cluster.total <= 0:
        return "goodput: nothing to account yet"
    goodput = cluster.goodput
    if goodput is None:
        unknown = share(cluster, "unknown")
        return (f"goodput unknown: {_percent(unknown)} of the time is a script's that "
                "reports no step (worker.progress.report(step=...))")  # fmt: skip
    restarts = account.restarts
    lost = cluster.part("lost") + cluster.part("restart")
    pieces = [(LABELS[n], share(cluster, n)) for n in PARTS
              if n not in ("productive", "lost", "restart", "unknown")]  # fmt: skip
    if lost > 0:
        word = "restart" if restarts == 1 else "restarts"
        label = f"lost to {restarts} {word}" if restarts else "lost work"
        pieces.append((label, lost / cluster.total))
    shown = [f"{label} {_percent(value)}" for label, value in
             sorted(pieces, key=lambda p: -p[1]) if value >= 0.005]  # fmt: skip
    bound = "at most " if cluster.unmeasured else ""
    line = f"goodput {bound}{_percent(goodput)}" + (": " + ", ".join(shown) if shown else "")
    if cluster.unmeasured:
        names = ", ".join(LABELS[n] for n in sorted(cluster.unmeasured))
        line += f" ({names} not reported by the script: counted as training)"
    return line


def _percent(value: float) -> str:
    return f"{value * 100:.0f} %" if value >= 0.01 or value == 0 else f"{value * 100:.1f} %"
