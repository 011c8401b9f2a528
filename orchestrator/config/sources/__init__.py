"""Host sources: each turns its top-level block (hosts:, ansible:, slurm:) into the workers."""
