"""Slurm as a place where workers live: the `slurm:` host source, the batch script that `up`
submits and `export --format sbatch` prints, the launcher that writes each task's TF_CONFIG from
Slurm's allocation, the Backend over sbatch/squeue/scontrol/scancel, and Slurm's preflight.

One batch job per attempt (`--no-requeue`): the supervisor submits the next attempt itself, with
the same rules as for hosts. The run's files (logs, progress, exit records, checkpoints) are on
the cluster's shared filesystem, which the login node (this machine) reads directly.
"""
