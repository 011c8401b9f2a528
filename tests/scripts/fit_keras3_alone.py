"""Keras 3 `model.fit` on one worker (Keras 3 cannot run under MultiWorkerMirroredStrategy), with
BackupAndRestore in the job's checkpoint directory and orchestrate's progress callback."""

import os
import sys

import keras

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

from worker import checkpoint_dir, keras_progress

x, y = common.data()
model = common.build_model(keras)
model.compile(
    optimizer=keras.optimizers.SGD(learning_rate=0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
backup = keras.callbacks.BackupAndRestore(backup_dir=os.path.join(checkpoint_dir(), "backup"))
model.fit(
    x,
    y,
    batch_size=32,
    epochs=2,
    steps_per_epoch=4,
    validation_data=(x[:64], y[:64]),
    callbacks=[backup, keras_progress()],
    verbose=2,
)
print("keras", keras.__version__, flush=True)
