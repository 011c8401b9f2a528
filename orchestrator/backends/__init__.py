"""Where workers live: the Backend interface (base), the one registry that names the
implementations, and one folder per implementation (hosts/, slurm/)."""
