"""The checkpoint state file's format, declared once (orchestrator/contract.py) for the JAX
loop that writes it and the host agent that reads and rewrites it, as TensorFlow writes it."""

from __future__ import annotations

from orchestrator.contract import checkpoint_state_names, checkpoint_state_text

TENSORFLOWS = (
    'model_checkpoint_path: "/data/job/checkpoints/ckpt-300"\n'
    'all_model_checkpoint_paths: "/data/job/checkpoints/ckpt-100"\n'
    'all_model_checkpoint_paths: "/data/job/checkpoints/ckpt-200"\n'
    'all_model_checkpoint_paths: "/data/job/checkpoints/ckpt-300"\n'
    "all_model_checkpoint_timestamps: 1765.5\n"
    "last_preserved_timestamp: 1765.1\n"
)


def test_tensorflows_state_file_reads_as_names_oldest_first_the_latest_last() -> None:
    assert checkpoint_state_names(TENSORFLOWS) == ["ckpt-100", "ckpt-200", "ckpt-300"]


def test_what_is_written_reads_back_and_a_file_without_a_latest_names_none() -> None:
    names = ["ckpt-20", "ckpt-40"]
    assert checkpoint_state_names(checkpoint_state_text(names)) == names
    # A latest that the list leaves out is still the latest, and last.
    assert checkpoint_state_names('model_checkpoint_path: "ckpt-9"\n') == ["ckpt-9"]
    assert checkpoint_state_names('all_model_checkpoint_paths: "ckpt-1"\n') == []
    assert checkpoint_state_names("") == []
