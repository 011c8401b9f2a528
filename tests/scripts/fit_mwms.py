"""model.fit under MultiWorkerMirroredStrategy with BackupAndRestore, as TF's Keras multi-worker
tutorial does it; the chief saves the model, the others into a temporary directory."""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

from worker import checkpoint_dir, keras_progress, write_dir

EPOCHS = int(os.environ.get("EPOCHS", "2"))
GLOBAL_BATCH = 32

strategy = tf.distribute.MultiWorkerMirroredStrategy()
x, y = common.data()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(GLOBAL_BATCH)

with strategy.scope():
    model = common.build_model(tf.keras)
    model.compile(
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

backup = tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(checkpoint_dir(), "backup"))
model.fit(
    dataset, epochs=EPOCHS, steps_per_epoch=4, callbacks=[backup, keras_progress()], verbose=2
)

with write_dir(os.path.join(checkpoint_dir(), "saved")) as target:
    model.save(os.path.join(target, "model.keras"))
common.write_checksum(model)
