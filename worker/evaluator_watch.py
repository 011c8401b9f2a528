"""The evaluator's watch loop: which checkpoint to evaluate next, and when to stop. Stdlib only.

`python -m worker.evaluate --watch` (the `evaluator` task beside a training) runs Watch.run: it
polls the chief's checkpoint directory and evaluates the NEWEST checkpoint it has not evaluated
yet. Checkpoints that appeared while it was busy and are older than that newest one are passed
over and counted as skipped (a checkpoint written and pruned by max_to_keep between two looks is
never seen, so not counted). It ends:
- after evaluating a checkpoint whose step is the final step (or past it): Outcome "final";
- on a stop request (SIGTERM): the evaluation under way finishes, then the newest checkpoint not
  evaluated yet, if any, is evaluated, once: Outcome "stopped".
A checkpoint that cannot be read (being written, or pruned while read) is retried at the next poll;
only MAX_FAILURES failures in a row of the same checkpoint, still there, are an error, and the
`fatal` exceptions (checkpoints of the other Keras) are raised at once. A missing directory is
waited for.

The loop is given its reading and evaluating as functions, so every decision here is unit-tested
without TensorFlow (tests/unit/test_evaluator_watch_loop.py).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract import (
    EVALUATED_CHECKPOINT,
    ROLE_EVALUATOR,
    TENSORBOARD_DIR_NAME,
    TF_CONFIG_ENV,
    TF_TASK,
    TF_TYPE,
)

MAX_FAILURES = 3  # reads in a row of one checkpoint that still exists, before giving up
DEFAULT_POLL_SECONDS = 2.0
EVALUATOR_TASK_TYPE = ROLE_EVALUATOR  # TensorFlow's name for the task beside the cluster
EVAL_SUBDIR = "eval"  # the evaluator's TensorBoard run, inside the run's tensorboard directory

_STEP = re.compile(r"-(\d+)$")


class WatchError(RuntimeError):
    """A checkpoint failed MAX_FAILURES times in a row while it stayed in the directory."""


def checkpoint_step(name: str) -> int:
    """ckpt-40 -> 40: CheckpointManager's checkpoint_number, the step it was saved at."""
    match = _STEP.search(name)
    if match is None:
        raise ValueError(f"not a checkpoint name: {name!r}")
    return int(match[1])


@dataclass(frozen=True)
class Choice:
    """The checkpoint to evaluate now (None: nothing new) and how many newer than the last
    evaluated one it passes over."""

    name: str | None
    skipped: int = 0

    @property
    def step(self) -> int | None:
        return None if self.name is None else checkpoint_step(self.name)


def next_checkpoint(available: Sequence[str], evaluated_step: int | None) -> Choice:
    """The newest checkpoint later than evaluated_step, and the count of the others later too."""
    newer = [n for n in available if evaluated_step is None or checkpoint_step(n) > evaluated_step]
    if not newer:
        return Choice(None)
    newest = max(newer, key=checkpoint_step)
    return Choice(newest, skipped=len(newer) - 1)


@dataclass
class Tally:
    """What the watch has done so far: the progress file's evaluator fields."""

    evaluated: int = 0
    skipped: int = 0
    eval_step: int | None = None
    checkpoint: str | None = None
    failures: dict[str, int] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        return {"evaluated": self.evaluated, "skipped": self.skipped, "eval_step": self.eval_step,
                EVALUATED_CHECKPOINT: self.checkpoint}  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    how: str  # "final" or "stopped"
    tally: Tally


class Watch:
    """Evaluates the newest checkpoints of `checkpoint_dir` until the final step or a stop.

    list_checkpoints(dir) names the complete checkpoints there, oldest first (worker.restore's
    available_checkpoints). evaluate(name) restores and evaluates one and returns its metrics
    (a dict); it raises when the checkpoint cannot be read. report(name, step, metrics, tally) is
    called after each evaluation. stop is set by the SIGTERM handler; the loop sleeps on it.
    """

    def __init__(
        self,
        checkpoint_dir: str,
        final_step: int,
        *,
        list_checkpoints: Callable[[str], list[str]],
        evaluate: Callable[[str], Mapping[str, Any]],
        report: Callable[[str, int, Mapping[str, Any], Tally], None],
        log: Callable[[str], None],
        stop: threading.Event,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        max_failures: int = MAX_FAILURES,
        fatal: tuple[type[Exception], ...] = (),
    ) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.final_step = final_step
        self._list = list_checkpoints
        self._evaluate = evaluate
        self._report = report
        self._log = log
        self._stop = stop
        self._poll = poll_seconds
        self._max_failures = max_failures
        self._fatal = fatal  # raised by evaluate: not a read to retry (a Keras mismatch)
        self.tally = Tally()

    def run(self) -> Outcome:
        waiting_said = ""
        while True:
            stopping = self._stop.is_set()  # read before looking: what is there now is evaluated
            choice = next_checkpoint(self._list(self.checkpoint_dir), self.tally.eval_step)
            if choice.name is not None:
                if self._try(choice) and (self._is_final() or stopping):
                    return Outcome("final" if self._is_final() else "stopped", self.tally)
                if self.tally.failures.get(choice.name) is None:
                    continue  # evaluated: look again at once, more may have come meanwhile
                time.sleep(self._poll)  # unreadable: give its writer time, even when stopping
                continue
            elif stopping:
                return Outcome("stopped", self.tally)
            else:
                waiting_said = self._say_waiting(waiting_said)
            self._stop.wait(self._poll)

    def _try(self, choice: Choice) -> bool:
        """Evaluates choice; False (and the failure counted) when the checkpoint is unreadable."""
        assert choice.name is not None and choice.step is not None
        try:
            metrics = self._evaluate(choice.name)
        except self._fatal:
            raise
        except Exception as exc:
            still_there = choice.name in self._list(self.checkpoint_dir)
            count = self.tally.failures.get(choice.name, 0) + 1 if still_there else 0
            self.tally.failures[choice.name] = count
            if count >= self._max_failures:
                raise WatchError(
                    f"checkpoint {choice.name} in {self.checkpoint_dir} could not be evaluated "
                    f"{count} times in a row: {exc}"
                ) from exc
            why = "retrying at the next poll" if still_there else "it is gone (pruned)"
            self._log(f"evaluator: could not read {choice.name} ({exc}); {why}")
            return False
        self.tally.failures.clear()
        self.tally.evaluated += 1
        self.tally.skipped += choice.skipped
        self.tally.eval_step = choice.step
        self.tally.checkpoint = choice.name
        self._report(choice.name, choice.step, metrics, self.tally)
        return True

    def _is_final(self) -> bool:
        return self.tally.eval_step is not None and self.tally.eval_step >= self.final_step

    def _say_waiting(self, said: str) -> str:
        """One log line per thing waited for, not one per poll."""
        if not os.path.isdir(self.checkpoint_dir):
            what = f"evaluator: waiting for the checkpoint directory {self.checkpoint_dir}"
        elif self.tally.eval_step is None:
            what = f"evaluator: waiting for a checkpoint in {self.checkpoint_dir}"
        else:
            what = ""  # between checkpoints: the normal state, nothing to say
        if what and what != said:
            self._log(what)
        return what or said


def tf_config_problem(env: Mapping[str, str]) -> str | None:
    """Why the evaluator refuses this environment's TF_CONFIG, or None.

    Absent, or a task of type "evaluator" (TensorFlow's convention: the evaluator is not in the
    cluster spec, it has a task of its own). Any other task type is a training task: the
    evaluator would be taking that task's place.
    """
    text = env.get(TF_CONFIG_ENV)
    if text is None or not text.strip():
        return None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"TF_CONFIG is not valid JSON ({exc.msg}): {text!r}"
    task = spec.get(TF_TASK) if isinstance(spec, dict) else None
    kind = task.get(TF_TYPE) if isinstance(task, dict) else None
    if kind != EVALUATOR_TASK_TYPE:
        return (
            f"TF_CONFIG names task type {kind!r}; the evaluator runs as the "
            f"{EVALUATOR_TASK_TYPE!r} task (a training task runs python -m worker)"
        )
    return None


def default_tensorboard_dir(checkpoint_dir: str) -> str:
    """The `eval` run inside the training's default tensorboard directory (beside checkpoints/),
    so `orchestrate tensorboard` shows it beside the training's curves."""
    parent = os.path.dirname(os.path.abspath(os.path.expanduser(checkpoint_dir)).rstrip("/"))
    return os.path.join(parent, TENSORBOARD_DIR_NAME, EVAL_SUBDIR)
