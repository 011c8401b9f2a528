"""The start of a run (its attempt 0) as one ordered sequence, over hooks for what the caller says
and asks (the CLI's `up` and `orchestrate local`).

The order, and why:
1. exclusive start: one `up` at a time in a state directory, from the check for an active run
   through the launch (a second `up` waits, then finds this run active and refuses);
2. the refusal of a second copy of an active run of the job; then, for a job already trained
   (the chief's checkpoint reaches job.steps, engine/start/rerun.py), nothing more: no run is made,
   so `status` still shows the run that trained (not with `up --fresh`);
3. sync and setup (`prepare`): they may install what the checks look for, so they go first;
4. the run's id, then its turn in the queue (`up --queue`), before its leases;
5. the leases (port: auto, gpus: N): the checks check the leased ports; then the run's
   tracking run (job.tracking), whose identity the standbys' environment holds: a new one, or
   the earlier run's when this one resumes its checkpoint (engine/trackers/trackresume.py);
6. the performance checks (`check --perf`), before the standbys, whose TensorFlow import would
   slow the compute probes;
7. the first standbys: TensorFlow's import overlaps the checks and the launch;
8. the preflight checks (unless skipped, or run at 6 with the performance round);
9. the announcement; with `up --fresh`, the job's checkpoints set aside (only now that the
   checks passed); then the start: the run recorded and its workers launched.
Leases and standbys are let go if a step fails before the run is recorded as started.

A restart is the same kind of ordered sequence, Supervisor._restart in
engine/supervision/supervise.py, over engine/workers/lifecycle.py's launch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from orchestrator.backends.base import Backend
from orchestrator.engine.start.rerun import Trained, already_trained, set_aside_checkpoints
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.locks import exclusive_start, refuse_if_active
from orchestrator.engine.supervision.supervise import STANDBY_SLACK
from orchestrator.engine.trackers.tracking import held_tracking
from orchestrator.engine.trackers.trackresume import resumed_tracking
from orchestrator.engine.workers.lifecycle import first_standbys, held_leases, start_run
from orchestrator.engine.workers.plan import new_run_id
from orchestrator.model.inventory import Inventory
from orchestrator.model.records import RunRecord


@dataclass(frozen=True)
class StartHooks:
    """What the start asks of its caller, step by step.

    say: the locks' and the leases' messages. prepare: sync and setup before the checks, True
    when it ran (the start then skips them). wait_in_queue: the run's turn (`up --queue`), the
    seconds waited. check: the preflight checks of the leased inventory (`perf`: with the
    performance round); raises when one blocks. announce: what is about to start. step: the
    launch's own lines.
    """

    say: Callable[[str], None]
    prepare: Callable[[Inventory, Backend, bool], bool]
    wait_in_queue: Callable[[Inventory, str, Backend], float]
    check: Callable[[Inventory, Backend, bool], None]
    announce: Callable[[Inventory], None]
    step: Callable[[str], None]


@dataclass(frozen=True)
class StartOptions:
    """`up`'s choices: skip the preflight checks, run setup everywhere, wait for held leases,
    start over from no checkpoint (`fresh`)."""

    skip_checks: bool = False
    force_setup: bool = False
    queue: bool = False
    fresh: bool = False


def start_first_attempt(
    store: RunStore,
    backend: Backend,
    inventory: Inventory,
    hooks: StartHooks,
    options: StartOptions,
) -> RunRecord | Trained:
    """Attempt 0 of a new run, in the order of the module's docstring; the run's record, or
    what the job's checkpoint reached when there is nothing to train (nothing started)."""
    with exclusive_start(store, hooks.say):
        refuse_if_active(store, backend, hooks.say)
        trained = None if options.fresh else already_trained(inventory, backend, backend)
        if trained is not None:
            return trained
        prepared = hooks.prepare(inventory, backend, options.force_setup)
        run_id = new_run_id()
        with ExitStack() as held:
            # Its turn first (then held_leases keeps what its keepers hold); goodput's queue.
            queued = hooks.wait_in_queue(inventory, run_id, backend) if options.queue else 0.0
            leased = held.enter_context(held_leases(inventory, run_id, backend.leasing, hooks.say))
            # One tracking run per run (job.tracking), before the standbys take its identity;
            # the earlier run's, when this one resumes its checkpoint.
            resumed = resumed_tracking(store, backend, backend, leased, hooks.say)
            leased = held.enter_context(
                held_tracking(leased, run_id, hooks.say, resumed, store.root)
            )
            measured = not options.skip_checks and leased.perf_check
            if measured:  # the standbys' TensorFlow import would slow the compute probes
                hooks.check(leased, backend, True)
            held.enter_context(first_standbys(leased, run_id, backend, linger=STANDBY_SLACK))
            if not options.skip_checks and not measured:
                hooks.check(leased, backend, False)
            hooks.announce(leased)
            if options.fresh:
                set_aside_checkpoints(leased, backend, backend, hooks.step)
            return start_run(
                leased,
                store,
                backend,
                say=hooks.step,
                force_setup=options.force_setup,
                prepared=prepared,
                run_id=run_id,
                queue_seconds=queued,
            )
