"""What runs on each training host: a TensorFlow MultiWorkerMirroredStrategy worker.

`python -m worker --task MODULE:FUNCTION --steps N` trains the TrainingTask that FUNCTION returns,
with TF_CONFIG from the environment (set by the controller), and reports to a progress file.

Importing this package is cheap: TensorFlow is imported only when training starts, so the controller
side and user scripts can use `TrainingTask` and `report` without paying for it.
"""

from worker.progress import ProgressWriter, report
from worker.task import TrainingTask

__all__ = ["ProgressWriter", "TrainingTask", "report"]
