"""The pure pieces of the built-in loop under keras: jax (worker/jaxdata.py, worker/jaxsaver.py):
the batches as a function of the step, the eval shards, the chief's checkpoints as the
controller's agent lists them. NumPy only: no JAX in this venv (tests/integration/
test_keras_jax_loop.py runs the loop itself from the jax-only install)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.engine.store.checkpoints import checkpoint_step
from orchestrator.hostside import files
from worker import jaxdata, jaxsaver
from worker.task import TaskError


def test_a_resumed_run_feeds_the_batches_an_uninterrupted_one_fed() -> None:
    x = np.arange(100, dtype=np.float32).reshape(50, 2)
    y = np.arange(50)
    whole = jaxdata.train_batches(x, y, start_step=0, batch=4, process=1, processes=2)
    uninterrupted = [next(whole)[1] for _ in range(20)]
    resumed = jaxdata.train_batches(x, y, start_step=13, batch=4, process=1, processes=2)
    assert all(np.array_equal(next(resumed)[1], uninterrupted[s]) for s in range(13, 20))
    # Process 1's shard only (odd labels); each epoch (25 examples: 6 batches) a new order.
    assert all(int(label) % 2 == 1 for batch in uninterrupted for label in batch)
    assert not np.array_equal(uninterrupted[0], uninterrupted[6])
    assert len(set(np.concatenate(uninterrupted[:6]).tolist())) == 24  # no repeat in an epoch


def test_every_eval_example_counts_once_on_one_process() -> None:
    x, y = np.arange(11, dtype=np.float32)[:, None], np.arange(11)
    shards = [jaxdata.eval_batches(x, y, batch=2, process=p, processes=3) for p in range(3)]
    assert {len(s) for s in shards} == {2}  # the same number of (collective) batches each
    counted = [int(label) for shard in shards for _, labels, weights in shard
               for label, weight in zip(labels, weights, strict=True) if weight]  # fmt: skip
    assert sorted(counted) == list(range(11))


def test_a_tf_dataset_under_jax_says_what_to_return_instead() -> None:
    class Dataset:  # how tf.data's class names its module; TensorFlow itself is not needed
        __module__ = "tensorflow.python.data.ops.dataset_ops"

    with pytest.raises(TaskError, match=r"dataset returned a tf.data.Dataset.*NumPy arrays"):
        jaxdata.arrays_of(Dataset(), "dataset")
    with pytest.raises(TaskError, match="3 features and 2 labels"):
        jaxdata.arrays_of((np.zeros((3, 2)), np.zeros(2)), "eval_dataset")
    with pytest.raises(TaskError, match="does not split over 3 workers"):
        jaxdata.local_batch(32, 3)


def test_the_chiefs_checkpoints_are_what_the_agent_lists_and_what_resumes(tmp_path: Path) -> None:
    directory = str(tmp_path)
    weights = [np.full((2, 2), 1.5, np.float32), np.arange(3, dtype=np.float32)]
    for step in (10, 20, 30):
        saved = jaxsaver.Saved(step, [w * step for w in weights], [np.array(step)])
        jaxsaver.save(directory, saved, max_to_keep=2)
    listing = files.cmd_checkpoint({"directory": directory})
    assert listing["latest"] == "ckpt-30" and listing["checkpoints"] == ["ckpt-20", "ckpt-30"]
    assert sorted(listing["files"]) == ["ckpt-20.npz", "ckpt-30.npz"]  # ckpt-10 pruned
    assert checkpoint_step(listing["latest"]) == 30
    loaded, note = jaxsaver.load(directory)
    assert loaded is not None and note is None
    assert loaded.step == 30 and np.array_equal(loaded.weights[1], weights[1] * 30)
    assert [int(v) for v in loaded.optimizer] == [30]


def test_a_latest_checkpoint_that_does_not_load_falls_back_with_a_note(tmp_path: Path) -> None:
    directory = str(tmp_path)
    for step in (10, 20):
        jaxsaver.save(directory, jaxsaver.Saved(step, [np.zeros(1)], []), max_to_keep=3)
    (tmp_path / "ckpt-20.npz").write_bytes(b"cut short")
    (tmp_path / ".ckpt-30.abc.tmp").write_bytes(b"a save killed midway")
    loaded, note = jaxsaver.load(directory)
    assert loaded is not None and loaded.step == 10
    assert note is not None and "ckpt-20 could not be loaded" in note
    jaxsaver.remove_interrupted_saves(directory)
    assert not list(tmp_path.glob(".ckpt-*.tmp"))
    assert jaxsaver.load(str(tmp_path / "none")) == (None, None)
