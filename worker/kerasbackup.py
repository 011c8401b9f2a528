"""`keras_backup(directory, save_freq)`: Keras's BackupAndRestore, with saves that cannot leave
a broken backup behind.

    from worker import keras_backup
    model.fit(x, y, callbacks=[keras_backup(os.path.join(checkpoint_dir(), "backup"), 4)])

Keras 3's BackupAndRestore writes `latest.weights.h5` in place: h5py truncates the file, then
writes each variable. A save that fails midway leaves the file truncated, and the next
`model.fit` cannot load it ("truncated file") and fails at every restart. Across JAX processes
that failure is the usual one, not a rare one: when one worker dies, a survivor's save asks for
the step's arrays, whose all-reduce with the dead peer fails in the middle of the write (seen on
the Slurm test cluster). Here each save goes to a file of its own and is renamed over the
backup only once complete, so the backup is always the last complete save; restoring is
BackupAndRestore's own.

It works with Keras 3 (the keras of `job.keras: jax`, or Keras 3 on one host) and relies on
BackupAndRestore's private path attributes of Keras 3.x (kept since 3.0); nothing is imported
before it is called.
"""

from __future__ import annotations

import json
import os
import shutil
from types import ModuleType
from typing import Any

PARTIAL_WEIGHTS = "partial.weights.h5"  # Keras requires the .weights.h5 suffix
PARTIAL_METADATA = "partial_training_metadata.json"


def keras_backup(
    backup_dir: str, save_freq: int | str = "epoch", keras: ModuleType | None = None, **kwargs: Any
) -> Any:
    """A BackupAndRestore(backup_dir, save_freq, **kwargs) whose saves are atomic (see the
    module); `keras`: the Keras module (default: the job's)."""
    if keras is None:
        from worker.kerasflavor import keras as job_keras

        keras = job_keras()

    class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):  # type: ignore[name-defined]
        def _save_model(self) -> None:
            os.makedirs(self.backup_dir, exist_ok=True)
            if getattr(self, "double_checkpoint", False):
                for path, previous in ((self._weights_path, self._prev_weights_path),
                                       (self._training_metadata_path,
                                        self._prev_training_metadata_path)):  # fmt: skip
                    if os.path.exists(path):
                        shutil.copyfile(path, previous)
            partial = os.path.join(self.backup_dir, PARTIAL_WEIGHTS)
            self.model.save_weights(filepath=partial, overwrite=True)
            metadata = os.path.join(self.backup_dir, PARTIAL_METADATA)
            with open(metadata, "w") as file:
                json.dump({"epoch": self._current_epoch, "batch": self._last_batch_seen}, file)
            # The weights first: a stop between the two renames resumes the newer weights at
            # the older metadata's epoch, never a truncated file.
            os.replace(partial, self._weights_path)
            os.replace(metadata, self._training_metadata_path)

    return AtomicBackupAndRestore(backup_dir, save_freq=save_freq, **kwargs)
