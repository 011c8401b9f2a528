"""What keeps the control plane cheap at many hosts (issue 18): one agent process per machine for
every call, a start-up allowance for a new session, hostprobe's version lookup without
importlib.metadata, `down` waking the supervisor instead of waiting for its next poll, and the
connect round on one selector."""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import socket
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.backends.hosts.backend import HostBackend
from orchestrator.backends.registry import load_inventory
from orchestrator.engine.observe.status import collect_status
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision import contact
from orchestrator.engine.supervision.contact import stop_everything
from orchestrator.engine.supervision.locks import SupervisorLock
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run, stop_run
from orchestrator.hostside import hostprobe
from orchestrator.machines import pool
from orchestrator.machines.hostclient import host_program
from orchestrator.model.answers import BY_DOWN
from orchestrator.model.vocabulary import WorkerState
from tests.fakes.backend import FakeBackend, running


def program(name: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "host_program"}
    exec(compile(host_program(name), name, "exec"), namespace)  # our own source
    return namespace


def test_hostprobe_finds_the_versions_importlib_metadata_finds() -> None:
    names = sorted({d.metadata["Name"] for d in importlib.metadata.distributions()})
    names += ["surely-not-installed-here", "tf-nightly"]
    found = program("hostprobe.py")["_versions"](names)
    expected: dict[str, str | None] = {}
    for name in names:
        try:
            expected[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            expected[name] = None
    assert found == expected
    assert found["tf-orchestrate"] and found["surely-not-installed-here"] is None


def test_the_agent_makes_directories_and_private_run_directories(tmp_path: Path) -> None:
    agent = program("agent.py")  # as it is sent: its protocol module carried with it

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        return agent["protocol"].answer(agent["VERBS"], request)

    runs = tmp_path / "job" / "runs"
    run_dir = runs / "r1" / "attempt-0" / "a"
    private = [str(runs), str(runs / "r1"), str(runs / "r1" / "attempt-0"), str(run_dir)]
    reply = answer({"verb": "make-dirs", "directories": [str(tmp_path / "x" / "y")],
                    "private_dirs": private})  # fmt: skip
    assert reply == {"made": True}
    assert (tmp_path / "x" / "y").is_dir()
    assert all(stat.S_IMODE(os.stat(path).st_mode) == 0o700 for path in private)


def write_local_inventory(tmp_path: Path, python: str = sys.executable) -> Path:
    (tmp_path / "train.py").write_text("import time\ntime.sleep(60)\n")
    path = tmp_path / "inv.yaml"
    path.write_text(
        f"defaults: {{connection: local, workdir: '{tmp_path / 'work'}', python: '{python}'}}\n"
        "hosts:\n  - {name: a, address: 127.0.0.1, port: 29871}\n"
        "  - {name: b, address: 127.0.0.1, port: 29872}\n"
        "job: {name: demo, script: train.py}\n"
    )
    return path


def agent_sessions() -> list[int]:
    """This process's children that are agent sessions (`python -I -c <agent source>`)."""
    found = []
    for child in psutil.Process().children():
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if argv[1:4] == ["-I", "-c", host_program("agent.py")]:
            found.append(child.pid)
    return found


def test_one_agent_process_serves_every_call_to_a_machine(tmp_path: Path) -> None:
    inventory = load_inventory(write_local_inventory(tmp_path))
    store = RunStore(tmp_path / "state")
    with HostBackend() as backend:
        record = start_run(inventory, store, backend)  # workdirs, checkpoint, two launches
        (session,) = agent_sessions()  # both hosts are this machine
        status = collect_status(record, backend, backend.scheduler)
        assert {w.state for w in status.workers} <= {WorkerState.STARTING, WorkerState.RUNNING}
        report = stop_run(record, backend, grace=5)
        assert set(report.outcome.values()) == {"stopped"}
        assert agent_sessions() == [session]  # the same Python answered all of it
    assert agent_sessions() == []  # closing the backend ends it


def test_a_session_slow_to_start_still_answers_its_first_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A login shell or Python that takes longer to start than a poll may take to answer (a
    loaded host, a heavy ~/.bashrc) is not a host that does not answer."""
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep 1.5\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setattr(pool, "PROBE_TIMEOUT", 0.5)
    inventory = load_inventory(write_local_inventory(tmp_path, python=str(slow)))
    with HostBackend() as backend:
        record = start_run(inventory, RunStore(tmp_path / "state"), backend)
        backend.close()  # the next probe opens a new session, through the slow start
        probes = backend.probe(record.workers)
        assert not probes.failed, probes.failed
        started = time.monotonic()
        assert not backend.probe(record.workers).failed  # over the open session: fast
        assert time.monotonic() - started < 0.5
        stop_run(record, backend, grace=5)


def test_down_wakes_the_supervisor_instead_of_waiting_for_its_next_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beside a loaded CI's lanes the supervisor's thread took longer than down's 3 s pickup
    # wait, and down rightly stopped the workers itself. Waking is what is tested here, and
    # `took` bounds it: a supervisor that only woke at its 30 s poll still fails.
    monkeypatch.setattr(contact, "PICKUP_TIMEOUT", 30.0)

    class Stoppable(FakeBackend):
        stopped = False

        def stop(self, workers: Any, grace: float, by: str = BY_DOWN) -> Any:
            self.stopped = True
            return super().stop(workers, grace, by)

        def probe(self, workers: Any) -> Any:
            if self.stopped:
                self.scripts = {w.name: {self.attempt: [stopped_probe()]} for w in workers}
            return super().probe(workers)

    backend = Stoppable(scripts={"a": {0: [running(1)]}, "b": {0: [running(1)]}})
    inv = load_inventory(write_local_inventory(tmp_path))
    store = RunStore(tmp_path / "state")
    record = start_run(inv, store, backend)
    supervisor = Supervisor(store, backend, record, interval=30.0)
    lock = SupervisorLock(store.lock_path(record.run_id))
    assert lock.acquire()
    finished: list[WorkerState] = []

    def supervise() -> None:
        try:
            finished.append(supervisor.run().state)
        finally:
            lock.release()

    thread = threading.Thread(target=supervise, daemon=True)
    thread.start()
    while backend.probes < 1:
        time.sleep(0.01)
    started = time.monotonic()
    stop_everything(store, backend, record.run_id, grace=1.0)
    took = time.monotonic() - started
    thread.join(timeout=5)
    assert finished == [WorkerState.STOPPED]
    assert took < 10.0, f"down waited {took:.1f} s for a supervisor polling every 30 s"
    # The supervisor stopped the workers (over its own sessions) and answered; down did not
    # stop them a second time.
    assert backend.stops == [["a", "b"]]
    answer = json.loads(store.stop_answer_path(record.run_id).read_text())
    assert answer["outcome"] == {"a": "stopped", "b": "stopped"}


def stopped_probe() -> dict[str, Any]:
    return {
        "exists": True, "pid": 100, "alive": False, "stop_requested": True,
        "exit": {"returncode": -15, "error": None, "log_tail": [], "started_at": 0.0,
                 "finished_at": 1.0},
    }  # fmt: skip


def test_the_connect_round_names_each_peers_outcome(tmp_path: Path) -> None:
    # One selector for every peer (a 64-host check makes 4,032 connects): real loopback sockets.

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(8)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    peers = [
        {"name": "up", "address": "127.0.0.1", "port": listening.getsockname()[1]},
        {"name": "down", "address": "127.0.0.1", "port": closed_port},
        {"name": "nameless", "address": "no-such-host.invalid", "port": 1},
    ]
    try:
        answer = hostprobe.cmd_connect({"peers": peers, "timeout": 3})
    finally:
        listening.close()
    results = answer["peers"]
    assert [results[n]["status"] for n in ("up", "down", "nameless")] == ["ok", "refused", "error"]
    assert results["nameless"]["detail"]  # the resolver's words
    assert all(0 <= r["seconds"] < 3 for r in results.values())
    assert hostprobe._outcome(errno.EHOSTUNREACH, None, 0.01)["status"] == "unreachable"
