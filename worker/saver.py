"""Checkpoints of the training state: the collective save (the chief's real directory, the
others' temporary ones), blocking or written in the background, and what a killed save left.

Keras 3's variables under TensorFlow's async write are patched in worker.asyncsave.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import threading
from collections.abc import Callable

import tensorflow as tf

from worker import asyncsave, kerasflavor
from worker.config import WorkerConfig
from worker.output import log
from worker.trainstate import CHECKPOINT_NAME, TrainState


class CheckpointSaver:
    """Checkpoints. Saving is collective: every worker must save, at the same step.

    The chief writes the real directory through a CheckpointManager (which prunes to max_to_keep);
    the other workers write to a temporary directory and delete it right after, so their copies
    neither accumulate nor race with the chief's files.

    With `config.async_checkpoints` a save returns once the values are copied to host memory
    and TensorFlow writes the files in a thread (CheckpointOptions(enable_async=True)); the
    manager names the checkpoint in its state file only once the write is complete, so a kill
    mid-write resumes from the previous one. The others then keep one temporary directory (a
    manager with max_to_keep 1), removed by close(). A save with `wait` (the last one, a
    preemption's) blocks until it and any earlier write are on disk. `on_written` is told a
    checkpoint's step once it is on disk: the progress file's checkpoint_step never names one a
    kill could still lose.
    """

    def __init__(self, state: TrainState, config: WorkerConfig, is_chief: bool) -> None:
        self._checkpoint = state.checkpoint
        self._step = state.step
        self._is_chief = is_chief
        self._temp_dir = config.temp_checkpoint_dir
        self._async = config.async_checkpoints
        self._manager = None
        self._temp_manager: tf.train.CheckpointManager | None = None
        self._kept_temp: str | None = None
        self.saved_step: int | None = None  # the step of this run's last save
        # Called with a checkpoint's step once it is on disk (the loop reports it then).
        self.on_written: Callable[[int], None] = lambda step: None
        self._reported = -1
        self._report_lock = threading.Lock()
        if self._async:
            asyncsave.patch()
        if is_chief:
            kerasflavor.record(config.checkpoint_dir)
            self._manager = tf.train.CheckpointManager(
                state.checkpoint,
                config.checkpoint_dir,
                max_to_keep=config.max_to_keep,
                checkpoint_name=CHECKPOINT_NAME,
            )

    def save(self, step: int, *, wait: bool = False) -> None:
        self._step.assign(step)
        self.saved_step = step
        background = self._async and not wait
        if not background:
            self._checkpoint.sync()  # an earlier write in the background first: files in order
        options = tf.train.CheckpointOptions(enable_async=background)
        if self._manager is not None:
            self._manager.save(checkpoint_number=step, options=options)
        elif background:
            self._background_temp().save(checkpoint_number=step, options=options)
        else:
            self._save_in_temp(step)
        if background:  # told once TensorFlow's writer thread has written it
            threading.Thread(target=self._when_written, args=(step,), daemon=True).start()
        else:
            self._written(step)

    def _when_written(self, step: int) -> None:
        try:
            self._checkpoint.sync()  # returns once the write and its state file are done
        except Exception as error:  # the loop's next save, or close, raises it again
            log(f"worker: the checkpoint of step {step} was not written: {error}")
            return
        self._written(step)

    def _written(self, step: int) -> None:
        """`on_written` once per checkpoint, in order (a late waiter never goes back)."""
        with self._report_lock:
            if step <= self._reported:
                return
            self._reported = step
        self.on_written(step)

    def _save_in_temp(self, step: int) -> None:
        """A non-chief's blocking save: a fresh temporary directory, deleted after."""
        self.close()
        temp_dir = self._make_temp_dir()
        try:
            manager = tf.train.CheckpointManager(self._checkpoint, temp_dir, max_to_keep=1)
            manager.save(checkpoint_number=step)
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)
            if self._temp_dir is not None:
                # RUN_DIR/tmp-checkpoints goes too once no worker on this host uses it.
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(temp_dir))

    def _background_temp(self) -> tf.train.CheckpointManager:
        """A non-chief's one temporary directory for saves written in the background."""
        if self._temp_manager is None:
            self._kept_temp = self._make_temp_dir()
            self._temp_manager = tf.train.CheckpointManager(
                self._checkpoint, self._kept_temp, max_to_keep=1
            )
        return self._temp_manager

    def close(self) -> None:
        """Waits for a write in the background; a non-chief's temporary directory goes."""
        self._checkpoint.sync()
        if self._kept_temp is not None:
            shutil.rmtree(self._kept_temp, ignore_errors=True)
            self._kept_temp, self._temp_manager = None, None

    def _make_temp_dir(self) -> str:
        # A fresh directory per save: the previous one was deleted with everything in it.
        if self._temp_dir is None:
            return tempfile.mkdtemp(prefix="worker-checkpoint-")
        os.makedirs(self._temp_dir, exist_ok=True)
        return self._temp_dir


def remove_interrupted_saves(checkpoint_dir: str) -> None:
    """Deletes what a save killed midway left in the chief's checkpoint directory.

    TensorFlow 2.21 writes CHECKPOINT_NAME-N_temp/ first (the data as *.tempstate*, renamed when
    complete), moves the files out to CHECKPOINT_NAME-N.*, removes the directory, and only then
    names the checkpoint in the `checkpoint` state file. A kill before the state file is written
    leaves the previous checkpoint as the latest, but the directory stays, as large as a
    checkpoint, and a later save of step N does not remove the stale files in it. Call on the
    chief only, before its first save: nothing else writes that directory.
    """
    for path in glob.glob(os.path.join(glob.escape(checkpoint_dir), f"{CHECKPOINT_NAME}-*_temp")):
        shutil.rmtree(path, ignore_errors=True)
        log(f"worker: removed {os.path.basename(path)}, left by an interrupted checkpoint save")
