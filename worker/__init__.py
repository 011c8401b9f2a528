"""What runs on each training host: a TensorFlow MultiWorkerMirroredStrategy worker.

`python -m worker --task MODULE:FUNCTION --steps N` trains the TrainingTask that FUNCTION returns,
with TF_CONFIG from the environment (set by the controller), and reports to a progress file.
`--strategy mirrored` trains on one host's devices instead (MirroredStrategy, no TF_CONFIG); the
device flags (--gpu-memory-growth, --gpu-memory-limit-mb, --visible-gpus, --logical-gpus,
--logical-cpus) are applied through tf.config first (worker.devices). The chief writes TensorBoard
scalars, sample input images and, with --profile-steps, a trace (worker.summaries). SIGTERM to any
worker stops them all at one step, after a checkpoint there, with exit code 75 (worker.preemption).

For a `script:` job of your own: `is_chief()`, `write_dir(path)` (the chief writes `path`, the
others a temporary directory they remove), `checkpoint_dir()`, `target_steps()` (the job's
`steps:`) and `report(step=..., loss=...)` (worker.helpers, worker.progress); `keras()` is the
Keras of job.keras; `keras_progress()` is a callback that reports `model.fit`'s progress
(worker.kerasprogress); `keras_backup()` is Keras 3's BackupAndRestore with saves that cannot
leave a truncated backup (worker.kerasbackup).

Importing this package is cheap: TensorFlow is imported only when training starts, so the controller
side and user scripts can use `TrainingTask` and `report` without paying for it.
"""

from worker.helpers import checkpoint_dir, is_chief, target_steps, task_index, write_dir
from worker.kerasbackup import keras_backup
from worker.kerasflavor import keras
from worker.kerasprogress import keras_progress
from worker.progress import ProgressWriter, report
from worker.task import TrainingTask

__all__ = [
    "ProgressWriter",
    "TrainingTask",
    "checkpoint_dir",
    "is_chief",
    "keras",
    "keras_backup",
    "keras_progress",
    "report",
    "target_steps",
    "task_index",
    "write_dir",
]
