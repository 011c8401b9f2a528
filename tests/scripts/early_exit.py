"""A script that leaves the cluster early: worker 0 returns before creating the strategy, so
worker 1 waits for it forever inside MultiWorkerMirroredStrategy()."""

import sys

from worker import task_index

if task_index() == 0:
    print("nothing to do on the chief", flush=True)
    sys.exit(0)

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("never printed: the chief never joins", flush=True)
