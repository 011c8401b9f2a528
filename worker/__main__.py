"""`python -m worker ...`: see worker.cli for the flags."""

import os
import sys

from worker.cli import main

code = main()
# Results, checkpoints and summaries are flushed by now (train.run closes what it opened). Leave
# at once: interpreter teardown can block for tens of seconds in TensorFlow's dataset-iterator
# destructors (~MultiDeviceIterator), and a finished worker that lingers looks stalled.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
