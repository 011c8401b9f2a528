"""The lines of a worker's log shown with its failure, without TensorFlow's start-up noise.

On a host with no GPU, TensorFlow's import prints a handful of lines about CUDA, cuDNN, oneDNN and
CPU instructions; they say nothing about why a worker failed, yet they took 3 of the 9 lines of a
failure's excerpt. Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence

# What TensorFlow and XLA print at import on a CPU host, by the source file or words they use.
NOISE = re.compile(
    r"cuda_(dnn|fft|blas|executor|diagnostics)\.cc|cudart_stub\.cc|cpu_feature_guard\.cc"
    r"|Could not find cuda drivers|failed call to cuInit|Unable to register cu(DNN|FFT|BLAS)"
    r"|oneDNN custom operations are on|rebuild TensorFlow with the appropriate compiler flags"
    r"|All log messages before absl::InitializeLog\(\) is called"
    r"|computation placer already registered|TF-TRT Warning: Could not find TensorRT"
    r"|cuda_platform\.cc"
)


def excerpt(log_tail: Sequence[str], lines: int = 10) -> list[str]:
    """The last `lines` lines of the log that are not TensorFlow's start-up noise."""
    kept = [line for line in log_tail if not NOISE.search(line)]
    return kept[-lines:]
