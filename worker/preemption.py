"""Stopping on SIGTERM with a checkpoint: the signal, and the vote that stops every worker at once.

Importing it imports no TensorFlow (the worker's command line catches Preempted before TensorFlow
is loaded); the vote (Preemption) imports it when it is made.

A SIGTERM (a cloud VM's preemption notice, `orchestrate down`, a batch system's time limit) only
sets a flag here. The training loop turns the flag into a vote that rides along in every step's
cross-worker reduction, and every --preemption-check-every steps all workers read the same sum and
so take the same decision at the same step: save a checkpoint there and exit with EXIT_PREEMPTED.
A worker that simply died on SIGTERM would instead make its peers fail in their next collective,
losing everything since the last periodic checkpoint.

What TensorFlow 2.21 does to SIGTERM (measured; see worker.mirrored.run):
- Before the strategy exists, the default action applies: the process dies at once, which is right
  while there is nothing to save.
- MultiWorkerMirroredStrategy with a cluster in TF_CONFIG installs TensorFlow's own C++ handler
  (tsl SigtermNotifier) while it connects to its peers, replacing any Python handler installed
  earlier (signal.getsignal still names the Python one, but it is never called). That handler only
  records the signal, in the coordination service under PREEMPTION_NOTICE_KEY, about a second
  later. So install() must run after the strategy is built, and a SIGTERM that arrived while the
  workers were connecting is recovered from that key (tf_notice_received).
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import TYPE_CHECKING

from worker.config import STRATEGY_MIRRORED, WorkerConfig

if TYPE_CHECKING:
    import tensorflow as tf

# Where TensorFlow's SigtermNotifier records a SIGTERM (value: the task that got it). Read through
# a private API; a TensorFlow that moves it only loses the startup window, not the feature.
PREEMPTION_NOTICE_KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"
# How long to wait for that key. Present, it answers in well under a millisecond on localhost;
# absent, every worker waits this long once, at startup.
NOTICE_TIMEOUT_MS = 100


class Preempted(Exception):
    """Raised by the training loop once the whole cluster has saved a checkpoint at `step`.

    The CLI turns it into EXIT_PREEMPTED; running the same command again resumes from `step`.
    """

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped on SIGTERM after saving a checkpoint at step {step}")
        self.step = step


class SigtermFlag:
    """Counts SIGTERMs once install() has replaced the process's handler.

    The handler does nothing but count: Python runs it in the main thread between bytecodes, which
    may be in the middle of a checkpoint save, so acting there could tear a save apart. A second
    SIGTERM (during the preemption save, say) is therefore just counted too: the save proceeds and
    the worker still exits once; only SIGKILL stops it sooner (and a save killed midway leaves the
    previous checkpoint as the latest one).
    """

    def __init__(self) -> None:
        self.count = 0

    @property
    def received(self) -> bool:
        return self.count > 0

    def install(self) -> None:
        """Call from the main thread, after the strategy is built (see the module docstring)."""
        signal.signal(signal.SIGTERM, self._handle)
        # Restart system calls the signal interrupts, as TensorFlow's own handler did (std::signal
        # sets SA_RESTART; Python's does not): its threads then never see EINTR from our signal.
        signal.siginterrupt(signal.SIGTERM, False)

    def set(self) -> None:
        """Counts a SIGTERM that reached the process another way (TensorFlow's notice)."""
        self.count += 1

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1


def tf_notice_received(timeout_ms: int = NOTICE_TIMEOUT_MS) -> bool:
    """Whether TensorFlow's own handler recorded a SIGTERM of any worker of this cluster.

    Only meaningful with a coordination service (a cluster in TF_CONFIG). The key holds the first
    task that got the signal; any worker seeing it votes to stop, which is enough: one vote stops
    everybody. Best effort: any failure of the private API counts as "no notice".
    """
    from tensorflow.python.eager import context

    try:
        context.context().get_config_key_value(PREEMPTION_NOTICE_KEY, timeout_ms)
    except Exception:  # DeadlineExceededError when absent; anything else: no usable notice
        return False
    return True


def watch_sigterm() -> SigtermFlag:
    """Replaces TensorFlow's SIGTERM handler with one that only counts, for Preemption.

    Must follow the strategy: with a cluster in TF_CONFIG, the strategy installs TensorFlow's own
    handler (tsl SigtermNotifier) while it connects, over whatever was there before.
    """
    flag = SigtermFlag()
    flag.install()
    return flag


def sigterm_while_connecting(config: WorkerConfig) -> bool:
    """Whether a worker got SIGTERM while TensorFlow's handler was still in place.

    Only a cluster has that handler (and the coordination service it reports to).
    """
    return (
        config.strategy != STRATEGY_MIRRORED and config.cluster.num_workers > 1
    ) and tf_notice_received()


class Preemption:
    """Turns a SIGTERM on any worker into the same stop decision, at the same step, on all of them.

    `wish` is 1.0 on a worker once it got SIGTERM. Every step adds it, on every replica, to that
    replica's copy of `votes`, a sum-on-read variable (no collective in the step). Reading `votes`
    between steps sums the copies across all workers in one collective, so read after the same
    step (multiples of check_every, at the end of a call) it is the same number on every worker
    and gives every worker the same answer. Reading makes the host wait for the step and costs
    that collective, hence only every check_every steps. Without a strategy (unit tests) `votes`
    is a plain variable.
    """

    def __init__(
        self, flag: SigtermFlag, check_every: int, strategy: tf.distribute.Strategy | None = None
    ) -> None:
        import tensorflow as tf

        from worker.window import local_sum

        self.flag = flag
        self.check_every = check_every
        self.wish = tf.Variable(0.0, trainable=False, name="stop_wish")
        self.votes = tf.Variable(0.0, trainable=False, name="stop_votes")
        if strategy is not None:
            with strategy.scope():
                self.votes = local_sum("stop_votes", tf.float32)
        self._cast = False

    def before_step(self) -> None:
        """Host side, between steps: sets the wish once the signal has come (one assignment)."""
        if self.flag.received and not self._cast:
            self.wish.assign(1.0)
            self._cast = True

    def agreed_at(self, step: int) -> bool:
        """Call after step `step`; True on every worker or on none."""
        return step % self.check_every == 0 and float(self.votes.numpy()) > 0
