"""model.fit under MirroredStrategy on one host's devices (two logical CPUs here), the one-machine
tutorial's shape."""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy()
print("replicas", strategy.num_replicas_in_sync, flush=True)
x, y = common.data()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

with strategy.scope():
    model = common.build_model(tf.keras)
    model.compile(
        optimizer="sgd",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )
model.fit(dataset, epochs=2, steps_per_epoch=4, verbose=2)
model.evaluate(dataset, steps=2, verbose=2)
common.write_checksum(model, replicas=strategy.num_replicas_in_sync)
