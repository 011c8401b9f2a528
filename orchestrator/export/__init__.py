"""Exports of an inventory's job for schedulers the product does not drive itself: a Slurm batch
script (the one `up` submits) and a Kubeflow TFJob manifest."""
