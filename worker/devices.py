"""Device settings through tf.config, applied before the distribution strategy exists.

Order matters: the strategy (or any op) initialises the TensorFlow runtime, after which tf.config
raises "Virtual devices cannot be modified after being initialized" or similar. mirrored.run
therefore calls configure_devices() first. Listing physical devices does not initialise the runtime.

The flags are checked for consistency in worker.config; what is left here is what only the host
can answer (how many GPUs it has).
"""

from __future__ import annotations

import tensorflow as tf

from worker.config import ConfigError, DeviceSettings
from worker.output import log, warn


def configure_devices(settings: DeviceSettings) -> None:
    if settings.logical_cpus is not None:
        split_cpu(settings.logical_cpus)
    if settings.gpu_flags():
        configure_gpus(settings)


def split_cpu(count: int) -> None:
    """K logical CPUs: lets MirroredStrategy run K replicas on a host without GPU."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )
    log(f"worker: CPU split into {count} logical devices")


def configure_gpus(settings: DeviceSettings) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        # The same command line is used for every host of an inventory; a CPU host among GPU
        # hosts should train, not fail.
        warn(f"worker: no GPU found; ignoring GPU settings ({', '.join(settings.gpu_flags())})")
        return
    if settings.visible_gpus is not None:
        gpus = select_gpus(gpus, settings.visible_gpus)
        tf.config.set_visible_devices(gpus, "GPU")
    for gpu in gpus:
        if settings.memory_growth:
            tf.config.experimental.set_memory_growth(gpu, True)
        elif settings.memory_limit_mb is not None:
            config = tf.config.LogicalDeviceConfiguration(memory_limit=settings.memory_limit_mb)
            tf.config.set_logical_device_configuration(gpu, [config] * (settings.logical_gpus or 1))
    log(f"worker: GPU settings applied to {len(gpus)} GPU(s): {' '.join(settings.gpu_flags())}")


def select_gpus(gpus: list, indices: tuple[int, ...]) -> list:
    if max(indices) >= len(gpus):
        raise ConfigError(
            f"--visible-gpus {','.join(map(str, indices))}: this host has {len(gpus)} GPU(s), "
            f"numbered 0..{len(gpus) - 1}"
        )
    return [gpus[index] for index in indices]
