"""Warm restarts, the pure decisions: may a standby serve an attempt, what it must share with it,
where it lives, the job key, and when the supervisor asks for standbys and discards them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator import contract
from orchestrator.backends.base import Standbys
from orchestrator.backends.registry import load_inventory
from orchestrator.contract import BOOT_MARKER, booted
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.policy import linger_seconds, with_warm_default
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import first_standbys, start_run
from orchestrator.errors import InventoryError, RunStateError
from orchestrator.fanout import GroupResult
from orchestrator.hostside import rundir, standbys
from orchestrator.hostside import standbypolicy as policy
from orchestrator.model.answers import StandbyInfo
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.records import WorkerRecord
from orchestrator.model.vocabulary import WorkerState
from orchestrator.model.workers import Started, WorkerSpec
from tests.fakes.backend import FakeBackend, exited, running
from tests.fakes.planning import plan_workers

REPO = Path(__file__).resolve().parents[2]

PYTHON = "/opt/venv/bin/python"
ARGV = [PYTHON, "-m", "worker", "--task", "m:f", "--steps", "10"]
ENV = {"PATH": "/usr/bin", "TF_USE_LEGACY_KERAS": "1", "TOKEN": "s3cret"}


def standby(env: dict[str, str] = ENV, **fields: object) -> dict[str, object]:
    """A standby's state as the agent reads it: spec.json's fields, alive, ready."""
    salt = "0123"
    state: dict[str, object] = {"python": PYTHON, "salt": salt, "alive": True, "ready": True,
                                "digest": policy.env_digest(salt, PYTHON, env)}  # fmt: skip
    state.update(fields)
    return state


def test_a_standby_with_the_same_interpreter_and_environment_may_serve() -> None:
    assert policy.standby_refusal(standby(), ARGV, ENV) is None
    # Still importing TensorFlow: it reads the hand-over after the import, sooner than a cold
    # start would have imported it (`up` starts the first attempt's before its checks).
    assert policy.standby_refusal(standby(ready=False), ARGV, ENV) is None


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
    refusal = policy.standby_refusal(state, argv, env)
    assert refusal is not None and why in refusal


def test_only_per_attempt_values_may_differ_between_a_standby_and_its_attempt() -> None:
    base = {"PATH": "/usr/bin", "SSH_CONNECTION": "10.0.0.1 51234 10.0.0.2 22"}
    first = policy.import_env(base, {"ORCHESTRATE_RUN_DIR": "/r/attempt-0/w", "X": "1"}, {"S": "v"})
    second = policy.import_env(
        {**base, "SSH_CONNECTION": "10.0.0.1 60000 10.0.0.2 22"},
        {"ORCHESTRATE_RUN_DIR": "/r/attempt-1/w", "ORCHESTRATE_PROGRESS_FILE": "/p", "X": "1"},
        {"S": "v"},
    )
    assert first == second == {"PATH": "/usr/bin", "X": "1", "S": "v"}
    # The agent is sent alone (stdlib only): its copy of the names is contract's.
    assert {contract.TF_CONFIG_ENV, contract.RUN_DIR_ENV, contract.PROGRESS_FILE_ENV} <= set(
        policy.PER_ATTEMPT_ENV
    )
    assert contract.RUN_ID_ENV not in policy.PER_ATTEMPT_ENV  # the same for every attempt
    assert contract.RUN_ID_ENV in policy.PER_RUN_ENV  # but not for the job's next run
    assert "SSH_CONNECTION" in policy.PER_CONNECTION_ENV


def test_the_digest_hides_the_values_and_depends_on_the_salt() -> None:
    digest = policy.env_digest("a", PYTHON, ENV)
    assert "s3cret" not in digest and digest != policy.env_digest("b", PYTHON, ENV)


def test_the_command_lines_a_standby_runs() -> None:
    assert policy.runnable_argv(ARGV) == ("module", "worker", ARGV[3:])
    assert policy.runnable_argv([PYTHON, "/job/train.py", "--lr", "1"]) == (
        "script", "/job/train.py", ["--lr", "1"],
    )  # fmt: skip
    assert policy.runnable_argv([PYTHON, "-u", "train.py"]) is None
    assert policy.runnable_argv([PYTHON]) is None
    # A script behind the stacks boot (what plan_workers gives a script job) is a script.
    assert policy.runnable_argv(list(booted((PYTHON, "/job/train.py", "--lr", "1")))) == (
        "script", "/job/train.py", ["--lr", "1"],
    )  # fmt: skip
    assert policy.runnable_argv([PYTHON, "-c", "print(1)", "x.py"]) is None  # other code: no
    assert policy.contract.BOOT_MARKER == BOOT_MARKER  # the contract's, carried with the agent


def inventory(tmp_path: Path, **job: object) -> Inventory:
    hosts = tuple(WorkerSlot(name, f"10.0.0.{i + 1}", 20000) for i, name in enumerate("ab"))
    options = {"restart_backoff": 0, "max_restarts": 3, "warm_restarts": True, **job}
    return Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts,
                     Job("demo", script="train.py", **options))  # type: ignore[arg-type]  # fmt: skip


def test_one_standby_per_job_and_slot_shared_by_the_jobs_runs(tmp_path: Path) -> None:
    specs = plan_workers(inventory(tmp_path), "r1", {"a": "/w", "b": "/w"}, attempt=2)
    assert rundir.standby_dir(specs[0].run_dir) == "/w/demo/standby/a"
    assert rundir.run_of(specs[0].run_dir) == "/w/demo/runs/r1"
    next_attempt = plan_workers(inventory(tmp_path), "r1", {"a": "/w", "b": "/w"}, attempt=3)
    assert rundir.standby_dir(next_attempt[0].run_dir) == rundir.standby_dir(specs[0].run_dir)
    # The next run (a new run id) finds the slot's standby where the last one left it.
    next_run = plan_workers(inventory(tmp_path), "r2", {"a": "/w", "b": "/w"}, attempt=0)
    assert rundir.standby_dir(next_run[0].run_dir) == rundir.standby_dir(specs[0].run_dir)
    assert rundir.standby_dir(next_run[1].run_dir) == "/w/demo/standby/b"


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
class StandbyBackend(FakeBackend, Standbys):
    """The fake backend, recording what the supervisor asks of standbys and when."""

    events: list[str] = field(default_factory=list)
    standby_dirs: list[str] = field(default_factory=list)  # the slots' run dirs, in order
    standby_polls: list[int] = field(default_factory=list)  # the polls made before each ask

    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, Started]:
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

    def linger_standbys(
        self, workers: Sequence[WorkerRecord], seconds: float
    ) -> GroupResult[str, str]:
        self.events.append(f"linger {seconds:g}")
        return GroupResult({w.name: "lingering" for w in workers})

    def standbys(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, StandbyInfo | None]:
        return GroupResult(dict.fromkeys((w.name for w in workers), None))

    @property
    def keeper(self) -> Standbys:
        return self


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
    jobs: tuple[dict[str, object], ...] = ({"max_restarts": 0}, {"warm_restarts": False})
    for index, job in enumerate(jobs):
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


# --- between runs (job.linger): which standby may serve which slot of which run ---------------

R1_ATTEMPT = "/w/demo/runs/r1/attempt-2/a"
R2_ATTEMPT = "/w/demo/runs/r2/attempt-0/a"
AGENT = "agent-v1"


def lingering(**fields: object) -> dict[str, object]:
    """The standby run r1 left lingering: released by its end (`until`), its attempt over."""
    base: dict[str, object] = {"backs": R1_ATTEMPT, "agent": AGENT, "until": 1000.0,
                               "backing_alive": False}  # fmt: skip
    return standby(ENV, **{**base, **fields})


def verdict(state: dict[str, object] | None, backs: str = R2_ATTEMPT,
            env: dict[str, str] = ENV, now: float = 900.0) -> tuple[str, str | None]:  # fmt: skip
    return policy.standby_verdict(state, backs, PYTHON, env, AGENT, now=now)


def test_the_next_run_takes_the_standby_the_last_one_left_lingering() -> None:
    assert verdict(lingering()) == ("take", None)
    # The same run asking again for the same attempt keeps it; for its next attempt, takes it.
    own = standby(backs=R2_ATTEMPT, agent=AGENT, backing_alive=True)
    assert verdict(own) == ("keep", None)
    assert verdict(own, backs="/w/demo/runs/r2/attempt-1/a") == ("take", None)
    # A run that ended without releasing them (its supervisor was killed): free to take too.
    assert verdict(standby(backs=R1_ATTEMPT, agent=AGENT, backing_alive=False))[0] == "take"


@pytest.mark.parametrize(
    ("state", "env", "now", "why"),
    [
        (None, ENV, 900.0, None),
        (lingering(alive=False), ENV, 900.0, None),
        (lingering(), ENV, 1000.0, "linger ran out"),
        (lingering(), {**ENV, "TF_USE_LEGACY_KERAS": "0"}, 900.0, "environment differs"),
        (lingering(python="/usr/bin/python3"), ENV, 900.0, "this run /opt/venv/bin/python"),
        (lingering(agent="agent-v0"), ENV, 900.0, "another version of orchestrate"),
    ],
)
def test_a_stale_or_expired_lingering_standby_is_replaced_saying_why(
    state: dict[str, object] | None, env: dict[str, str], now: float, why: str | None
) -> None:
    action, reason = verdict(state, env=env, now=now)
    assert action == "replace"
    assert reason == why if why is None else why in (reason or "")


def test_a_standby_of_another_run_that_still_runs_is_left_alone() -> None:
    busy = standby(backs=R1_ATTEMPT, agent=AGENT, backing_alive=True)  # r1 trains, not released
    action, reason = verdict(busy)
    assert action == "leave" and "serves run r1, which still runs" in (reason or "")
    assert policy.foreign_standby(busy, R2_ATTEMPT) == reason
    assert policy.foreign_standby(busy, "/w/demo/runs/r1/attempt-3/a") is None  # r1's own
    assert policy.foreign_standby(lingering(), R2_ATTEMPT) is None


def test_the_gpus_an_attempt_sees_are_set_per_attempt_outside_the_digest() -> None:
    """CUDA_VISIBLE_DEVICES is read when a device is first used (the strategy), after the
    hand-over: a standby imported with GPU 0 serves a run given GPU 1 (no GPU here: the
    decision only; the worker's environment is the attempt's, see worker/standby.become)."""
    first = policy.import_env({"PATH": "/usr/bin"}, {"CUDA_VISIBLE_DEVICES": "0", "X": "1"}, {})
    second = policy.import_env({"PATH": "/usr/bin"}, {"CUDA_VISIBLE_DEVICES": "1", "X": "1"}, {})
    assert first == second == {"PATH": "/usr/bin", "X": "1"}
    assert verdict(lingering(digest=policy.env_digest("0123", PYTHON, first)), env=second)[0] == (
        "take"
    )


def test_the_listing_says_which_standbys_linger_and_how_long() -> None:
    line = policy.standby_summary("a", {**lingering(pid=10, worker_pid=11)}, 940.0, 587 << 20)
    assert line["lingering"] is True and line["left_s"] == 60.0 and line["run_id"] == "r1"
    assert (line["pid"], line["worker_pid"], line["rss_bytes"]) == (10, 11, 587 << 20)
    waiting = policy.standby_summary("a", standby(backs=R2_ATTEMPT), 940.0, None)
    assert waiting["lingering"] is False and waiting["left_s"] is None


def test_linger_is_a_job_key_with_a_default_the_environment_may_set(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(JOB_INVENTORY))
    job = load_inventory(path).job
    assert job.linger is None
    assert linger_seconds(job, {}) == 300
    assert linger_seconds(job, {"ORCHESTRATE_LINGER": "0"}) == 0
    with pytest.raises(InventoryError) as caught:
        linger_seconds(job, {"ORCHESTRATE_LINGER": "soon"})
    assert "ORCHESTRATE_LINGER" in caught.value.message
    path.write_text(textwrap.dedent(JOB_INVENTORY) + "  linger: 30\n")
    assert linger_seconds(load_inventory(path).job, {"ORCHESTRATE_LINGER": "0"}) == 30
    path.write_text(textwrap.dedent(JOB_INVENTORY) + "  linger: -1\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert "job.linger" in caught.value.message


def test_warm_restarts_left_out_take_the_environments_default(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(textwrap.dedent(JOB_INVENTORY))
    inventory = load_inventory(path)
    assert inventory.job.warm_restarts is None and inventory.job.warm  # a task: on
    assert with_warm_default(inventory, {}).job.warm
    assert with_warm_default(inventory, {"ORCHESTRATE_WARM_RESTARTS": " "}).job.warm
    off = with_warm_default(inventory, {"ORCHESTRATE_WARM_RESTARTS": "0"})
    assert off.job.warm_restarts is False and not off.job.warm
    assert off.hosts == inventory.hosts and off.job.task == inventory.job.task
    with pytest.raises(InventoryError) as caught:
        with_warm_default(inventory, {"ORCHESTRATE_WARM_RESTARTS": "yes"})
    assert "ORCHESTRATE_WARM_RESTARTS" in caught.value.message
    # What the inventory says wins, and then the variable is not even read.
    path.write_text(textwrap.dedent(JOB_INVENTORY) + "  warm_restarts: true\n")
    kept = load_inventory(path)
    assert with_warm_default(kept, {"ORCHESTRATE_WARM_RESTARTS": "0"}).job.warm
    assert with_warm_default(kept, {"ORCHESTRATE_WARM_RESTARTS": "yes"}).job.warm


def test_a_run_that_ended_leaves_its_standbys_lingering_unless_linger_is_0(
    tmp_path: Path,
) -> None:
    script = {0: [running(1), running(2), exited(0, 3)]}
    for index, (linger, last) in enumerate(((30, "linger 30"), (0, "discard"))):
        backend = StandbyBackend(scripts={"a": script, "b": script})
        # No restart left: standbys all the same, for the job's next run (unless linger: 0).
        inv = inventory(tmp_path, max_restarts=0, linger=linger)
        assert run_supervised(tmp_path / str(index), backend, inv) is WorkerState.SUCCEEDED
        # Linger: asked for once the workers stepped, and again at the end (the agent keeps
        # those it has: a run too short for the first ask still leaves them), then released.
        asked = ["standbys for attempt 0"] * 2 if linger else []
        assert backend.events == ["start", *asked, last]


def test_the_run_id_is_the_next_runs_own_outside_the_digest() -> None:
    first = policy.import_env({}, {contract.RUN_ID_ENV: "r1", contract.WORKER_ENV: "a"}, {})
    second = policy.import_env({}, {contract.RUN_ID_ENV: "r2", contract.WORKER_ENV: "a"}, {})
    assert first == second == {contract.WORKER_ENV: "a"}


def test_a_package_installed_since_the_standbys_import_makes_it_stale(tmp_path: Path) -> None:
    """worker.standby records its package directories' times when TensorFlow is imported; a
    `pip install` since changes one: the standby neither serves a restart nor the next run."""
    site = tmp_path / "venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    ready = tmp_path / "ready"
    ready.write_text(json.dumps({"package_dirs": {str(site): site.stat().st_mtime_ns}}))
    assert standbys.packages_changed(str(ready)) is None
    (site / "newpkg").mkdir()
    os.utime(site, ns=(site.stat().st_atime_ns, site.stat().st_mtime_ns + 1))
    assert standbys.packages_changed(str(ready)) == str(site)
    stale = lingering(packages_changed=str(site))
    action, why = verdict(stale)
    assert action == "replace" and f"packages changed in {site}" in (why or "")
    assert f"packages changed in {site}" in (policy.standby_refusal(stale, ARGV, ENV) or "")


def test_a_standby_becomes_a_worker_with_the_attempts_gpus(tmp_path: Path) -> None:
    """The hand-over's environment is the attempt's, set before the script runs (no TensorFlow
    here: CUDA reads CUDA_VISIBLE_DEVICES when the strategy first uses a device, after this)."""
    script = tmp_path / "show.py"
    script.write_text("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])\n")
    request = {"argv": [sys.executable, str(script)], "cwd": str(tmp_path),
               "env": {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}}  # fmt: skip
    code = f"from worker.standby import become; become({request!r})"
    shown = subprocess.run([sys.executable, "-c", code], env={**os.environ,
                           "CUDA_VISIBLE_DEVICES": "0"}, cwd=REPO, capture_output=True,
                           text=True, check=True, timeout=30)  # fmt: skip
    assert shown.stdout.strip() == "1"
