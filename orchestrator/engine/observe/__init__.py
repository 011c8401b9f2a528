"""What a run's workers are doing, and what people are told of it: a worker's state and the one
failure classification, the run's status from one round trip per machine, what the hosts' roles
mean for it, ETA, pace, goodput, stacks, logs, the supervisor's snapshot and the notify events.
Mostly pure decisions over what the backend answers. It reads and judges; it starts, stops or
restarts nothing (workers/ and supervision/ do), so `status`, `tail`, the dashboard and the
supervisor share it."""
