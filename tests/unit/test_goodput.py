"""The goodput account (engine/observe/goodput.py) over recorded event sequences: each case is a run
record as the supervisor leaves it (attempts, their workers' spans, restarts), and the parts
must sum to every worker's wall time."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from orchestrator.backends.registry import host_settings, source_settings_of
from orchestrator.cli.render import kept_warm
from orchestrator.dashboard import model
from orchestrator.engine.observe import goodput
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.model.answers import StandbyInfo
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.records import Attempt, Restart, RunRecord, WorkerSpan
from orchestrator.model.vocabulary import WorkerState

NAMES = ("worker-0", "worker-1")


def record(
    *attempts: Attempt,
    script: bool = False,
    queue_seconds: float = 0.0,
    restarts: tuple[Restart, ...] = (),
) -> RunRecord:
    job = Job(name="demo", script="train.py") if script else Job(name="demo", task="m:f", steps=1)
    inventory = Inventory(
        path="inv.yaml",
        base_dir=".",
        hosts=(WorkerSlot(name="a", address="localhost", port=1),),
        job=job,
    )
    return RunRecord(
        run_id="r1",
        inventory=inventory,
        created_at=0.0,
        attempts=attempts,
        queue_seconds=queue_seconds,
        restarts=restarts,
    )


def spans(**fields: object) -> tuple[WorkerSpan, ...]:
    return tuple(WorkerSpan(name=name, **fields) for name in NAMES)  # type: ignore[arg-type]


def assert_sums(account: goodput.RunAccount, wall: dict[str, float]) -> None:
    """Every worker's parts sum to its wall time; the cluster's to theirs."""
    for name, seconds in wall.items():
        assert account.workers[name].total == pytest.approx(seconds)
    assert account.cluster.total == pytest.approx(sum(wall.values()))
    assert sum(a.total for a in account.attempts) == pytest.approx(account.cluster.total)


def test_a_clean_run_is_start_up_training_saves_evaluation_and_shutdown() -> None:
    run = record(
        Attempt(
            0,
            100.0,
            spans(
                start_step=0,
                first_step_at=110.0,
                step=1000,
                reported_at=210.0,
                checkpoint_step=1000,
                checkpoint_seconds=5.0,
                eval_seconds=3.0,
                finished_at=212.0,
            ),
            213.0,
            "finished",
        )
    )
    account = goodput.run_account(run, None, now=999.0)
    assert_sums(account, {name: 112.0 for name in NAMES})
    worker = account.workers["worker-0"]
    assert worker.seconds == pytest.approx(
        {"startup": 10.0, "checkpoint": 5.0, "evaluation": 3.0, "productive": 92.0, "shutdown": 2.0}
    )
    assert account.cluster.goodput == pytest.approx(92 / 112)
    assert goodput.summary(account) == (
        "goodput 82 %: start-up 9 %, checkpoints 4 %, evaluation 3 %, shutdown 2 %"
    )


def restarted() -> RunRecord:
    """Attempt 0: steps 1..501 in 100 s (0.2 s a step), checkpoint at 400; worker-1 killed at
    112, found at 113. Attempt 1 resumes from 400, steps from 130 to 250, then exits."""
    killed = WorkerSpan(
        "worker-1",
        start_step=0,
        first_step_at=10.0,
        step=501,
        reported_at=110.0,
        checkpoint_step=400,
        checkpoint_seconds=0.0,
        eval_seconds=0.0,
        finished_at=112.0,
        failed=True,
    )
    survivor = dataclasses.replace(killed, name="worker-0", finished_at=118.0)
    first = Attempt(0, 0.0, (survivor, killed), 113.0, "crashed")
    second = Attempt(
        1,
        120.0,
        spans(
            start_step=400,
            first_step_at=130.0,
            step=1000,
            reported_at=250.0,
            checkpoint_step=1000,
            checkpoint_seconds=0.0,
            eval_seconds=0.0,
            finished_at=251.0,
        ),
        252.0,
        "finished",
    )
    restart = Restart(113.0, 0, "worker-1", "killed by SIGKILL", 501, "killed")
    return record(first, second, restarts=(restart,))


def test_a_restart_loses_the_steps_past_the_checkpoint_and_its_downtime() -> None:
    account = goodput.run_account(restarted(), None, now=999.0)
    assert_sums(account, {name: 251.0 for name in NAMES})
    first = account.attempts[0]
    # 101 steps past the checkpoint at 0.2 s, and the 2 s between the last report and the kill
    assert first.part("lost") == pytest.approx(2 * (101 * 0.2 + 2.0))
    assert first.part("productive") == pytest.approx(2 * (100 - 101 * 0.2))
    # from the kill (112, the first failed exit) to the next attempt's first step (130)
    assert account.attempts[1].part("restart") == pytest.approx(2 * 18.0)
    assert "lost to 1 restart" in goodput.summary(account)


def test_lost_work_is_the_time_since_the_checkpoint_resumed_from_when_the_worker_says() -> None:
    run = restarted()
    first = run.attempts[0]
    saved = tuple(dataclasses.replace(s, checkpoint_at=90.0) for s in first.workers)
    run = dataclasses.replace(run, attempts=(dataclasses.replace(first, workers=saved),
                                             *run.attempts[1:]))  # fmt: skip
    account = goodput.run_account(run, None, now=999.0)
    # from the checkpoint's report (90) to the last report (110), then to the kill (112)
    assert account.attempts[0].part("lost") == pytest.approx(2 * (20.0 + 2.0))
    assert_sums(account, {name: 251.0 for name in NAMES})


def test_a_stall_is_the_time_from_the_last_report_to_the_verdict() -> None:
    stalled = Attempt(
        0,
        0.0,
        spans(
            start_step=0,
            first_step_at=10.0,
            step=101,
            reported_at=60.0,
            checkpoint_step=100,
            checkpoint_seconds=0.0,
            eval_seconds=0.0,
        ),
        360.0,
        "stalled",
    )
    after = Attempt(
        1,
        365.0,
        spans(
            start_step=100,
            first_step_at=380.0,
            step=200,
            reported_at=400.0,
            checkpoint_seconds=0.0,
            eval_seconds=0.0,
            finished_at=401.0,
        ),
        402.0,
        "finished",
    )
    account = goodput.run_account(record(stalled, after), None, now=999.0)
    assert_sums(account, {name: 401.0 for name in NAMES})
    assert account.workers["worker-0"].part("stall") == pytest.approx(300.0)
    assert account.workers["worker-0"].part("restart") == pytest.approx(20.0)
    assert account.workers["worker-0"].part("lost") == pytest.approx(50.0 / 100)


def test_the_queue_wait_counts_for_every_worker() -> None:
    run = record(
        Attempt(
            0,
            100.0,
            spans(
                start_step=0,
                first_step_at=110.0,
                step=10,
                reported_at=120.0,
                checkpoint_seconds=0.0,
                eval_seconds=0.0,
                finished_at=120.0,
            ),
            121.0,
            "finished",
        ),
        queue_seconds=60.0,
    )
    account = goodput.run_account(run, None, now=999.0)
    assert_sums(account, {name: 80.0 for name in NAMES})
    assert account.cluster.part("queue") == pytest.approx(120.0)


def test_a_preemption_loses_no_steps_and_waits_for_the_next_attempt() -> None:
    saved = Attempt(
        0,
        0.0,
        spans(
            start_step=0,
            first_step_at=10.0,
            step=301,
            reported_at=70.0,
            checkpoint_step=301,
            checkpoint_seconds=1.0,
            eval_seconds=0.0,
            finished_at=72.0,
        ),
        73.0,
        "preempted",
    )
    resumed = Attempt(
        1,
        80.0,
        spans(
            start_step=301,
            first_step_at=90.0,
            step=400,
            reported_at=100.0,
            checkpoint_seconds=0.0,
            eval_seconds=0.0,
            finished_at=100.0,
        ),
        101.0,
        "finished",
    )
    account = goodput.run_account(record(saved, resumed), None, now=999.0)
    assert_sums(account, {name: 100.0 for name in NAMES})
    assert account.cluster.part("lost") == 0
    # the save at the preemption is a checkpoint; from its report (70) to the next attempt's
    # first step (90), downtime
    assert account.workers["worker-0"].part("restart") == pytest.approx(90.0 - 70.0)
    assert account.workers["worker-0"].part("checkpoint") == pytest.approx(1.0)


def test_a_script_without_step_reports_is_unknown_not_guessed() -> None:
    run = record(Attempt(0, 0.0, spans(finished_at=50.0), 51.0, "finished"), script=True)
    account = goodput.run_account(run, None, now=999.0)
    assert_sums(account, {name: 50.0 for name in NAMES})
    assert account.cluster.goodput is None
    assert account.cluster.part("unknown") == pytest.approx(100.0)
    assert goodput.summary(account).startswith("goodput unknown: 100 %")


def test_a_script_reporting_steps_but_not_its_saves_gives_an_upper_bound() -> None:
    run = record(
        Attempt(
            0,
            0.0,
            spans(first_step_at=5.0, step=10, reported_at=45.0, finished_at=50.0),
            51.0,
            "finished",
        ),
        script=True,
    )
    account = goodput.run_account(run, None, now=999.0)
    assert account.cluster.unmeasured == {"checkpoint", "evaluation"}
    assert account.cluster.goodput == pytest.approx(40 / 50)
    assert goodput.summary(account).startswith("goodput at most 80 %")


def live_worker(name: str, **fields: object) -> WorkerStatus:
    declared = dataclasses.fields(WorkerStatus)
    unset = {f.name: None for f in declared if f.default is dataclasses.MISSING}
    given = {"name": name, "index": 0, "host": "localhost", "state": WorkerState.RUNNING}
    return WorkerStatus(**{**unset, "devices": (), "log_tail": (), **given, **fields})  # type: ignore[arg-type]


def test_a_live_attempt_is_accounted_up_to_each_workers_last_report() -> None:
    run = record(Attempt(0, 100.0))
    live = RunStatus(
        "r1",
        "demo",
        WorkerState.RUNNING,
        (
            live_worker(
                "worker-0",
                start_step=0,
                first_step_at=104.0,
                step=50,
                reported_at=130.0,
                checkpoint_seconds=0.0,
                eval_seconds=0.0,
            ),
            live_worker("worker-1", state=WorkerState.STARTING),
        ),
    )
    account = goodput.run_account(run, live, now=140.0)
    assert account.workers["worker-0"].seconds == pytest.approx(
        {"startup": 4.0, "productive": 26.0}
    )
    assert account.workers["worker-1"].seconds == pytest.approx({"startup": 40.0})


def test_the_attempts_survive_the_record_file() -> None:
    run = restarted()
    again = RunRecord.from_json(
        json.loads(json.dumps(run.to_json())), host_settings, source_settings_of
    )
    assert again.attempts == run.attempts
    assert goodput.run_account(again, None, 0.0) == goodput.run_account(run, None, 0.0)


def test_the_end_of_up_names_the_standbys_it_leaves_warm() -> None:
    def standby(
        name: str, mib: int, left: float, lingering: bool = True, ready: bool = True
    ) -> StandbyInfo:
        return StandbyInfo(name, 1, 2, "r1", lingering, left, ready, mib * 2**20)

    warm = {"worker-0": standby("worker-0", 600, 299.5), "worker-1": standby("worker-1", 640, 300)}
    assert kept_warm(warm) == (
        "2 standbys of worker-0, worker-1 kept warm for the next `up` (1.2 GiB, 5m00s; "
        "`orchestrate down` frees them)"
    )
    assert kept_warm({"worker-0": standby("worker-0", 600, 10, lingering=False)}) is None
    # Just started (the end of a short run): their memory is what they hold so far, not what
    # they will hold once TensorFlow is imported.
    fresh = {"worker-0": standby("worker-0", 25, 299, ready=False), "worker-1": warm["worker-1"]}
    assert "(665 MiB so far, importing TensorFlow, 5m00s;" in str(kept_warm(fresh))


def test_the_dashboard_gets_the_account_its_line_and_a_bar_of_the_parts() -> None:
    view = model.goodput(restarted(), None, now=999.0)
    assert view["line"].startswith("goodput ") and view["restarts"] == 1
    segments = re.findall(r'data-part="(\w+)" data-share="([\d.]+)"', view["bar"])
    assert {name for name, _ in segments} == {
        "startup",
        "productive",
        "lost",
        "restart",
        "shutdown",
    }
    assert sum(float(share) for _, share in segments) == pytest.approx(1, abs=1e-3)
    empty = model.goodput(record(Attempt(0, 5.0)), None, now=5.0)
    assert "no time to account yet" in empty["bar"] and empty["goodput"] is None
