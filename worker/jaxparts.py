"""The pieces worker.loop.Loop is handed under `job.keras: jax` (worker.jaxloop builds them), in
place of the TensorFlow ones: the metrics window, the stop vote, the checkpoint saver, the
evaluator, the scalars' sink and the (absent) profile window.

JAX and Keras are imported where they are used; nothing here imports TensorFlow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker import jaxsaver
from worker.output import log
from worker.preemption import SigtermFlag
from worker.tracking import MetricLog


class _Count:
    """Loop reads `window.steps.numpy()` to wait for a step; here every step has been waited
    for already (its loss is read as a host value)."""

    def __init__(self) -> None:
        self.value = 0.0

    def numpy(self) -> float:
        return self.value


class HostWindow:
    """Loss and accuracy of the steps since the last log, summed on the host: the step
    (worker.jaxstep) returns each step's values, the global batch's (the same on every
    process)."""

    def __init__(self) -> None:
        self.steps = _Count()
        self.loss_sum = 0.0
        self.accuracy_sum = 0.0

    def add(self, loss: float, accuracy: float | None) -> None:
        self.steps.value += 1
        self.loss_sum += loss
        self.accuracy_sum += accuracy or 0.0

    def read_and_reset(self, with_accuracy: bool) -> tuple[float | None, float | None]:
        steps = self.steps.value
        if steps == 0:
            return None, None
        loss, accuracy = self.loss_sum / steps, self.accuracy_sum / steps
        self.steps.value, self.loss_sum, self.accuracy_sum = 0.0, 0.0, 0.0
        return loss, accuracy if with_accuracy else None


class StopVote:
    """worker.preemption.Preemption's vote over JAX: every check_every steps all processes
    gather each one's wish (one small collective) and so take the same decision."""

    def __init__(self, flag: SigtermFlag, check_every: int) -> None:
        self.flag = flag
        self.check_every = check_every

    def before_step(self) -> None:
        """Nothing to do between steps: the wish is read at the check."""

    def agreed_at(self, step: int) -> bool:
        if step % self.check_every:
            return False
        from jax.experimental import multihost_utils

        wishes = multihost_utils.process_allgather(np.float32(self.flag.received))
        return float(np.sum(wishes)) > 0


class Saver:
    """The chief's NumPy checkpoints (worker.jaxsaver); the others save nothing (the controller
    copies the chief's to their hosts before a restart), at the same steps."""

    def __init__(self, model: Any, optimizer: Any, directory: str, max_to_keep: int,
                 is_chief: bool) -> None:  # fmt: skip
        self.model, self.optimizer = model, optimizer
        self.directory, self.max_to_keep, self.is_chief = directory, max_to_keep, is_chief
        self.saved_step: int | None = None
        self.on_written: Callable[[int], None] = lambda step: None
        self.before_read: Callable[[], None] = lambda: None  # the step's values into the model
        if is_chief:
            jaxsaver.remove_interrupted_saves(directory)

    def save(self, step: int, *, wait: bool = False) -> None:
        """Blocking: the values are copied off the devices and written at once (the whole
        model is small next to a step of it, and the write is one file)."""
        if self.is_chief:
            self.before_read()
            saved = jaxsaver.Saved(step, state_arrays(self.model.weights),
                                   state_arrays(self.optimizer.variables))  # fmt: skip
            jaxsaver.save(self.directory, saved, self.max_to_keep)
        self.saved_step = step
        self.on_written(step)

    def close(self) -> None:
        """Nothing in the background to wait for."""


def state_arrays(variables: Any) -> list[np.ndarray]:
    return [np.array(variable.numpy()) for variable in variables]


def restore(model: Any, optimizer: Any, directory: str) -> tuple[int | None, str | None]:
    """The model's and optimizer's values from the latest loadable checkpoint: its step (None
    without one) and a note when a newer one did not load."""
    saved, note = jaxsaver.load(directory)
    if saved is None:
        return None, note
    pairs = ((model.weights, saved.weights, "model"),
             (optimizer.variables, saved.optimizer, "optimizer"))  # fmt: skip
    for variables, values, what in pairs:
        if len(variables) != len(values):
            raise ValueError(f"checkpoint {jaxsaver.checkpoint_name(saved.step)} holds "
                             f"{len(values)} {what} variables, the task's {what} has "
                             f"{len(variables)}: another model or optimizer wrote it")  # fmt: skip
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)
    log(f"worker: restored checkpoint {jaxsaver.checkpoint_name(saved.step)}")
    return saved.step, note


class Scalars:
    """The loop's scalars go to the job's MLflow run (job.tracking) from the chief; TensorBoard's
    writer is TensorFlow's, which a keras: jax host does not have."""

    def __init__(self, is_chief: bool) -> None:
        self.is_chief = is_chief
        self._tracking = MetricLog.from_env(is_chief)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        if self._tracking is not None:
            self._tracking.log(step, values)

    def close(self) -> None:
        if self._tracking is not None:
            self._tracking.close()


class NoProfile:
    """--profile-steps is TensorFlow's profiler; the loader refuses it under keras: jax."""

    def before_step(self, step: int) -> None:
        pass

    def boundaries(self) -> tuple[int, ...]:
        return ()

    def ends_at(self, step: int) -> bool:
        return False

    def export(self, step: int) -> None:
        pass


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float | None
    examples: int


class Evaluator:
    """Every eval example once: each process its padded shard (worker.jaxdata.eval_batches), a
    jitted step over the global batch summing weighted loss, correct answers and weights."""

    def __init__(self, model: Any, loss: Callable[[Any, Any], Any],
                 batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                 with_accuracy: bool, examples: int) -> None:  # fmt: skip
        import jax

        self.model, self.batches, self.with_accuracy = model, batches, with_accuracy
        self.steps = len(batches)
        self.before_read: Callable[[], None] = lambda: None  # the step's values into the model
        self.sharding = batch_sharding()

        def sums(trainable: Any, other: Any, x: Any, y: Any, w: Any) -> Any:
            import jax.numpy as jnp

            logits, _ = model.stateless_call(trainable, other, x, training=False)
            right = (jnp.argmax(logits, axis=-1) == y).astype(jnp.float32)
            return jnp.sum(loss(y, logits) * w), jnp.sum(right * w), jnp.sum(w)

        self._sums = jax.jit(sums)
        self.examples = examples

    def _total(self, step: Callable[[Any, Any, Any], Any]) -> np.ndarray:
        import jax

        total = np.zeros(3)
        for x, y, w in self.batches:
            parts = [jax.make_array_from_process_local_data(self.sharding, a) for a in (x, y, w)]
            total += np.array([float(v) for v in step(*parts)])
        return total

    def evaluate(self) -> EvalResult:
        started = time.perf_counter()
        self.before_read()
        trainable = [v.value for v in self.model.trainable_variables]
        other = [v.value for v in self.model.non_trainable_variables]
        loss, right, count = self._total(lambda x, y, w: self._sums(trainable, other, x, y, w))
        log(f"worker: evaluated {int(count)} examples in {time.perf_counter() - started:.1f} s")
        return EvalResult(loss / count, right / count if self.with_accuracy else None, int(count))


def batch_sharding() -> Any:
    """The global batch split over every process's devices along its first axis (each process
    hands its own rows: jax.make_array_from_process_local_data)."""
    import jax

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
