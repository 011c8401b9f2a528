"""The workers of a run: what each one gets (its placement, run directory, command line,
environment, secrets and TF_CONFIG: the one definition of a worker, whatever starts it), and
starting and stopping them through the backend, an attempt at a time. It acts when told to;
when to start, stop or restart is supervision/'s and start/'s to decide."""
