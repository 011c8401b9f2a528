"""worker.keras_backup: a save that fails midway leaves the last complete backup loadable, where
Keras 3's own BackupAndRestore leaves a truncated file that no restart can load (as a survivor's
save did on the Slurm test cluster when its peer died mid-all-reduce). Real Keras 3, in this
process; the failing save is Keras's own save_weights stopped after it opened its file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.tf


class PeerDied(RuntimeError):
    pass


def fitted(keras: Any, backup: Any, epochs: int, seed: int = 1) -> Any:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((32, 4), "float32"), np.zeros((32, 3), "float32")
    model.fit(x, y, batch_size=8, epochs=epochs, callbacks=[backup], verbose=0)
    return model


def fail_midway(keras: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next save_weights opens (truncates) its file as h5py does, then fails."""

    def save_weights(self: Any, filepath: str, overwrite: bool = True) -> None:
        Path(filepath).write_bytes(b"\x89HDF\r\n")
        raise PeerDied("Gloo all-reduce failed: Connection reset by peer")

    monkeypatch.setattr(keras.Model, "save_weights", save_weights)


@pytest.mark.parametrize("atomic", [True, False])
def test_a_save_that_fails_midway_keeps_the_last_complete_backup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, atomic: bool
) -> None:
    import keras

    from worker import keras_backup

    def backup() -> Any:
        directory = str(tmp_path / "backup")
        if atomic:
            return keras_backup(directory, save_freq="epoch", keras=keras, delete_checkpoint=False)
        return keras.callbacks.BackupAndRestore(directory, "epoch", delete_checkpoint=False)

    saved = fitted(keras, backup(), epochs=1).get_weights()
    with monkeypatch.context() as patched:
        fail_midway(keras, patched)
        with pytest.raises(PeerDied):
            fitted(keras, backup(), epochs=2)  # restores epoch 1, fails saving epoch 2
    if not atomic:  # the reason keras_backup exists: Keras's own is broken for good
        with pytest.raises(OSError, match=r"truncated|signature"):
            fitted(keras, backup(), epochs=2)
        return
    restored = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    restored.load_weights(str(tmp_path / "backup" / "latest.weights.h5"))
    for mine, theirs in zip(restored.get_weights(), saved, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    resumed = fitted(keras, backup(), epochs=2)  # resumes at epoch 2 and saves it
    assert resumed.optimizer.iterations.numpy() == 4 + 4, "not resumed from the first epoch"
