"""A custom training loop under MultiWorkerMirroredStrategy that uses Keras 2 metric APIs
(metric.reset_states at the end of each epoch): tf.keras 2 code, as TF's CTL tutorial writes it."""

import os
import sys
import time

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

from worker import report

EPOCHS = int(os.environ.get("EPOCHS", "2"))
STEP_DELAY = float(os.environ.get("STEP_DELAY", "0"))  # seconds: time for a test to act mid-run
STEPS_PER_EPOCH, GLOBAL_BATCH = 4, 32

strategy = tf.distribute.MultiWorkerMirroredStrategy()
x, y = common.data()


def dataset_fn(context):
    batch = context.get_per_replica_batch_size(GLOBAL_BATCH)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    return ds.shard(context.num_input_pipelines, context.input_pipeline_id).batch(batch)


with strategy.scope():
    model = common.build_model(tf.keras)
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")

iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        train_accuracy.update_state(labels, logits)
        return loss

    losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


step = 0
for epoch in range(EPOCHS):
    total = 0.0
    for _ in range(STEPS_PER_EPOCH):
        total += float(train_step(iterator))
        step += 1
        report(step=step, target_steps=EPOCHS * STEPS_PER_EPOCH)
        time.sleep(STEP_DELAY)
    print(
        f"epoch {epoch} loss {total / STEPS_PER_EPOCH:.4f} "
        f"accuracy {float(train_accuracy.result()):.4f}",
        flush=True,
    )
    train_accuracy.reset_states()  # Keras 2; Keras 3 renamed it reset_state

common.write_checksum(model)
