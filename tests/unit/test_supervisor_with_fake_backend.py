"""Supervision decisions on a fake backend: restarts, give-ups, root causes, spares."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.base import Standbys
from orchestrator.engine.observe.failures import Failure
from orchestrator.engine.observe.status import RunStatus, collect_status
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.contact import _read_answer
from orchestrator.engine.supervision.policy import (
    CAUSE_WINDOW,
    SCRIPT_SURVIVOR_GRACE,
    STOP_GRACE,
    TASK_SURVIVOR_GRACE,
    StallWatch,
    awaits_cause,
    conclude,
    first_failure,
    survivors_grace,
)
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run
from orchestrator.errors import JobFailed
from orchestrator.fanout import GroupResult
from orchestrator.model.findings import Finding, PreflightReport, Status
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.vocabulary import FailureKind, WorkerState
from tests.fakes.backend import FakeBackend, Script, exited, running


def inventory(tmp_path: Path, spares: int = 0, **job: Any) -> Inventory:
    hosts = tuple(WorkerSlot(name, f"10.0.0.{i + 1}", 20000) for i, name in enumerate("ab"))
    extra = tuple(WorkerSlot(f"spare{i}", f"10.0.1.{i + 1}", 20000) for i in range(spares))
    options = {"script": "train.py", "restart_backoff": 0, "max_restarts": 3, **job}
    return Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts,
                     Job("demo", **options), extra)  # fmt: skip


def supervise(
    tmp_path: Path, backend: FakeBackend, inv: Inventory
) -> tuple[RunStore, JobFailed | tuple[RunStatus, list[str]]]:
    store = RunStore(tmp_path / "state")
    record = start_run(inv, store, backend)
    messages: list[str] = []
    try:
        final = Supervisor(store, backend, record, say=messages.append, interval=0).run()
    except JobFailed as error:
        return store, error
    return store, (final, messages)


def test_a_crash_restarts_the_whole_cluster_and_the_next_attempt_succeeds(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={
        "a": {0: [running(1), running(2), exited(-9, 2)], 1: [running(3), exited(0, 5)]},
        "b": {0: [running(1), running(2), exited(1, 2, finished_at=5.0)],
              1: [running(3), exited(0, 5)]},
    })  # fmt: skip
    store, outcome = supervise(tmp_path, backend, inventory(tmp_path))
    assert isinstance(outcome, tuple), outcome
    final, messages = outcome
    assert final.state is WorkerState.SUCCEEDED
    assert backend.started == [["a", "b"], ["a", "b"]]
    assert backend.stops[0] == ["a", "b"]  # the rest of the failed attempt is stopped first
    assert backend.graces[0] == SCRIPT_SURVIVOR_GRACE  # a script's survivors may clean up
    record = store.load()
    assert record.attempt == 1
    (restart,) = record.restarts
    # a exited first (finished_at 1.0 < 5.0) and was killed: it is the root cause, not b.
    assert (restart.worker, restart.kind, restart.step) == ("a", "killed", 2)
    assert any("restarting the cluster (1/3)" in m for m in messages)
    assert conclude(final, record).startswith("job demo succeeded at step 5 after 1 restart(s)")


def test_the_same_failure_twice_ends_the_run_with_a_root_cause(tmp_path: Path) -> None:
    # The reason text differs each time (a temp file name); the signature does not.
    crash = [
        exited(
            1,
            7,
            error="OSError: No space left on device: ckpt.tempstate123",
            tail=["OSError: No space left on device: ckpt.tempstate123"],
        )
    ]
    again = [
        exited(
            1,
            7,
            error="OSError: No space left on device: ckpt.tempstate456",
            tail=["OSError: No space left on device: ckpt.tempstate456"],
        )
    ]
    backend = FakeBackend(
        scripts={"a": {0: crash, 1: again}, "b": {0: [running(7)], 1: [running(7)]}}
    )
    store, error = supervise(tmp_path, backend, inventory(tmp_path))
    assert isinstance(error, JobFailed)
    assert (
        "after 1 restart(s) because it failed the same way at the same step twice" in error.message
    )
    assert "the worker that failed first: a at step 7" in error.message
    assert store.load().restarts[0].kind == FailureKind.DISK_FULL.value


def test_a_deterministic_failure_is_not_retried(tmp_path: Path) -> None:
    tail = ["ModuleNotFoundError: No module named 'mytools'"]
    backend = FakeBackend(scripts={"a": {0: [exited(1, None, error=tail[0], tail=tail)]}})
    _, error = supervise(tmp_path, backend, inventory(tmp_path))
    assert isinstance(error, JobFailed)
    assert "after 0 restart(s) because a import error failure repeats" in error.message
    assert backend.started == [["a", "b"]]


def test_permanent_exit_code_and_max_restarts(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={"b": {0: [exited(3, 1)]}})
    _, error = supervise(tmp_path, backend, inventory(tmp_path, permanent_exit_codes=(3,)))
    assert isinstance(error, JobFailed) and "exit code 3 is marked permanent" in error.message

    steps: dict[str, Script] = {n: {i: [exited(1, i)] for i in range(3)} for n in "a"}
    backend = FakeBackend(scripts=steps)
    _, error = supervise(tmp_path / "2", backend, inventory(tmp_path, max_restarts=2))
    assert isinstance(error, JobFailed) and "it used all 2 restarts" in error.message
    assert len(backend.started) == 3


def test_a_dead_host_is_replaced_by_a_spare_and_without_one_the_run_stops(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={"a": {0: [exited(-9, 3)]}})

    def kill_b_after_first_start(specs):  # the host dies with its worker
        backend.dead_hosts["b"] = "connection refused"
        return original(specs)

    original = backend.start
    backend.start = kill_b_after_first_start  # type: ignore[method-assign]
    store, outcome = supervise(tmp_path, backend, inventory(tmp_path, spares=1))
    assert isinstance(outcome, tuple), outcome
    final, messages = outcome
    assert final.state is WorkerState.SUCCEEDED
    assert [h.name for h in store.load().inventory.hosts] == ["a", "spare0"]
    assert any("b does not answer; spare spare0 takes its place" in m for m in messages)

    backend = FakeBackend(scripts={"a": {0: [exited(-9, 3)]}}, dead_hosts={})
    original = backend.start
    backend.start = kill_b_after_first_start  # type: ignore[method-assign]
    _, error = supervise(tmp_path / "2", backend, inventory(tmp_path))
    assert isinstance(error, JobFailed) and "no spare host is left" in error.message


def test_unreachable_host_shows_unknown_and_stalls_after_the_timeout(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={"a": {0: [running(4)]}, "b": {0: [running(4)]}})
    store = RunStore(tmp_path / "state")
    record = start_run(inventory(tmp_path), store, backend)
    backend.dead_hosts["b"] = "timed out"
    status = collect_status(record, backend, backend.scheduler)
    assert [w.state for w in status.workers] == [WorkerState.RUNNING, WorkerState.UNKNOWN]
    assert status.state is WorkerState.UNKNOWN and "timed out" in (status.workers[1].reason or "")
    watch = StallWatch(timeout=30)
    assert watch.check(status, now=0) is None
    assert watch.check(status, now=29) is None
    failure = watch.check(status, now=30)
    assert failure is not None and failure.kind is FailureKind.STALLED  # a: step 4 never moved
    watch.reset()
    backend.scripts["a"] = {0: [running(5), running(6), running(7)]}
    for now in (0, 10, 20):
        assert watch.check(collect_status(record, backend, backend.scheduler), now=now) is None
    failure = watch.check(collect_status(record, backend, backend.scheduler), now=31)
    assert failure is not None and (failure.worker, failure.kind) == ("b", FailureKind.UNREACHABLE)


@pytest.mark.parametrize(
    ("code", "tail", "kind"),
    [
        (-9, [], FailureKind.KILLED),
        (137, [], FailureKind.KILLED),
        (75, [], FailureKind.PREEMPTED),
        (2, ["error: --task must look like MODULE:FUNCTION"], FailureKind.USAGE),
        (1, ["ModuleNotFoundError: No module named 'x'"], FailureKind.IMPORT_ERROR),
        (1, ["AttributeError: 'SparseCategoricalAccuracy' object has no attribute "
             "'reset_states'"], FailureKind.KERAS_API),
        (1, ["ValueError: Attempt to convert a value (PerReplica:{...}) with an unsupported "
             "type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor."],
         FailureKind.KERAS_API),
        (1, ["tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when "
             "allocating tensor"], FailureKind.OUT_OF_MEMORY),
        (1, ["UNKNOWN: Could not start gRPC server"], FailureKind.PORT_BUSY),
        (1, ["Collective ops is aborted by: ..."], FailureKind.PEER_LOST),
        (1, ["OSError: [Errno 28] No space left on device"], FailureKind.DISK_FULL),
        (1, ["ValueError: boom"], FailureKind.CRASHED),
    ],
)  # fmt: skip
def test_every_failure_kind_is_classified(code: int, tail: list[str], kind: FailureKind) -> None:
    from orchestrator.engine.observe.failures import classify_exit

    assert classify_exit(code, tail) is kind


def test_first_failure_is_the_earliest_exit_not_the_lowest_index(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={
        "a": {0: [exited(1, 3, error="Collective ops is aborted", finished_at=9.0,
                         tail=["Collective ops is aborted"])]},
        "b": {0: [exited(-9, 3, finished_at=4.0)]},
    })  # fmt: skip
    store = RunStore(tmp_path / "state")
    record = start_run(inventory(tmp_path), store, backend)
    failure = first_failure(collect_status(record, backend, backend.scheduler))
    assert failure is not None and (failure.worker, failure.kind) == ("b", FailureKind.KILLED)


ABORTED = ["UnavailableError: Collective ops is aborted by: recvmsg:Connection reset by peer"]


def test_a_peers_aborted_collective_waits_for_its_cause_which_is_named(tmp_path: Path) -> None:
    # a's abort is recorded first; b, killed, still reads running on that probe (a busy host
    # writes its exit record late): the restart names b, not a.
    backend = FakeBackend(scripts={
        "a": {0: [exited(1, 3, error=ABORTED[0], tail=ABORTED, finished_at=2.0)],
              1: [running(3), exited(0, 5)]},
        "b": {0: [running(3), running(3), exited(-9, 3, finished_at=1.0)],
              1: [running(3), exited(0, 5)]},
    })  # fmt: skip
    store, outcome = supervise(tmp_path, backend, inventory(tmp_path))
    assert isinstance(outcome, tuple), outcome
    (restart,) = store.load().restarts
    assert (restart.worker, restart.kind) == ("b", "killed")


def test_an_abort_waits_only_while_a_peer_may_still_fail_and_at_most_the_window(
    tmp_path: Path,
) -> None:
    aborted = exited(1, 3, error=ABORTED[0], tail=ABORTED)

    def status_with(b: dict[str, Any], name: str) -> RunStatus:
        backend = FakeBackend(scripts={"a": {0: [aborted]}, "b": {0: [b]}})
        record = start_run(inventory(tmp_path / name), RunStore(tmp_path / name), backend)
        return collect_status(record, backend, backend.scheduler)

    b_running = status_with(running(3), "running")
    failure = first_failure(b_running)
    assert failure is not None and (failure.worker, failure.kind) == ("a", FailureKind.PEER_LOST)
    assert awaits_cause(failure, b_running, waited=0.0)
    assert awaits_cause(failure, b_running, waited=CAUSE_WINDOW - 0.1)
    assert not awaits_cause(failure, b_running, waited=CAUSE_WINDOW)
    b_done = status_with(exited(0, 5), "done")
    failure = first_failure(b_done)
    assert failure is not None and not awaits_cause(failure, b_done, waited=0.0)
    b_killed = status_with(exited(-9, 3), "killed")
    failure = first_failure(b_killed)
    assert failure is not None and failure.kind is FailureKind.KILLED  # a cause: at once
    assert not awaits_cause(failure, b_killed, waited=0.0)


class StandbyOrderBackend(FakeBackend, Standbys):
    """Keeps standbys, and records their discard beside the lease calls, to see their order."""

    @property
    def keeper(self) -> Standbys:
        return self

    def discard_standbys(self, workers: Sequence[Any]) -> Any:
        self.lease_calls.append(("discard standbys", ""))
        return GroupResult({w.name: "none" for w in workers})

    def start_standbys(self, specs: Sequence[Any], linger: float) -> Any:
        return GroupResult({spec.name: "started" for spec in specs})

    def linger_standbys(self, workers: Sequence[Any], seconds: float) -> Any:
        raise AssertionError("this run's job lingers for no one")

    def standbys(self, workers: Sequence[Any]) -> Any:
        return GroupResult(dict.fromkeys((w.name for w in workers), None))


def test_a_run_that_ended_lets_go_of_its_leases_before_it_sees_to_its_standbys(
    tmp_path: Path,
) -> None:
    backend = StandbyOrderBackend(scripts={"a": {0: [exited(0, 5)]}, "b": {0: [exited(0, 5)]}})
    store, outcome = supervise(tmp_path, backend, inventory(tmp_path))
    assert isinstance(outcome, tuple), outcome
    run_id = store.load().run_id
    ended = [call for call in backend.lease_calls if call[0] not in ("take", "withdraw")]
    assert ended[:2] == [("release", run_id), ("discard standbys", "")], ended


class SchedulerLikeBackend(FakeBackend):
    resubmits_preempted = True  # as the Slurm backend: a preempted attempt is submitted again


def test_a_preempted_attempt_is_resubmitted_where_the_backend_says_so(tmp_path: Path) -> None:
    scripts: dict[str, Script] = {
        name: {0: [running(4), exited(75, 6)], 1: [running(7), exited(0, 9)]} for name in "ab"
    }
    store, outcome = supervise(tmp_path, SchedulerLikeBackend(scripts=scripts), inventory(tmp_path))
    assert isinstance(outcome, tuple), outcome
    final, _messages = outcome
    assert final.state is WorkerState.SUCCEEDED
    (restart,) = store.load().restarts
    assert (restart.kind, restart.attempt) == ("preempted", 0)
    # On hosts the same preemption ends the run with a hint to resume (nothing gives nodes back).
    hosts_store, hosts = supervise(tmp_path / "hosts", FakeBackend(scripts=scripts),
                                   inventory(tmp_path))  # fmt: skip
    assert isinstance(hosts, tuple), hosts
    stopped, _ = hosts
    assert stopped.state is WorkerState.STOPPED and not hosts_store.load().restarts
    with pytest.raises(JobFailed, match="preempted"):
        conclude(stopped, hosts_store.load())


class _Steps(Sequence[Mapping[str, Any]]):
    """A worker that runs `polls` polls (one step each), then succeeds: built lazily, so the
    script itself holds no memory that grows with the run."""

    def __init__(self, polls: int) -> None:
        self.polls = polls  # not `count`: that is Sequence's method

    def __len__(self) -> int:
        return self.polls + 1

    def __getitem__(self, index: int) -> Mapping[str, Any]:  # type: ignore[override]
        return running(index, target_steps=self.polls) if index < self.polls else exited(0, index)


def test_the_supervisors_memory_stays_flat_over_thousands_of_polls(tmp_path: Path) -> None:
    polls = 3000
    backend = FakeBackend(scripts={"a": {0: _Steps(polls)}, "b": {0: _Steps(polls)}})
    store = RunStore(tmp_path / "state")
    record = start_run(inventory(tmp_path), store, backend)
    samples: dict[int, int] = {}

    def show(_status: object) -> None:
        if backend.probes in (1000, 2000, polls):
            gc.collect()
            samples[backend.probes] = tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        final = Supervisor(store, backend, record, show=show, interval=0).run()
    finally:
        tracemalloc.stop()
    assert final.state is WorkerState.SUCCEEDED and backend.probes > polls
    # A leak grows in both stretches of 1000 polls. One resize of an interpreter-wide table
    # (measured: a single 1.9 MB block, when earlier tests had filled it) lands in one only.
    growth = min(samples[2000] - samples[1000], samples[polls] - samples[2000])
    assert growth < 32 * 1024, f"{growth} bytes more in each of two stretches of 1000 polls"


def test_preemptions_spend_no_restart_and_failures_keep_their_budget(tmp_path: Path) -> None:
    # max_restarts 1: three preemptions in a row, then one crash, then success.
    attempts = {0: [running(2), exited(75, 3)], 1: [running(4), exited(75, 5)],
                2: [running(6), exited(75, 7)], 4: [running(10), exited(0, 12)]}  # fmt: skip
    scripts: dict[str, Script] = {"a": {**attempts, 3: [running(8), exited(1, 9)]},
               "b": {**attempts, 3: [running(8), exited(1, 9)]}}  # fmt: skip
    store, outcome = supervise(tmp_path, SchedulerLikeBackend(scripts=scripts),
                               inventory(tmp_path, max_restarts=1))  # fmt: skip
    assert isinstance(outcome, tuple), outcome
    final, messages = outcome
    assert final.state is WorkerState.SUCCEEDED
    kinds = [r.kind for r in store.load().restarts]
    assert kinds == ["preempted", "preempted", "preempted", "crashed"], kinds
    assert any("a preemption spends no restart: 0/1 used" in m for m in messages), messages
    assert any("restarting the cluster (1/1)" in m for m in messages), messages
    # The budget is still spent by failures: a second crash after it ends the run.
    scripts = {n: {**attempts, 3: [exited(1, 9)], 4: [exited(1, 11)]} for n in "ab"}
    _, error = supervise(tmp_path / "2", SchedulerLikeBackend(scripts=scripts),
                         inventory(tmp_path, max_restarts=1))  # fmt: skip
    assert isinstance(error, JobFailed) and "it used all 1 restarts" in error.message


def test_a_worker_waiting_in_the_schedulers_queue_does_not_stall(tmp_path: Path) -> None:
    from dataclasses import replace as changed

    backend = FakeBackend(scripts={})
    status = collect_status(start_run(inventory(tmp_path), RunStore(tmp_path / "s"), backend),
                            backend, backend.scheduler)  # fmt: skip
    queued = changed(status, workers=tuple(changed(w, queued=True, state=WorkerState.PENDING)
                                           for w in status.workers))  # fmt: skip
    watch = StallWatch(timeout=5)
    assert watch.check(queued, now=0) is None
    assert watch.check(queued, now=100) is None  # an hour in the queue is no stall
    started = changed(queued, workers=tuple(changed(w, queued=False, state=WorkerState.STARTING)
                                            for w in queued.workers))  # fmt: skip
    assert watch.check(started, now=101) is None  # the clock starts when the job runs
    assert watch.check(started, now=104) is None
    failure = watch.check(started, now=106)
    assert failure is not None and failure.kind is FailureKind.STALLED


def test_a_task_jobs_survivors_are_killed_at_once_and_a_preemptions_peers_may_save(
    tmp_path: Path,
) -> None:
    # A task job's survivors can save nothing: their only answer to SIGTERM is a vote in a
    # collective the dead peer never joins.
    task: dict[str, Any] = {"script": None, "task": "worker.examples.shapes:task", "steps": 5}
    backend = FakeBackend(scripts={"a": {0: [exited(-9, 2)], 1: [exited(0, 5)]},
                                   "b": {0: [running(2)], 1: [exited(0, 5)]}})  # fmt: skip
    supervise(tmp_path, backend, inventory(tmp_path, **task))
    assert backend.graces[0] == TASK_SURVIVOR_GRACE == 0.0
    # A preemption's peers are saving the checkpoint they agreed on: they get the full grace.
    job = inventory(tmp_path, **task).job
    preempted = Failure("a", FailureKind.PREEMPTED, "exit 75", 4, 75)
    killed = Failure("a", FailureKind.KILLED, "SIGKILL", 4, -9)
    assert survivors_grace(preempted, job) == STOP_GRACE > survivors_grace(killed, job)


def test_a_stop_answer_is_taken_only_for_its_own_request(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    first = store.request_stop("r1", 10.0)
    assert store.stop_request("r1") == first and store.stop_flag("r1").exists()
    path = store.stop_answer_path("r1")
    answer = {"request": first.id, "outcome": {"a": "stopped"}, "leftovers": {}}
    store.write_file(path, json.dumps(answer))
    second = store.request_stop("r1", 3.0)
    assert second.id != first.id and store.stop_request("r1") == second
    assert _read_answer(path, second) is None  # an earlier down's answer is not this one's
    assert _read_answer(path, first) == answer
    store.stop_flag("r2").touch()  # a flag that carries nothing (an older down): no request
    assert store.stop_request("r2") is None


def test_the_supervisor_checks_and_prepares_through_the_backend_interface_only(
    tmp_path: Path,
) -> None:
    """Between attempts the supervisor asks Backend.network_problems (here: the hosts'
    partition rule over Backend.preflight) and every attempt calls Backend.prepare; it never
    reaches past the interface for a host's sessions or commands."""
    partition = Finding("b", "connect", Status.FAIL, "a cannot reach b:20000 (timed out)")

    class Interface(FakeBackend):
        def __init__(self, **fields: Any) -> None:
            super().__init__(**fields)
            self.checked: list[str] = []
            self.prepared: list[tuple[tuple[str, ...], bool]] = []

        def preflight(self, inventory: Inventory, options: Any = None) -> PreflightReport:
            self.checked.append(inventory.job.name)
            return PreflightReport((partition,) if len(self.checked) == 1 else ())

        def prepare(self, inventory: Inventory, workdirs: Mapping[str, str], say: Any,
                    *, force_setup: bool = False, spares: bool = False) -> None:  # fmt: skip
            self.prepared.append((tuple(sorted(workdirs)), spares))

        def preflight_session(self, host: WorkerSlot) -> Any:
            raise AssertionError("the supervisor opened a host's probe session itself")

    backend = Interface(scripts={
        "a": {0: [running(1), exited(1, 2, tail=["Collective ops is aborted"])],
              1: [running(3), exited(0, 5)]},
        "b": {0: [running(1), exited(1, 2, tail=["Collective ops is aborted"])],
              1: [running(3), exited(0, 5)]},
    })  # fmt: skip
    _store, outcome = supervise(tmp_path, backend, inventory(tmp_path))
    assert isinstance(outcome, tuple), outcome
    final, messages = outcome
    assert final.state is WorkerState.SUCCEEDED
    assert backend.checked == ["demo", "demo"]  # the partition seen, then gone
    assert any("restart waits for the network: b: a cannot reach b" in m for m in messages)
    # Every attempt prepared its hosts through the backend; only the first with the spares.
    assert backend.prepared == [(("a", "b"), True), (("a", "b"), False)]
