"""Keras 3's variables under TensorFlow's async checkpoint (CheckpointOptions(enable_async=True)).

TensorFlow copies every saved variable to host memory inside one tf.function before it writes
in the background (`_copy_trackable_to_cpu`, async_checkpoint_helper.py). Keras 3.15's
KerasVariable makes a new tf.Variable there on every save, which a tf.function allows on its
first call only: the second async save raises "tf.function only supports singleton
tf.Variables created on the first call". TensorFlow's own variables make the copy once and
assign it afterwards; `patch` gives Keras 3's variables the same (Keras 2, tf_keras, uses
TensorFlow's variables and needs nothing). tests/integration/test_worker_training.py checks
that an async-written checkpoint holds the same values as a blocking save of the same run.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def patch() -> None:
    """Once per process, before the first async save; a Keras without the class: nothing."""
    try:
        from keras.src.backend.tensorflow.core import Variable
    except ImportError:
        return
    if getattr(Variable, "_orchestrate_async_copy", False):
        return

    def copy_to_cpu(self: Any, object_map: dict[Any, Any]) -> None:
        self.value._copy_trackable_to_cpu(object_map)
        if self in object_map:
            object_map[self].assign(object_map[self.value])
        else:
            object_map[self] = tf.Variable(object_map[self.value])

    Variable._copy_trackable_to_cpu = copy_to_cpu
    Variable._orchestrate_async_copy = True
