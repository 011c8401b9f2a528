"""Exports of an inventory's job for Kubernetes, which the product does not drive itself: a
Kubeflow TFJob (Training Operator v1) and a Kubeflow Trainer v2 TrainingRuntime with its TrainJob.
(The Slurm batch script is the Slurm backend's own export: backends/slurm/export.py.)"""
