"""The loop of steps, the same under every strategy: logs, summaries, progress, checkpoints,
evaluations and preemption checks at the end of the step calls that reach them.

It imports no TensorFlow: the step, the window, the saver, the evaluator and the stop vote are
handed to it (worker.mirrored and worker.parameter_server build them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.contract import (
    ACCURACY,
    CHECKPOINT_SECONDS,
    EVAL_SECONDS,
    LOSS,
    RUN_DIR_ENV,
    STEP_CALL_SECONDS,
    STEP_SECONDS,
    STEP_TIMING_ENV,
    STEPS_PER_SEC,
    STOP_REQUEST_FILE,
    VAL_ACCURACY,
    VAL_LOSS,
)
from worker.config import WorkerConfig
from worker.output import log
from worker.preemption import Preempted, Preemption
from worker.progress import ProgressWriter
from worker.schedule import call_end

if TYPE_CHECKING:
    from worker.saver import CheckpointSaver
    from worker.sharded_eval import EvalResult, Evaluator
    from worker.summaries import ProfileWindow, Summaries
    from worker.window import Window


class Loop:
    """Runs the steps from start_step to config.steps with logs, summaries, progress, checkpoints
    and evaluations (every config.eval_every steps and after the last one, with an evaluator).

    The host waits for the device only where it must read a value: after the first step (to log
    it), on log steps, on evaluations, on preemption checks, on checkpoint saves and at the end
    of a profiled window. Raises Preempted once a SIGTERM has been agreed on and the checkpoint
    saved.
    """

    def __init__(
        self,
        *,
        config: WorkerConfig,
        train_step: Callable[[Any, int], None],
        window: Window,
        saver: CheckpointSaver,
        summaries: Summaries,
        profile: ProfileWindow,
        learning_rate: Callable[[], float | None],
        progress: ProgressWriter,
        with_accuracy: bool,
        preemption: Preemption,
        evaluator: Evaluator | None = None,
    ) -> None:
        self.config = config
        self.evaluator = evaluator
        self.train_step = train_step
        self.window = window
        self.saver = saver
        self.summaries = summaries
        self.profile = profile
        self.learning_rate = learning_rate
        self.progress = progress
        self.with_accuracy = with_accuracy
        self.preemption = preemption
        saver.on_written = self._written  # checkpoint_step, once the checkpoint is on disk
        self._mark = (0, 0.0)  # (step, time) at which the current rate window started
        # Seconds spent inside the step calls since the window started (None: not timed).
        self._in_calls: float | None = 0.0 if timing_enabled() else None

    def run(self, iterator: Any, start_step: int) -> int:
        steps = self.config.steps
        step = start_step
        while step < steps:
            # Every host-side action below happens at the end of a call: call_end stops a call
            # at each step where one is due, so the checks below see the same steps as with K=1.
            last = self._call_end(step, start_step)
            self.profile.before_step(step + 1)
            self.preemption.before_step()
            if self._in_calls is None:
                self.train_step(iterator, last - step)
            else:
                called = time.perf_counter()
                self.train_step(iterator, last - step)
                self._in_calls += time.perf_counter() - called
            step = last
            if step == start_step + 1:
                self.window.steps.numpy()  # wait for the step: the first one traces and connects
                log("worker: first step done")
                self.progress.write(step=step)  # the supervisor starts standbys only after it
                self._restart_window(step)
            if self.profile.ends_at(step):
                self.window.steps.numpy()  # the trace must contain the step's ops, so wait
                self.profile.export(step)
            if step % self.config.log_every == 0 or step == steps:
                self._log(step)
            if step % self.config.checkpoint_every == 0 or step == steps:
                self._save(step, wait=step == steps)  # the last one is on disk before the exit
            # After the save: an evaluation that fails loses no training.
            if self._evaluates_at(step):
                self._evaluate(step)
            # The last step ends the run anyway, with its checkpoint and exit 0.
            if step < steps and self.preemption.agreed_at(step):
                self._stop(step)
        self.summaries.close()
        self.saver.close()
        self.progress.write(step=steps)
        log(f"worker: finished at step {steps}")
        return steps

    def _save(self, step: int, *, wait: bool) -> None:
        """A checkpoint, its blocked seconds added to the progress file's (goodput)."""
        started = time.perf_counter()
        self.saver.save(step, wait=wait)
        blocked = time.perf_counter() - started
        log(f"worker: saved checkpoint at step {step} (blocked {blocked:.3f} s)")
        self.progress.add_seconds(CHECKPOINT_SECONDS, blocked, step=step)

    def _written(self, step: int) -> None:
        self.progress.write(checkpoint_step=step)

    def _call_end(self, step: int, start_step: int) -> int:
        config = self.config
        stops = (start_step + 1, config.steps, *self.profile.boundaries())
        intervals = [config.log_every, config.checkpoint_every, self.preemption.check_every]
        if self.evaluator is not None and config.eval_every is not None:
            intervals.append(config.eval_every)
        return call_end(step, config.steps_per_call, stops, tuple(intervals))

    def _evaluates_at(self, step: int) -> bool:
        every = self.config.eval_every
        return self.evaluator is not None and (
            step == self.config.steps or (every is not None and step % every == 0)
        )

    def _evaluate(self, step: int) -> EvalResult:
        """On every worker at the same step: the evaluation runs collectives."""
        assert self.evaluator is not None
        started = time.perf_counter()
        result = self.evaluator.evaluate()
        log(
            f"eval step {step} val_loss {_fmt(result.loss, 4)} val_accuracy "
            f"{_fmt(result.accuracy, 4)} examples {result.examples} "
            f"seconds {time.perf_counter() - started:.1f}"
        )
        self.summaries.scalars(step, {VAL_LOSS: result.loss, VAL_ACCURACY: result.accuracy})
        self.progress.add_seconds(EVAL_SECONDS, time.perf_counter() - started,
                                  val_loss=result.loss, val_accuracy=result.accuracy,
                                  eval_step=step)  # fmt: skip
        # The evaluation's time is not the steps': start the next rate window afresh.
        self._restart_window(step)
        return result

    def _stop(self, step: int) -> None:
        """Every worker gets here at the same step: the save is collective like the others."""
        started = time.perf_counter()
        if self.saver.saved_step != step:
            self.saver.save(step, wait=True)  # the preemption's save is on disk before the exit
        self.saver.close()  # an earlier one written in the background too
        self.progress.add_seconds(CHECKPOINT_SECONDS, time.perf_counter() - started)
        log(f"worker: {stop_word()}: saved checkpoint at step {step}")
        self.summaries.close()
        self.progress.write(step=step, checkpoint_step=step, preempted=True)
        raise Preempted(step)

    def _restart_window(self, step: int) -> None:
        self._mark = (step, time.perf_counter())
        if self._in_calls is not None:
            self._in_calls = 0.0

    def _log(self, step: int) -> None:
        loss, accuracy = self.window.read_and_reset(self.with_accuracy)
        mark_step, mark_time = self._mark
        now = time.perf_counter()
        rate = (step - mark_step) / (now - mark_time) if step > mark_step else None
        timing = {}
        if self._in_calls is not None and rate is not None:
            steps = step - mark_step
            timing = {STEP_CALL_SECONDS: self._in_calls / steps, STEP_SECONDS: 1 / rate}
        self._restart_window(step)
        log(
            f"step {step} loss {_fmt(loss, 4)} accuracy {_fmt(accuracy, 4)} steps/s {_fmt(rate, 1)}"
        )
        self.summaries.scalars(
            step,
            {
                LOSS: loss,
                ACCURACY: accuracy,
                "learning_rate": self.learning_rate(),
                STEPS_PER_SEC: rate,
                "examples_per_sec": None if rate is None else rate * self.config.batch_size,
            },
        )
        self.progress.write(step=step, loss=loss, accuracy=accuracy, steps_per_sec=rate, **timing)


def timing_enabled() -> bool:
    """The step calls are timed (two clock reads per call) unless the bench turns it off."""
    return os.environ.get(STEP_TIMING_ENV) != "0"


def _fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def stop_word() -> str:
    """ "stopped" when the stop was asked for (`down`: the agent wrote the run directory's stop
    request before its SIGTERM), else "preempted" (a scheduler's or a person's SIGTERM)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    asked = bool(run_dir) and os.path.exists(os.path.join(run_dir or "", STOP_REQUEST_FILE))
    return "stopped" if asked else "preempted"
