"""A Keras 3 model.fit across processes on the JAX backend, as Keras' distribution guide writes
one: the cluster from the environment (keras.distribution.initialize(): orchestrate's
KERAS_DISTRIBUTION_* under job.keras: jax), DataParallel over every process's devices, each
process feeding its own NumPy shard (auto_shard_dataset=False: auto-sharding needs a
tf.data.Dataset), BackupAndRestore every SAVE_EVERY steps. No TensorFlow in the script.

Reports its step and each backup's step to orchestrate (worker.report) and, at the end, the
digest of its weights; STEP_DELAY seconds after each step leave a test time to act, and
HOLD_UNTIL (a file) holds it from step HOLD_FROM_STEP on until that file exists: a test that
acts mid-run then acts before the run can end, however slow its machine."""

import os
import sys
import time

import jax
import keras

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

from worker import checkpoint_dir, keras_backup, report

EPOCHS = int(os.environ.get("EPOCHS", "4"))
BATCH = 16  # each process's own
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "4"))
STEP_DELAY = float(os.environ.get("STEP_DELAY", "0"))
HOLD_FROM_STEP = int(os.environ.get("HOLD_FROM_STEP", "0"))
HOLD_UNTIL = os.environ.get("HOLD_UNTIL")

keras.distribution.initialize()
keras.distribution.set_distribution(
    keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
)
process, processes = jax.process_index(), jax.process_count()
x, y = common.data()
x, y = x[process::processes], y[process::processes]
steps_per_epoch = len(x) // BATCH

keras.utils.set_random_seed(1)
model = common.build_model(keras)
model.compile(
    optimizer=keras.optimizers.SGD(learning_rate=0.1),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)


class Progress(keras.callbacks.Callback):
    """After BackupAndRestore in the callback list: a step that is a multiple of SAVE_EVERY has
    its backup written when this sees it."""

    epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = self.epoch * steps_per_epoch + batch + 1
        fields = {"step": step, "target_steps": EPOCHS * steps_per_epoch}
        if step % SAVE_EVERY == 0:
            fields["checkpoint_step"] = step
        report(**fields, loss=float(logs["loss"]))
        time.sleep(STEP_DELAY)
        while HOLD_UNTIL and step >= HOLD_FROM_STEP and not os.path.exists(HOLD_UNTIL):
            time.sleep(0.1)


# Each host keeps its own backup (no shared file system needed): every process saves at the
# same steps, so a whole restart resumes all of them from one point. keras_backup, not Keras's
# own BackupAndRestore: a survivor's save fails midway when its peer dies mid-all-reduce, and
# Keras's would leave its backup truncated for good (worker.kerasbackup).
backup = keras_backup(os.path.join(checkpoint_dir(), f"backup-{process}"), SAVE_EVERY, keras)
model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=[backup, Progress()], verbose=2)
common.write_checksum(
    model,
    process=process,
    tf_config=os.environ.get("TF_CONFIG"),
    addresses=os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES"),
)
