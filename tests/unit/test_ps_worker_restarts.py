"""Under ParameterServerStrategy a lost worker restarts by itself while the chief and the ps go on:
the pure decision (engine/supervision/policy.worker_restart, worker_budget_spent) over scripted
probes, then the supervisor acting on it over the fake backend, with what status, the dashboard and
the notify targets say; a worker that keeps failing ends the run with its root cause."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator.backends.registry import load_inventory
from orchestrator.cli.render import status_table
from orchestrator.dashboard.model import timeline
from orchestrator.engine.observe.status import RunStatus, WorkerStatus, worker_status
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.policy import (
    worker_budget_spent,
    worker_failure,
    worker_restart,
)
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run, stop_run
from orchestrator.errors import JobFailed
from orchestrator.model.answers import WorkerProbe
from orchestrator.model.inventory import Inventory, Job, NotifyTarget, WorkerSlot
from orchestrator.model.records import Restart, WorkerRecord
from orchestrator.model.vocabulary import WorkerState
from tests.fakes.backend import FakeBackend, exited, running

S = WorkerState
SERVING = {"exists": True, "pid": 100, "alive": True, "worker_pid": 101, "progress": None}
STOPPED = {**exited(-15), "stop_requested": True}
HOSTS = (WorkerSlot("boss", "10.0.0.1", 1, role="chief"), WorkerSlot("w0", "10.0.0.2", 1),
         WorkerSlot("w1", "10.0.0.3", 1), WorkerSlot("p", "10.0.0.4", 1, role="ps"))  # fmt: skip


def probed(host: WorkerSlot, index: int, state: dict[str, Any]) -> WorkerStatus:
    """A worker's status as the supervisor reads it from its host's (scripted) probe."""
    record = WorkerRecord(host.name, index, host, f"/r/{host.name}", "/r/log", "/c")
    return worker_status(record, WorkerProbe.parse(state, now=2.0))


def run_of(*states: dict[str, Any]) -> RunStatus:
    workers = tuple(probed(h, i, s) for i, (h, s) in enumerate(zip(HOSTS, states, strict=True)))
    return RunStatus("r", "demo", S.RUNNING, workers)


def lost(worker: str, times: int) -> tuple[Restart, ...]:
    return tuple(Restart(float(i), 0, worker, "killed by SIGKILL", 5, "killed")
                 for i in range(times))  # fmt: skip


def test_which_lost_worker_restarts_alone_and_when_the_run_fails_instead() -> None:
    job = Job("demo", script="t.py", strategy="parameter-server")
    killed = run_of(running(5), SERVING, exited(-9, 5), SERVING)
    assert worker_restart(killed, (), job) == 2  # w1, while the chief and the ps go on
    assert worker_restart(killed, lost("w0", 6), job) == 2  # w0's budget is not w1's
    assert worker_restart(killed, (), Job("demo", script="t.py")) is None  # MWMS: the cluster
    ps_lost = run_of(running(5), SERVING, exited(-9, 5), exited(-9))
    assert worker_restart(ps_lost, (), job) is None  # a lost ps restarts the cluster
    chief_lost = run_of(exited(1, 5, error="boom"), SERVING, exited(-9, 5), SERVING)
    assert worker_restart(chief_lost, (), job) is None
    # Its own budget spent: the failure is the run's, and says so.
    assert worker_restart(killed, lost("w1", 6), job) is None
    failure = worker_failure(killed.workers[2])
    assert worker_budget_spent(failure, "worker", lost("w1", 6), job) == (
        "it failed again after 6 restart(s) by itself (max_worker_restarts: 6)"
    )
    assert worker_budget_spent(failure, "worker", lost("w1", 5), job) is None
    assert worker_budget_spent(failure, "ps", lost("w1", 6), job) is None
    none = Job("demo", script="t.py", strategy="parameter-server", max_worker_restarts=0)
    assert worker_restart(killed, (), none) is None
    assert worker_budget_spent(failure, "worker", (), none) == (
        "max_worker_restarts is 0: a lost worker fails the run"
    )
    # A failure that a restart repeats is not restarted (give_up_reason ends the run with it).
    usage = run_of(running(5), SERVING, exited(2, error="worker: --bad flag"), SERVING)
    assert worker_restart(usage, (), job) is None


def fake_ps_run(tmp_path: Path, backend: FakeBackend, **job: Any) -> tuple[Supervisor, Any]:
    out = tmp_path / "events.jsonl"
    target = NotifyTarget(command=("sh", "-c", f"cat >> '{out}'; echo >> '{out}'"))
    inventory = Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), HOSTS,
                          Job("demo", script="t.py", steps=20, strategy="parameter-server",
                              restart_backoff=0, **job), notify=(target,))  # fmt: skip
    store = RunStore(tmp_path / "state")
    supervisor = Supervisor(store, backend, start_run(inventory, store, backend), interval=0)
    return supervisor, store


def events(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_killed_worker_restarts_alone_and_everyone_says_the_chief_continued(
    tmp_path: Path,
) -> None:
    backend = FakeBackend(scripts={
        "boss": {0: [running(5)], 1: [running(10), exited(0, 20)]},
        "w0": {0: [SERVING], 1: [SERVING, SERVING, STOPPED]},
        "w1": {0: [exited(-9, None)], 1: [SERVING, SERVING, STOPPED]},
        "p": {0: [SERVING], 1: [SERVING, SERVING, STOPPED]},
    })  # fmt: skip
    supervisor, store = fake_ps_run(tmp_path, backend)
    said: list[str] = []
    supervisor.say = said.append
    supervisor.sidecar.say = said.append
    status = supervisor.run()
    record = supervisor.record
    assert status.state is S.SUCCEEDED and status.restarts == () and record.attempt == 0
    assert backend.started == [["boss", "w0", "w1", "p"], ["w1"]]  # w1 alone, same attempt
    assert record.workers[2].run_dir.endswith("/attempt-0/w1-restart1")
    line = "worker w1 restarted (1 of 6), the chief continued"
    assert f"{line}: w1: exit -9" in said
    assert [(r.worker, r.kind) for r in record.alone] == [("w1", "killed")]
    assert store.load().alone == record.alone  # kept in the run's record
    assert status.alone == (line,) and status.to_json()["restarted_alone"] == [line]
    assert RunStatus.from_json(status.to_json()).alone == (line,)  # type: ignore[union-attr]
    console = Console(record=True, width=200)
    console.print(status_table(status))
    assert line in console.export_text()
    (entry,) = timeline(record)
    assert entry["alone"] and entry["text"] == f"{line}: w1: exit -9"
    told = [e for e in events(tmp_path) if e["event"] == "restarting"]
    assert [e["root_cause"] for e in told] == [f"{line}: w1: exit -9"]
    assert line in told[0]["text"]


def test_a_worker_that_keeps_failing_ends_the_run_with_its_root_cause(tmp_path: Path) -> None:
    tail = ["RuntimeError: the disk said no"]
    backend = FakeBackend(scripts={
        "boss": {0: [running(5)], 1: [running(6)], 2: [running(7)]},
        "w0": {0: [SERVING]}, "p": {0: [SERVING]},
        "w1": {0: [exited(-9, None)], 1: [exited(1, None, error=tail[0], tail=tail)],
               2: [exited(1, None, error=tail[0], tail=tail)]},
    })  # fmt: skip
    for name in ("w0", "p"):
        backend.scripts[name] = {0: [SERVING], 1: [SERVING], 2: [SERVING]}
    supervisor, store = fake_ps_run(tmp_path, backend, max_worker_restarts=2)
    with pytest.raises(JobFailed) as failed:
        supervisor.run()
    assert backend.started == [["boss", "w0", "w1", "p"], ["w1"], ["w1"]]
    message = failed.value.message
    assert "because it failed again after 2 restart(s) by itself (max_worker_restarts: 2)" in (
        message
    )
    assert "the worker that failed first: w1" in message and tail[0] in message
    # The run ends: everyone stopped, the chief first (its save needs the ps).
    assert backend.stops[-2:] == [["boss"], ["w0", "w1", "p"]]
    outcome = store.load().outcome or ""  # what status and the dashboard show
    assert outcome.startswith("gave up: w1: ") and "max_worker_restarts: 2" in outcome
    assert len(store.load().alone) == 2 and store.load().restarts == ()


def test_the_inventory_key_and_its_refusals(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    hosts = "hosts:\n" + "".join(
        f"  - {{name: {h.name}, role: {h.role}, address: localhost, port: {20000 + i}}}\n"
        for i, h in enumerate(HOSTS)
    )
    path = tmp_path / "inv.yaml"
    path.write_text("defaults: {connection: local}\n" + hosts + "job:\n  name: demo\n"
                    "  task: pkg.mod:task\n  steps: 5\n  strategy: parameter-server\n"
                    "  max_worker_restarts: 2\n")  # fmt: skip
    assert load_inventory(path).job.max_worker_restarts == 2  # a task job under ps loads
    assert Job("demo").max_worker_restarts == 6


def test_down_stops_a_ps_chief_before_the_ps_it_saves_from(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={"boss": {0: [running(5)]}})
    supervisor, _ = fake_ps_run(tmp_path, backend)
    stop_run(supervisor.record, backend, grace=10.0)
    assert backend.stops == [["boss"], ["w0", "w1", "p"]] and backend.graces == [10.0, 10.0]
    plain = FakeBackend()
    inventory = Inventory(str(tmp_path / "inv.yaml"), str(tmp_path),
                          (WorkerSlot("a", "10.0.0.1", 1), WorkerSlot("b", "10.0.0.2", 1)),
                          Job("demo", script="t.py"))  # fmt: skip
    stop_run(start_run(inventory, RunStore(tmp_path / "plain"), plain), plain, grace=10.0)
    assert plain.stops == [["a", "b"]]  # MultiWorkerMirrored: all at once
