"""The built-in loop's training step under `job.keras: jax`: one jitted, stateless Keras 3 step
over the global batch (worker.jaxloop hands it to worker.loop's Loop).

Measured on the bundled example, one CPU process: 2.3 ms a step against model.train_on_batch's
6.7 at a batch of 32, 174 against 246 at 512 (train_on_batch rebuilds its state, reads the
metrics back and writes every variable after each call). Two processes over gloo on a loaded
2-core machine: 15-24 steps a second against 9-10 at a global batch of 512, about the same
(23-39) at 32, where the all-reduce dominates; both to the same weights bit for bit. Here the
values stay in JAX arrays between steps and go back into the Keras variables only when
something reads them (`sync`: a checkpoint, an evaluation, the export).

The batch is each process's own rows made into one global array
(jax.make_array_from_process_local_data); the weights are replicated on every process's
devices (DataParallel's layout), so XLA averages the gradients across the processes inside the
step, and every process computes the same new weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from worker.jaxparts import HostWindow, batch_sharding


class Trainer:
    """Loop's train_step: `trainer(batches, steps)`; `sync()` before reading the variables."""

    def __init__(self, model: Any, optimizer: Any, loss: Callable[[Any, Any], Any],
                 window: HostWindow, with_accuracy: bool) -> None:  # fmt: skip
        import jax

        self.model, self.optimizer = model, optimizer
        self.window, self.with_accuracy = window, with_accuracy
        self.sharding = batch_sharding()
        self._state: tuple[list[Any], list[Any], list[Any]] | None = None  # None: in the variables
        self._step = jax.jit(_step_function(model, optimizer, loss))

    def __call__(self, batches: Iterator[tuple[np.ndarray, np.ndarray]], steps: int) -> None:
        import jax

        state = self._state or self._read()
        for _ in range(steps):
            x, y = (jax.make_array_from_process_local_data(self.sharding, a) for a in next(batches))
            state, value, right = self._step(state, x, y)
            # Host values: the step is waited for here (the loop logs every step's share).
            self.window.add(float(value), float(right) if self.with_accuracy else None)
        self._state = state

    def _read(self) -> tuple[list[Any], list[Any], list[Any]]:
        return ([v.value for v in self.model.trainable_variables],
                [v.value for v in self.model.non_trainable_variables],
                [v.value for v in self.optimizer.variables])  # fmt: skip

    def sync(self) -> None:
        """The step's values into the Keras variables (checkpoints, evaluation, export)."""
        if self._state is None:
            return
        model, optimizer = self.model, self.optimizer
        for variables, values in zip((model.trainable_variables, model.non_trainable_variables,
                                      optimizer.variables), self._state, strict=True):  # fmt: skip
            for variable, value in zip(variables, values, strict=True):
                variable.assign(value)
        self._state = None


def _step_function(model: Any, optimizer: Any, loss: Callable[[Any, Any], Any]) -> Any:
    """(state, x, y) -> (state, mean loss, accuracy) of the global batch: the task's
    per-example loss averaged, plus the model's own losses (regularisers), as compile's."""
    import jax
    import jax.numpy as jnp

    def step(state: Any, x: Any, y: Any) -> Any:
        trainable, other, slots = state

        def objective(trainable: Any) -> Any:
            logits, new_other, losses = model.stateless_call(
                trainable, other, x, training=True, return_losses=True
            )
            value = jnp.mean(loss(y, logits))
            for extra in losses:
                value = value + extra
            return value, (new_other, logits)

        (value, (new_other, logits)), grads = jax.value_and_grad(objective, has_aux=True)(trainable)
        new_trainable, new_slots = optimizer.stateless_apply(slots, grads, trainable)
        right = jnp.mean((jnp.argmax(logits, axis=-1) == y).astype(jnp.float32))
        return (new_trainable, new_other, new_slots), value, right

    return step
