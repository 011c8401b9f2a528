"""The root cause by causality, not by arrival: over recorded exit sequences in every order, the
worker that died is named, and the peers whose collective aborted because of it are named as
its consequences (engine/supervision/policy.first_failure, awaits_cause;
engine/observe/failures.classify_exit).

The statuses are real WorkerStatus values as collect_status makes them from a probe: a failed
worker carries its exit code and log tail, and its kind is read from them."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import pytest

from orchestrator.dashboard import model
from orchestrator.engine.observe.failures import Failure, classify_exit
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.engine.supervision.policy import CAUSE_WINDOW, awaits_cause, first_failure
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.records import RunRecord
from orchestrator.model.vocabulary import FailureKind, WorkerState

# What TensorFlow 2.x's MultiWorkerMirroredStrategy printed in the peers of a worker killed by
# SIGKILL mid-training (the chief of the dashboard test on a busy machine, and the others).
ABORT_TAILS = {
    "previous operation": (
        "tensorflow.python.framework.errors_impl.UnavailableError: {{function_node __wrapped__"
        "CollectiveReduceV2_device_/job:worker/replica:0/task:0/device:CPU:0}} The error could "
        "be from a previous operation. Restart your program to reset. [Op:CollectiveReduceV2]",
    ),
    "collective aborted": (
        "Collective ops is aborted by: failed to connect to all addresses",
        "Additional GRPC error information from remote target /job:worker/replica:0/task:1",
    ),
    "op only": ("tensorflow.python.framework.errors_impl.CancelledError: [Op:CollectiveGatherV2]",),
    "heartbeat": (
        "E coordination_service.cc] /job:worker/replica:0/task:1 has been set to ERROR in "
        "coordination service: ABORTED: Task /job:worker/replica:0/task:1 heartbeat timeout. "
        "This indicates that the remote task has failed, got preempted, or crashed unexpectedly.",
    ),
    "error polling": (
        "E coordination_service_agent.cc] Use error polling to propagate the following error "
        "to all tasks: UNAVAILABLE: Task /job:worker/replica:0/task:1 is unavailable",
    ),
    "shutdown barrier": ("E coordination_service_agent.cc] Shutdown barrier has failed.",),
}


@pytest.mark.parametrize("tail", ABORT_TAILS.values(), ids=ABORT_TAILS.keys())
@pytest.mark.parametrize("code", [1, -6], ids=["exit 1", "SIGABRT"])
def test_what_tensorflow_prints_when_a_peer_went_away_reads_as_peer_lost(
    tail: Sequence[str], code: int
) -> None:
    assert classify_exit(code, tail) is FailureKind.PEER_LOST


@pytest.mark.parametrize("code", [-9, 137, -15])
def test_a_worker_killed_from_outside_is_killed_whatever_it_printed_before(code: int) -> None:
    # Its log cannot hold the kill; an abort it printed and survived earlier is not why it ended.
    assert classify_exit(code, ABORT_TAILS["collective aborted"]) is FailureKind.KILLED


def worker(name: str, index: int, state: WorkerState, **fields: object) -> WorkerStatus:
    declared = dataclasses.fields(WorkerStatus)
    unset = {f.name: None for f in declared if f.default is dataclasses.MISSING}
    given = {"name": name, "index": index, "host": f"h{index}", "state": state, "step": 285}
    return WorkerStatus(**{**unset, "devices": (), "log_tail": (), **given, **fields})  # type: ignore[arg-type]


NAMES = ("chief", "other", "worker-2")
# How each worker of the attempt ended: `other` was SIGKILLed; the two others aborted.
EXITS = {
    "chief": {"exit_code": 1, "reason": "exit 1: The error could be from a previous operation.",
              "log_tail": ABORT_TAILS["previous operation"]},
    "other": {"exit_code": -9, "reason": "killed by SIGKILL", "log_tail": ("step 280",)},
    "worker-2": {"exit_code": 1, "reason": "exit 1: Collective ops is aborted",
                 "log_tail": ABORT_TAILS["heartbeat"]},
}  # fmt: skip


def status_after(arrived: Sequence[str]) -> RunStatus:
    """The attempt as a probe sees it once the exits in `arrived` were recorded, in that order
    (finished_at 1, 2, ...); the others still read running."""
    workers = tuple(
        worker(name, index, WorkerState.FAILED, finished_at=float(arrived.index(name) + 1),
               **EXITS[name])
        if name in arrived else worker(name, index, WorkerState.RUNNING)
        for index, name in enumerate(NAMES)
    )  # fmt: skip
    return RunStatus(run_id="r1", job="demo", state=WorkerState.FAILED, workers=workers)


@pytest.mark.parametrize("order", list(itertools.permutations(NAMES)), ids="-".join)
def test_the_killed_worker_is_the_cause_in_every_order_of_arrival(order: tuple[str, ...]) -> None:
    """The supervisor's loop in small: at each probe it acts unless the failure it would act on
    awaits its cause. Every exit arrives within the window (waited 0 at each probe)."""
    decided: Failure | None = None
    for seen in range(1, len(order) + 1):
        status = status_after(order[:seen])
        decided = first_failure(status)
        assert decided is not None
        if not awaits_cause(decided, status, waited=0.0):
            break
    assert decided is not None
    failure = decided
    assert (failure.worker, failure.kind) == ("other", FailureKind.KILLED), order
    # The peers that had aborted by then are named as what followed from the kill.
    aborted_before = tuple(n for n in order[: order.index("other")])
    assert set(failure.consequences) >= set(aborted_before)
    assert failure.consequences == tuple(n for n in order[:seen] if n != "other")
    if failure.consequences:
        assert "aborted because other died" in failure.reason
        assert all(name in failure.reason for name in failure.consequences)
    else:
        assert failure.reason == "killed by SIGKILL"


def test_two_consequences_read_as_one_sentence() -> None:
    failure = first_failure(status_after(("chief", "worker-2", "other")))
    assert failure is not None
    assert failure.reason == ("killed by SIGKILL (chief and worker-2 aborted because other died)")


def test_an_abort_whose_cause_never_shows_is_named_after_the_window() -> None:
    # The chief aborted and the other two still read running (a partition: nobody died).
    status = status_after(("chief",))
    failure = first_failure(status)
    assert failure is not None and failure.kind is FailureKind.PEER_LOST
    assert awaits_cause(failure, status, waited=CAUSE_WINDOW / 2)
    assert not awaits_cause(failure, status, waited=CAUSE_WINDOW)
    assert failure.worker == "chief" and failure.consequences == ()


def test_the_dashboard_names_the_same_cause_as_the_supervisor() -> None:
    inventory = Inventory(
        "inv.yaml", ".", (WorkerSlot("a", "localhost", 1),), Job("demo", "train.py")
    )
    record = RunRecord(run_id="r1", inventory=inventory, created_at=0.0)
    status = status_after(("chief", "other", "worker-2"))
    assert model.root_cause(record, status) == (
        "other at step 285: killed by SIGKILL (chief and worker-2 aborted because other died)"
    )
