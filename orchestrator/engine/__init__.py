"""What orchestrate does with a cluster, written once against backends.base.Backend, in six
parts, each a folder that imports only the parts below it (pyproject's "Engine parts" contract):
start/ (a run's attempt 0) over supervision/ (keeping it going) over workers/ (what each worker
gets; starting and stopping them) over observe/ (reading and judging the workers, telling people)
over trackers/ (the experiment-tracker run) over store/ (the run records, checkpoints, exports)."""
