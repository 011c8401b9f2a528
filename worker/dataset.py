"""The training examples as the strategy takes them: each input pipeline its shard, shuffled
and repeated forever, in per-replica batches."""

from __future__ import annotations

import tensorflow as tf

# Base seed of the shuffle. The start step is added so a resumed run does not replay the exact
# batches of the run it resumes (the iterator position is not checkpointed).
SHUFFLE_SEED = 20_000


def distribute_dataset(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    global_batch: int,
    shuffle_buffer: int,
    seed: int,
) -> tf.distribute.DistributedDataset:
    """Each input pipeline (one per worker) takes its shard of the examples, repeated forever."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica_batch = context.get_per_replica_batch_size(global_batch)
        return (
            dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
            .shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
            .repeat()
            # drop_remainder: every replica gets full batches, so the global batch is constant.
            .batch(per_replica_batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )

    return strategy.distribute_datasets_from_function(dataset_fn)
