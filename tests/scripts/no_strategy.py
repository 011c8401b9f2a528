"""A script that trains alone: it uses TensorFlow but never creates
MultiWorkerMirroredStrategy, so every worker "succeeds" on its own (issue 28: never joined)."""

import tensorflow as tf

from worker import report

weight = tf.Variable(1.0)
for step in range(1, 4):
    weight.assign_sub(0.1 * weight)
    report(step=step, loss=float(weight.numpy()))
print("trained alone to step 3", flush=True)
