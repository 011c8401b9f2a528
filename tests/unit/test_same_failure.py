""" "The same failure twice in a row" ends a run (issue 56): an error of the code or the data at
the same step, whichever worker reached it first; a machine's failure (a signal, a stall) only
on the same worker."""

from __future__ import annotations

from orchestrator.engine.observe.failures import Failure, permanent_reason, same_failure
from orchestrator.engine.supervision.policy import give_up_reason
from orchestrator.model.inventory import Job
from orchestrator.model.records import Restart
from orchestrator.model.vocabulary import FailureKind


def test_an_error_at_the_same_step_is_the_same_failure_on_another_worker() -> None:
    assert same_failure(("beta", "crashed", 5), ("alpha", "crashed", 5))
    assert same_failure(("beta", "out of memory", None), ("alpha", "out of memory", None))
    assert not same_failure(("beta", "crashed", 6), ("alpha", "crashed", 5))
    assert not same_failure(("alpha", "disk full", 5), ("alpha", "crashed", 5))


def test_a_machines_failure_is_the_same_only_on_the_same_worker() -> None:
    assert not same_failure(("beta", "killed", 5), ("alpha", "killed", 5))
    assert not same_failure(("beta", "stalled", 5), ("alpha", "stalled", 5))
    assert same_failure(("alpha", "killed", 5), ("alpha", "killed", 5))
    assert not same_failure(
        ("beta", "a kind of an older release", 5), ("alpha", "a kind of an older release", 5)
    )


def test_the_second_attempt_failing_alike_on_another_worker_ends_the_run() -> None:
    job = Job(name="demo", script="train.py", max_restarts=3)
    first = Restart(at=1.0, attempt=0, worker="alpha", reason="exit 1: boom", step=5)
    again = Failure("beta", FailureKind.CRASHED, "exit 1: boom", 5, exit_code=1)
    assert give_up_reason(again, (first,), job) == (
        "it failed the same way at the same step twice in a row"
    )
    elsewhere = Failure("beta", FailureKind.CRASHED, "exit 1: boom", 9, exit_code=1)
    assert give_up_reason(elsewhere, (first,), job) is None
    assert permanent_reason(again, None, ()) is None  # the first time: worth a restart
