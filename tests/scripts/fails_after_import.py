"""Imports TensorFlow (its start-up lines on a CPU host) and fails at once: the failure's
excerpt should show the error, not TensorFlow's noise."""

import tensorflow as tf

tf.constant(1.0) + 1.0
raise ValueError("bad batch shape at step 5")
