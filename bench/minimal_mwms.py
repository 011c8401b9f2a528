"""The floor for benchmark (b): the shortest honest MultiWorkerMirroredStrategy loop on the same
model and data as the bundled example, written as the TensorFlow tutorial would. No checkpoints,
progress file or summaries. Run one process per worker with TF_CONFIG set.

    python bench/minimal_mwms.py STEPS GLOBAL_BATCH LOG_EVERY
"""

from __future__ import annotations

import sys
import time

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # first, before any other TF op

from worker.examples import shapes  # noqa: E402 - after the strategy on purpose


def main(steps: int, global_batch: int, log_every: int) -> None:
    with strategy.scope():
        model = shapes.build_model()
        optimizer = shapes.build_optimizer()

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch)
        examples = shapes.make_images(shapes.NUM_EXAMPLES, shapes.SEED)  # build_dataset's
        dataset = tf.data.Dataset.from_tensor_slices(examples).shard(
            context.num_input_pipelines, context.input_pipeline_id
        )
        return dataset.shuffle(4096, seed=1).repeat().batch(batch, drop_remainder=True)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
        def step_fn(images, labels):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                per_example = tf.keras.losses.sparse_categorical_crossentropy(
                    labels, logits, from_logits=True
                )
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        losses = strategy.run(step_fn, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    loss = train_step(iterator)
    print(f"worker: first step done loss {float(loss):.4f}", flush=True)
    mark, mark_time = 1, time.perf_counter()
    for step in range(2, steps + 1):
        loss = train_step(iterator)
        if step % log_every == 0:
            value = float(loss)  # waits for the step, like the built-in loop's log steps
            now = time.perf_counter()
            print(f"step {step} loss {value:.4f} steps/s {(step - mark) / (now - mark_time):.1f}",
                  flush=True)  # fmt: skip
            mark, mark_time = step, now
    print(f"worker: finished at step {steps}", flush=True)


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:4]))
