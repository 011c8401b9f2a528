"""Worker state from what the supervisor and worker wrote, and the run's overall state."""

from __future__ import annotations

from orchestrator.engine.observe.state import Expectation, classify, overall
from orchestrator.model.answers import WorkerProbe
from orchestrator.model.vocabulary import FailureKind
from orchestrator.model.vocabulary import WorkerState as S


def probe(**fields: object) -> WorkerProbe:
    """Parsed from the agent's JSON shape, as the backend does."""
    base: dict[str, object] = {
        "exists": True, "pid": 10, "alive": False, "progress": None, "exit": None,
        "stop_requested": False,
    }  # fmt: skip
    return WorkerProbe.parse({**base, **fields}, now=0.0)


def test_unreachable_host_is_unknown() -> None:
    assert classify(None).state is S.UNKNOWN


def test_not_started_is_pending() -> None:
    assert classify(probe(exists=False, pid=None)).state is S.PENDING


def test_alive_without_progress_is_starting_then_running() -> None:
    assert classify(probe(alive=True)).state is S.STARTING
    assert classify(probe(alive=True, progress={"step": 3})).state is S.RUNNING


def test_exit_codes() -> None:
    assert classify(probe(exit={"returncode": 0})).state is S.SUCCEEDED
    failed = classify(probe(exit={"returncode": 1, "error": "ValueError: x"}))
    assert failed.state is S.FAILED and failed.reason == "exit 1: ValueError: x"
    killed = classify(probe(exit={"returncode": -9, "signal": "SIGKILL"}))
    assert killed.state is S.FAILED and killed.reason == "killed by SIGKILL"


def test_stop_request_turns_a_signal_death_into_stopped() -> None:
    assert classify(probe(exit={"returncode": -15}, stop_requested=True)).state is S.STOPPED
    assert classify(probe(stop_requested=True)).state is S.STOPPED


def test_a_stopped_worker_says_who_stopped_it() -> None:
    by_supervisor = probe(exit={"returncode": -15}, stop_requested=True,
                          stopped_by="after beta ended the attempt")  # fmt: skip
    assert classify(by_supervisor).reason == "stopped after beta ended the attempt"
    # A request that does not say (an older agent's file): `orchestrate down`.
    assert classify(probe(stop_requested=True)).reason == "stopped by orchestrate down"


def test_an_evaluator_stopped_below_the_target_is_stopped_a_worker_is_not() -> None:
    stopped_short = {"exit": {"returncode": 0}, "progress": {"step": 5, "target_steps": 10},
                     "stop_requested": True}  # fmt: skip
    evaluator = classify(probe(**stopped_short), Expectation(evaluator=True))
    assert (evaluator.state, evaluator.reason) == (S.STOPPED, "stopped by orchestrate down")
    # A worker's exit 0 may have raced the stop (it left early on its own): still a failure.
    assert classify(probe(**stopped_short), Expectation()).kind is FailureKind.EARLY_EXIT
    # An evaluator that left early on its own is no better.
    on_its_own = probe(**{**stopped_short, "stop_requested": False})
    alone = classify(on_its_own, Expectation(evaluator=True))
    assert alone.kind is FailureKind.EARLY_EXIT


def test_vanished_supervisor_is_failed() -> None:
    verdict = classify(probe(alive=False))
    assert verdict.state is S.FAILED and "vanished" in (verdict.reason or "")


def test_overall() -> None:
    assert overall([S.SUCCEEDED, S.SUCCEEDED]) is S.SUCCEEDED
    assert overall([S.RUNNING, S.FAILED]) is S.FAILED
    assert overall([S.RUNNING, S.STARTING]) is S.RUNNING
    assert overall([S.STARTING, S.PENDING]) is S.STARTING
    assert overall([S.STOPPED, S.SUCCEEDED]) is S.STOPPED
    assert overall([S.RUNNING, S.UNKNOWN]) is S.UNKNOWN
    assert overall([]) is S.UNKNOWN


def test_preempted_worker_is_stopped_not_failed() -> None:
    verdict = classify(probe(exit={"returncode": 75}))
    assert verdict.state is S.STOPPED and "preempted" in (verdict.reason or "")


def test_down_wins_over_the_preemption_exit_it_causes() -> None:
    verdict = classify(probe(exit={"returncode": 75}, stop_requested=True))
    assert verdict.state is S.STOPPED and verdict.reason == "stopped by orchestrate down"


def test_exit_0_with_a_step_that_is_no_number_is_bad_progress_not_success() -> None:
    # Issue 54: a NaN or a string step read as absent, and the run "succeeded at step 0".
    for garbage in (float("nan"), "twelve", 10**400, -5):
        verdict = classify(probe(exit={"returncode": 0}, progress={"step": garbage, "loss": 1.0}))
        assert verdict.state is S.FAILED, garbage
        assert verdict.kind is FailureKind.BAD_PROGRESS and "no step number" in str(verdict.reason)
    nan_loss = classify(probe(exit={"returncode": 0}, progress={"step": 8, "loss": float("nan")}))
    assert nan_loss.state is S.SUCCEEDED  # how far it got is known; the loss is the script's
    assert classify(probe(exit={"returncode": 0}, progress={"loss": 1.0})).state is S.SUCCEEDED


def test_ps_and_workers_that_report_no_steps_serve_while_the_chief_trains() -> None:
    from orchestrator.engine.observe.rolepolicy import serving

    pairs = [("chief", S.RUNNING), ("worker", S.STARTING), ("ps", S.STARTING),
             ("evaluator", S.STARTING), ("worker", S.FAILED)]  # fmt: skip
    assert serving(pairs) == [1, 2]
    assert serving([("chief", S.STARTING), ("ps", S.STARTING)]) == []  # not before it trains
    assert serving([("worker", S.RUNNING), ("worker", S.STARTING)]) == []  # MWMS: no chief
