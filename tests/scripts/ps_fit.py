"""A ParameterServerStrategy script as TensorFlow's tutorial writes it: the ps and workers run
a tf.distribute.Server and join; the chief coordinates model.fit (tf.keras 2: `keras: legacy`)
and checkpoints each epoch, resuming from the newest checkpoint when it starts again."""

import os
import sys
import time

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

from worker import checkpoint_dir, report, target_steps

STEPS_PER_EPOCH = 5
# Seconds the chief waits after each epoch of a run that started at step 0 (a test's window to
# kill a task mid-training); a resumed run does not wait.
FIRST_RUN_DELAY = float(os.environ.get("FIRST_RUN_DELAY", "0"))
GLOBAL_BATCH = 32

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()

strategy = tf.distribute.ParameterServerStrategy(resolver)
steps = target_steps(20)
assert steps is not None  # the default stands in when the job sets none
x, y = common.data()


def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


with strategy.scope():
    model = common.build_model(tf.keras)
    model.compile(
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=STEPS_PER_EPOCH,
    )
checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir(), max_to_keep=3)
if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint)
done = int(model.optimizer.iterations.numpy())
print(f"starting at step {done}", flush=True)


class Save(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        step = int(model.optimizer.iterations.numpy())
        manager.save(checkpoint_number=step)
        report(step=step, loss=float((logs or {}).get("loss", 0.0)), checkpoint_step=step)
        print(f"step {step} saved", flush=True)
        if done == 0:
            time.sleep(FIRST_RUN_DELAY)


model.fit(
    tf.keras.utils.experimental.DatasetCreator(dataset_fn),
    epochs=steps // STEPS_PER_EPOCH,
    initial_epoch=done // STEPS_PER_EPOCH,
    steps_per_epoch=STEPS_PER_EPOCH,
    callbacks=[Save()],
    verbose=0,
)
print(f"chief done at step {int(model.optimizer.iterations.numpy())}", flush=True)
