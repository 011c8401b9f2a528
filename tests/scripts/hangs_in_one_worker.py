"""A MultiWorkerMirroredStrategy script whose second worker blocks forever in one function
(stuck_here) at step 3 of its first attempt; its peer then waits in the compiled step. Later
attempts run to STEPS (many: `orchestrate stacks` looks at a live one), paced: flat out, that
live run took both cores from the other tests while the test looked at it. Progress through
worker.report, as a user's script would."""

import os
import threading
import time

import tensorflow as tf

from worker import report

STEPS = int(os.environ.get("STEPS", "100000"))


def stuck_here():
    threading.Event().wait()  # forever: only the stall watch ends it


def main():
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        total = tf.Variable(0.0)

    @tf.function
    def step():
        def add():
            value = tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0))
            total.assign_add(value)
            return value

        return strategy.run(add)

    first_attempt = "/attempt-0/" in os.environ["ORCHESTRATE_RUN_DIR"]
    second = os.environ["ORCHESTRATE_WORKER"] == "other"
    for number in range(1, STEPS + 1):
        if number == 3 and first_attempt and second:
            stuck_here()
        step()
        report(step=number, target_steps=STEPS)
        if not first_attempt:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
