"""`python -m worker ...`: see worker.cli for the flags."""

import os
import sys

from orchestrator.contract import RUN_DIR_ENV, register_stack_dump

# SIGUSR2: every thread's Python stack into the run directory's stacks.txt (orchestrate stacks,
# and the supervisor at a stall). Before TensorFlow's import, so a hang there shows too.
register_stack_dump(os.environ.get(RUN_DIR_ENV))

from worker.userpath import user_directory_last  # noqa: E402 - after the handler

user_directory_last()  # before the task's module is imported: the user's modules, last

from worker.cli import main  # noqa: E402 - after the handler

code = main()
# A failed attempt's chief too: its metrics still queued for the run's MLflow run are sent
# (job.tracking; nothing to do without it).
from worker.tracking import close_all  # noqa: E402

close_all()
# Results, checkpoints and summaries are flushed by now (the loop closes what it opened). Leave
# at once: interpreter teardown can block for tens of seconds in TensorFlow's dataset-iterator
# destructors (~MultiDeviceIterator), and a finished worker that lingers looks stalled.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
