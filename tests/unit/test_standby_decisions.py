"""Warm restarts, the pure decisions: may a standby serve an attempt, what it must share with it,
where it lives, the job key, and when the supervisor asks for standbys and discards them."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator import contract
from orchestrator.config.loader import load_inventory
from orchestrator.contract import BOOT_MARKER, booted
from orchestrator.engine.lifecycle import first_standbys, start_run
from orchestrator.engine.runstore import RunStore
from orchestrator.engine.state import WorkerState
from orchestrator.engine.supervise import Supervisor
from orchestrator.errors import InventoryError, RunStateError
from orchestrator.fanout import GroupResult
from orchestrator.machines.remote import agent
from orchestrator.model.inventory import Host, Inventory, Job
from orchestrator.model.records import WorkerRecord
from orchestrator.model.workers import WorkerSpec
from tests.fakes.backend import FakeBackend, exited, running
from tests.fakes.planning import plan_workers

PYTHON = "/opt/venv/bin/python"
ARGV = [PYTHON, "-m", "worker", "--task", "m:f", "--steps", "10"]
ENV = {"PATH": "/usr/bin", "TF_USE_LEGACY_KERAS": "1", "TOKEN": "s3cret"}


def standby(env: dict[str, str] = ENV, **fields: object) -> dict[str, object]:
    """A standby's state as the agent reads it: spec.json's fields, alive, ready."""
    salt = "0123"
    state: dict[str, object] = {"python": PYTHON, "salt": salt, "alive": True, "ready": True,
                                "digest": agent.env_digest(salt, PYTHON, env)}  # fmt: skip
    state.update(fields)
    return state


def test_a_standby_with_the_same_interpreter_and_environment_may_serve() -> None:
    assert agent.standby_refusal(standby(), ARGV, ENV) is None
    # Still importing TensorFlow: it reads the hand-over after the import, sooner than a cold
    # start would have imported it (`up` starts the first attempt's before its checks).
    assert agent.standby_refusal(standby(ready=False), ARGV, ENV) is None


@pytest.mark.parametrize(
    ("state", "argv", "env", "why"),
    [
        (None, ARGV, ENV, "no standby"),
        (standby(alive=False), ARGV, ENV, "gone"),
        (standby(), ["/usr/bin/python3", *ARGV[1:]], ENV, "this attempt /usr/bin/python3"),
        (standby(), [PYTHON, "-X", "dev", "train.py"], ENV, "cannot run"),
        # The Keras setting, a rotated secret, a thread setting: read at TensorFlow's import.
        (standby(), ARGV, {**ENV, "TF_USE_LEGACY_KERAS": "0"}, "environment differs"),
        (standby(), ARGV, {**ENV, "TOKEN": "rotated"}, "environment differs"),
        (standby(), ARGV, {**ENV, "TF_NUM_INTRAOP_THREADS": "1"}, "environment differs"),
        (standby(), ARGV, {k: v for k, v in ENV.items() if k != "TOKEN"}, "environment differs"),
    ],
)
def test_a_standby_is_refused_when_anything_before_the_import_differs(
    state: dict[str, object] | None, argv: list[str], env: dict[str, str], why: str
) -> None:
    refusal = agent.standby_refusal(state, argv, env)
    assert refusal is not None and why in refusal


def test_only_per_attempt_values_may_differ_between_a_standby_and_its_attempt() -> None:
    base = {"PATH": "/usr/bin", "SSH_CONNECTION": "10.0.0.1 51234 10.0.0.2 22"}
    first = agent.import_env(base, {"ORCHESTRATE_RUN_DIR": "/r/attempt-0/w", "X": "1"}, {"S": "v"})
    second = agent.import_env(
        {**base, "SSH_CONNECTION": "10.0.0.1 60000 10.0.0.2 22"},
        {"ORCHESTRATE_RUN_DIR": "/r/attempt-1/w", "ORCHESTRATE_PROGRESS_FILE": "/p", "X": "1"},
        {"S": "v"},
    )
    assert first == second == {"PATH": "/usr/bin", "X": "1", "S": "v"}
    # The agent is sent alone (stdlib only): its copy of the names is contract's.
    assert {contract.TF_CONFIG_ENV, contract.RUN_DIR_ENV, contract.PROGRESS_FILE_ENV} <= set(
        agent.PER_ATTEMPT_ENV
    )
    assert contract.RUN_ID_ENV not in agent.PER_ATTEMPT_ENV  # the same for every attempt
    assert "SSH_CONNECTION" in agent.PER_CONNECTION_ENV


def test_the_digest_hides_the_values_and_depends_on_the_salt() -> None:
    digest = agent.env_digest("a", PYTHON, ENV)
    assert "s3cret" not in digest and digest != agent.env_digest("b", PYTHON, ENV)


def test_the_command_lines_a_standby_runs() -> None:
    assert agent.runnable_argv(ARGV) == ("module", "worker", ARGV[3:])
    assert agent.runnable_argv([PYTHON, "/job/train.py", "--lr", "1"]) == (
        "script", "/job/train.py", ["--lr", "1"],
    )  # fmt: skip
    assert agent.runnable_argv([PYTHON, "-u", "train.py"]) is None
    assert agent.runnable_argv([PYTHON]) is None
    # A script behind the stacks boot (what plan_workers gives a script job) is a script.
    assert agent.runnable_argv(list(booted((PYTHON, "/job/train.py", "--lr", "1")))) == (
        "script", "/job/train.py", ["--lr", "1"],
    )  # fmt: skip
    assert agent.runnable_argv([PYTHON, "-c", "print(1)", "x.py"]) is None  # other code: no
    assert agent.BOOT_MARKER == BOOT_MARKER  # the agent is sent alone: its own copy


def inventory(tmp_path: Path, **job: object) -> Inventory:
    hosts = tuple(Host(name, f"10.0.0.{i + 1}", 20000) for i, name in enumerate("ab"))
    options = {"restart_backoff": 0, "max_restarts": 3, "warm_restarts": True, **job}
    return Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts,
                     Job("demo", script="train.py", **options))  # type: ignore[arg-type]  # fmt: skip


def test_one_standby_per_slot_and_run_beside_the_attempts(tmp_path: Path) -> None:
    specs = plan_workers(inventory(tmp_path), "r1", {"a": "/w", "b": "/w"}, attempt=2)
    assert agent.standby_dir(specs[0].run_dir) == "/w/demo/runs/r1/standby/a"
    next_attempt = plan_workers(inventory(tmp_path), "r1", {"a": "/w", "b": "/w"}, attempt=3)
    assert agent.standby_dir(next_attempt[0].run_dir) == agent.standby_dir(specs[0].run_dir)


def test_the_launch_carries_the_job_setting_and_the_standby_request_the_secrets(
    tmp_path: Path,
) -> None:
    (spec, _) = plan_workers(inventory(tmp_path), "r1", {"a": "/w", "b": "/w"}, 0, {"T": "v"})
    assert spec.launch_request()["warm"] is True
    request = spec.standby_request(linger=30)
    assert request["backs"] == spec.run_dir and request["python"] == spec.argv[0]
    assert request["env"] == spec.env and request["secret_env"] == {"T": "v"}
    off = plan_workers(inventory(tmp_path, warm_restarts=False), "r1", {"a": "/w", "b": "/w"})
    assert off[0].launch_request()["warm"] is False


JOB_INVENTORY = """\
    defaults: {connection: local, workdir: ./work}
    hosts:
      - {name: w0, address: localhost, port: 23456}
    job:
      task: worker.examples.shapes:task
      steps: 5
"""


def test_warm_restarts_is_on_by_default_and_a_job_key_like_the_others(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(JOB_INVENTORY))
    assert load_inventory(path).job.warm is True
    path.write_text(textwrap.dedent(JOB_INVENTORY) + "  warm_restarts: false\n")
    assert load_inventory(path).job.warm is False
    # A script may set TensorFlow's variables before its own import: warm only when asked.
    script = textwrap.dedent(JOB_INVENTORY).replace("task: worker.examples.shapes:task",
                                                    "script: train.py")  # fmt: skip
    (tmp_path / "train.py").write_text("pass\n")
    path.write_text(script)
    assert load_inventory(path).job.warm is False
    path.write_text(script + "  warm_restarts: true\n")
    assert load_inventory(path).job.warm is True
    path.write_text(textwrap.dedent(JOB_INVENTORY) + "  warm_restarts: sometimes\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    (problem,) = caught.value.problems
    assert "job.warm_restarts" in str(problem) and "expected true or false" in str(problem)


@dataclass
class StandbyBackend(FakeBackend):
    """The fake backend, recording what the supervisor asks of standbys and when."""

    keeps_standbys = True
    events: list[str] = field(default_factory=list)
    standby_dirs: list[str] = field(default_factory=list)  # the slots' run dirs, in order
    standby_polls: list[int] = field(default_factory=list)  # the polls made before each ask

    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, int]:
        self.events.append("start")
        return super().start(specs)

    def start_standbys(self, specs: Sequence[WorkerSpec], linger: float) -> GroupResult[str, str]:
        self.events.append(f"standbys for attempt {self.attempt}")
        self.standby_dirs += [spec.run_dir for spec in specs]
        self.standby_polls.append(self.probes)
        return GroupResult({spec.name: "started" for spec in specs})

    def discard_standbys(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, str]:
        self.events.append("discard")
        return GroupResult({w.name: "stopped" for w in workers})


STARTING = {"exists": True, "pid": 100, "alive": True, "worker_pid": 101, "progress": None}


def run_supervised(tmp_path: Path, backend: StandbyBackend, inv: Inventory) -> WorkerState:
    store = RunStore(tmp_path / "state")
    record = start_run(inv, store, backend)
    return Supervisor(store, backend, record, interval=0).run().state


def test_standbys_come_after_every_first_step_and_go_when_the_run_ends(tmp_path: Path) -> None:
    backend = StandbyBackend(scripts={
        "a": {0: [running(0), running(1), running(2), exited(-9, 2)],
              1: [running(3), running(4), exited(0, 5)]},
        "b": {0: [STARTING, running(1), running(2), exited(1, 2)],
              1: [running(3), running(4), exited(0, 5)]},
    })  # fmt: skip
    assert run_supervised(tmp_path, backend, inventory(tmp_path)) is WorkerState.SUCCEEDED
    # Once per attempt, after both workers stepped (b had not at the first poll); the restart
    # keeps them (no discard until the run ended), the end discards them.
    assert backend.events == [
        "start", "standbys for attempt 0", "start", "standbys for attempt 1", "discard",
    ]  # fmt: skip


def test_a_resumed_worker_has_stepped_only_past_the_step_it_began_at(tmp_path: Path) -> None:
    # The built-in loop reports its start step at once (a restored 150), before it traced and
    # made its first step: standbys importing TensorFlow then would slow exactly that.
    script = {0: [running(150, start_step=150), running(150, start_step=150),
                  running(151, start_step=150), exited(0, 160)]}  # fmt: skip
    backend = StandbyBackend(scripts={"a": script, "b": script})
    assert run_supervised(tmp_path, backend, inventory(tmp_path)) is WorkerState.SUCCEEDED
    assert backend.events == ["start", "standbys for attempt 0", "discard"]
    assert backend.standby_polls == [3]  # after the poll that saw step 151, not the first


def test_no_standby_when_no_restart_is_left_or_warm_restarts_are_off(tmp_path: Path) -> None:
    script = {0: [running(1), running(2), exited(0, 3)]}
    for index, job in enumerate(({"max_restarts": 0}, {"warm_restarts": False})):
        backend = StandbyBackend(scripts={"a": script, "b": script})
        state = run_supervised(tmp_path / str(index), backend, inventory(tmp_path, **job))
        assert state is WorkerState.SUCCEEDED
        assert backend.events == ["start", "discard"]


def test_up_starts_the_first_attempts_standbys_before_its_checks(tmp_path: Path) -> None:
    # Before any start (attempt -1 of the fake), for the slots of attempt 0 of this very run: the
    # launch then hands each slot's first worker to its standby.
    backend = StandbyBackend()
    inv = inventory(tmp_path)
    with first_standbys(inv, "r1", backend, linger=120):
        record = start_run(inv, RunStore(tmp_path / "state"), backend, run_id="r1")
    assert backend.events == ["standbys for attempt -1", "start"]
    assert backend.standby_dirs == [w.run_dir for w in record.workers]
    assert all("/r1/attempt-0/" in d for d in backend.standby_dirs)
    # A failed check (or Ctrl-C) before the launch leaves none behind.
    backend = StandbyBackend()
    with pytest.raises(RunStateError), first_standbys(inv, "r2", backend, linger=120):
        raise RunStateError("a blocking finding")
    assert backend.events == ["standbys for attempt -1", "discard"]
    # warm_restarts: false covers the first start too.
    backend = StandbyBackend()
    with first_standbys(inventory(tmp_path, warm_restarts=False), "r3", backend, linger=120):
        pass
    assert backend.events == []
    # Nor on a backend that keeps no standbys (Slurm): not even its workdirs are asked for.
    plain = FakeBackend(dead_hosts={"a": "would fail if asked"})
    with first_standbys(inv, "r4", plain, linger=120):
        pass
