"""Training scripts in the style of TensorFlow's multi-worker tutorials (written for these tests),
run as `script:` jobs by tests/integration/test_keras_scripts.py."""
