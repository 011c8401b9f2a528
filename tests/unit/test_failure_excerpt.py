"""A failure's excerpt leaves out what TensorFlow prints at import on a CPU host (lines as
TensorFlow 2.21 printed them on this machine kind)."""

from __future__ import annotations

from orchestrator.engine.observe.excerpt import excerpt

LOG = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796633658.695479   24867 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1796633658.695786   24867 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
I0000 00:00:1796633658.993402   24867 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
E0000 00:00:1796633680.839420   24867 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
Traceback (most recent call last):
  File "train.py", line 7, in <module>
ValueError: bad batch shape at step 5""".splitlines()  # noqa: E501


def test_the_excerpt_keeps_the_error_and_drops_tensorflows_noise() -> None:
    assert excerpt(LOG) == LOG[-3:]
    assert excerpt(LOG, 2) == LOG[-2:]
    user = ["epoch 3: loss 0.4 (cuda is not used here)", "done"]
    assert excerpt(user) == user  # a user's own line that names CUDA stays
