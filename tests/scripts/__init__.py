"""Training scripts in the style of TensorFlow's multi-worker tutorials (written for these tests),
run as `script:` jobs by tests/integration/test_keras_scripts.py; and `stepper.py`, the stand-in
script of the supervision and fault tests."""

from pathlib import Path

STEPPER = Path(__file__).with_name("stepper.py")
