"""The run store: what a run keeps and where it lies. The records of runs in the state directory
(runstore: paths, atomic writes, stop requests), the checkpoints on the hosts and the one the
cluster resumes from, the exported model, TensorBoard's event files. It decides nothing about a
run and asks no worker how it is doing (observe/ does); every other part of the engine reads and
writes through it, and it imports none of them."""
