"""A run's start (its attempt 0) as one ordered sequence over the caller's hooks (the CLI's `up`
and `orchestrate local`): the exclusive start, the queue for leases, a job started again (nothing
left to train, `up --fresh`), tracking, leases, the first launch, then the run handed to
supervision/. The top of the engine: it imports every other part and none imports it."""
