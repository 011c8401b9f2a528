"""The distribution strategy of the built-in loop under MultiWorkerMirroredStrategy or
MirroredStrategy: which one, its cross-device communication, and the batch's split over replicas.

The strategy must be the first TensorFlow operation (after tf.config, worker.devices), which is
why worker.mirrored.run builds it before anything else.
"""

from __future__ import annotations

import tensorflow as tf

from worker.config import STRATEGY_MIRRORED, ConfigError, DeviceSettings


def create_strategy(kind: str, settings: DeviceSettings) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy reads TF_CONFIG; without it, it runs as a one-worker cluster.

    MirroredStrategy takes every local logical GPU, or, without GPU, every logical CPU (so
    --logical-cpus K gives K replicas); it ignores TF_CONFIG, which config has checked.
    """
    split = splits_gpus(settings)
    if kind == STRATEGY_MIRRORED:
        # TF 2.21 picks NCCL unless it counts more logical than physical GPUs, and it counts the
        # hidden ones too: --visible-gpus 0 --logical-gpus 2 on an 8-GPU host would give NCCL two
        # ranks on one card, which NCCL does not support. Reducing on one device always works.
        ops = tf.distribute.ReductionToOneDevice() if split else None
        return tf.distribute.MirroredStrategy(cross_device_ops=ops)
    options = None
    if split:  # the same reason: no NCCL between logical GPUs of one card
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def splits_gpus(settings: DeviceSettings) -> bool:
    """Several logical GPUs per card (configure_devices ignored --logical-gpus without GPU).

    Physical, not logical, devices: listing logical ones would start the runtime, and
    MultiWorkerMirroredStrategy must come first.
    """
    return bool(settings.logical_gpus and settings.logical_gpus > 1) and bool(
        tf.config.list_physical_devices("GPU")
    )


def check_batch_split(global_batch: int, num_replicas: int) -> None:
    """Every replica takes the same share of the global batch.

    Only known once the strategy has counted the devices; without this check TensorFlow fails in
    get_per_replica_batch_size with a traceback.
    """
    if global_batch % num_replicas:
        raise ConfigError(
            f"--batch-size {global_batch} is the global batch size and must be divisible by the "
            f"number of replicas ({num_replicas})"
        )
