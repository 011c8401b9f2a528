"""Roles on Slurm (issue 45): `slurm.roles:` and its refusals with their lines, each task's
role in the batch script's plan, the launcher's TF_CONFIG from the plan and a node list (held to
engine/workers/tfconfig.py's for the same cluster), the launcher's restarts in place of a real
worker process (restarts.json, exit.json, what srun is told), and the supervisor recording and
telling those restarts without starting anything itself (a fake backend that restarts in place)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.backends.slurm.script import batch_script, plan
from orchestrator.engine.workers.tfconfig import tf_config as hosts_tf_config
from orchestrator.errors import InventoryError, JobFailed
from orchestrator.hostside.slurm_launcher import restartable
from orchestrator.hostside.slurm_launcher import tf_config as launcher_tf_config
from orchestrator.model.inventory import Inventory
from orchestrator.model.records import Restart
from orchestrator.model.slurm import SlurmSpec
from tests.fakes.backend import FakeBackend, exited, running
from tests.fakes.planning import plan_workers
from tests.unit.test_ps_worker_restarts import SERVING, STOPPED, events, fake_ps_run
from tests.unit.test_slurm_plan import LAUNCHER_SOURCE

PS_JOB = "job:\n  name: demo\n  script: train.py\n  strategy: parameter-server\n  keras: legacy\n"
MWMS_JOB = "job:\n  name: demo\n  task: pkg.mod:task\n  steps: 10\n"


def write(tmp_path: Path, slurm: str, job: str = PS_JOB) -> Path:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "inv.yaml"
    path.write_text("slurm:\n" + slurm + job)
    return path


def spec_of(inventory: Inventory) -> SlurmSpec:
    spec = inventory.source_settings
    assert isinstance(spec, SlurmSpec), spec
    return spec


def problems_of(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as refused:
        load_inventory(path)
    return [str(problem) for problem in refused.value.problems]


def test_roles_give_each_task_its_role_in_tensorflows_order_and_the_nodes(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, "  roles: {ps: 1, worker: 2, chief: 1}\n"))
    assert spec_of(inventory).nodes == 4
    assert [(h.name, h.role) for h in inventory.hosts] == [
        ("task0", "chief"), ("task1", "worker"), ("task2", "worker"), ("task3", "ps")]  # fmt: skip
    both = load_inventory(write(tmp_path, "  nodes: 3\n  roles: {worker: 2, evaluator: 1}\n",
                                MWMS_JOB))  # fmt: skip
    assert [h.role for h in both.hosts] == ["worker", "worker", "evaluator"]
    plain = load_inventory(write(tmp_path, "  nodes: 2\n", MWMS_JOB))
    assert spec_of(plain).roles == ()
    assert {h.role for h in plain.hosts} == {"worker"}


@pytest.mark.parametrize(
    ("slurm", "job", "expected"),
    [
        ("  roles: {chief: 1, worker: 2}\n", PS_JOB, "inv.yaml:2: slurm.roles: job.strategy: "
         "parameter-server needs chief: 1, at least one ps and one worker; found 1 chief, 0 ps, "
         "2 worker"),
        ("  nodes: 3\n", PS_JOB, "inv.yaml:6: job.strategy: parameter-server on Slurm needs "
         "slurm.roles"),
        ("  roles:\n    worker: 2\n    ps: 1\n", MWMS_JOB,
         "inv.yaml:4: slurm.roles.ps: needs job.strategy: parameter-server"),
        ("  roles:\n    chief: 1\n    worker: 1\n", MWMS_JOB, "inv.yaml:3: slurm.roles.chief: "
         "needs job.strategy: parameter-server; under multi-worker task0 is the chief"),
        ("  roles:\n    chief: 2\n", PS_JOB,
         "inv.yaml:3: slurm.roles.chief: expected an integer from 0 to 1, got 2"),
        ("  roles:\n    evaluator: 1\n", MWMS_JOB,
         "inv.yaml:3: slurm.roles.evaluator: an evaluator needs tasks that train"),
        ("  roles: {chief: 1, worker: 1, ps: 1, boss: 1}\n", PS_JOB, "slurm.roles.boss"),
        ("  roles: [chief, worker]\n", PS_JOB,
         "inv.yaml:2: slurm.roles: expected a mapping of role: count"),
        ("  roles: {worker: 0}\n", MWMS_JOB, "inv.yaml:2: slurm.roles: no task"),
        ("  nodes: 3\n  roles: {chief: 1, worker: 2, ps: 1}\n", PS_JOB,
         "inv.yaml:2: slurm.nodes: 3, but slurm.roles asks for 4 task(s), one per node"),
        ("  nodes: 3\n  roles: {chief: 1, worker: 1}\n", PS_JOB,
         "needs chief: 1, at least one ps and one worker; found 1 chief, 0 ps, 1 worker"),
        ("  nodes: 2\n", MWMS_JOB + "  max_worker_restarts: 2\n",
         "inv.yaml:7: job.max_worker_restarts: applies under job.strategy: parameter-server"),
        ("  roles: {chief: 1, worker: 1, ps: 1}\n", PS_JOB + "min_hosts: 2\n",
         "inv.yaml:8: min_hosts: not under job.strategy: parameter-server"),
    ],
)  # fmt: skip
def test_each_bad_slurm_roles_combination_names_its_line(
    tmp_path: Path, slurm: str, job: str, expected: str
) -> None:
    found = problems_of(write(tmp_path, slurm, job))
    assert any(expected in problem for problem in found), found


def inventory_of(tmp_path: Path, roles: str, job: str = PS_JOB) -> Inventory:
    return load_inventory(write(tmp_path, f"  roles: {roles}\n  port: 2345\n", job))


def test_the_plan_carries_each_tasks_role_and_the_launcher_writes_the_hosts_tf_config(
    tmp_path: Path,
) -> None:
    inventory = inventory_of(tmp_path, "{chief: 1, worker: 2, ps: 2, evaluator: 1}")
    specs = plan_workers(inventory, "r", {h.name: "/shared" for h in inventory.hosts})
    tasks: list[dict[str, Any]] = plan(spec_of(inventory), specs)["tasks"]  # type: ignore[assignment]
    assert [(t["role"], t["task_index"]) for t in tasks] == [("chief", 0), ("worker", 0),
        ("worker", 1), ("ps", 0), ("ps", 1), ("evaluator", 0)]  # fmt: skip
    # Restarts in place: the workers their job.max_worker_restarts, the evaluator its three.
    assert [t.get("restarts") for t in tasks] == [None, 6, 6, None, None, 3]
    # The ps and workers end with the chief, the evaluator with the training (the chief).
    assert [t.get("ends_with") for t in tasks] == [None, *[[tasks[0]["run_dir"]]] * 5]
    nodes = [f"gpu{i:02d}" for i in range(6)]  # as Slurm gave them, in SLURM_PROCID order
    hosts = zip(inventory.hosts, nodes, strict=True)
    placed = replace(inventory, hosts=tuple(replace(h, address=n) for h, n in hosts))
    roles = [t["role"] for t in tasks]
    for index, task in enumerate(tasks):
        config = launcher_tf_config(nodes, 2345, index, roles)
        assert config == hosts_tf_config(placed, index)
        assert config["task"]["index"] == task["task_index"]
    assert "evaluator" not in launcher_tf_config(nodes, 2345, 5, roles)["cluster"]
    with pytest.raises(ValueError, match="6 task"):
        launcher_tf_config(nodes[:4], 2345, 0, roles)
    # A job without roles keeps the plan it had: no role keys, every task a worker.
    plain = load_inventory(write(tmp_path, "  nodes: 2\n", MWMS_JOB))
    plain_specs = plan_workers(plain, "r", {h.name: "/s" for h in plain.hosts})
    plain_tasks: list[dict[str, Any]] = plan(spec_of(plain), plain_specs)["tasks"]  # type: ignore[assignment]
    assert all(set(t) == {"run_dir", "private_dirs", "cwd", "argv", "env"} for t in plain_tasks)
    assert launcher_tf_config(["a", "b"], 1, 1) == {
        "cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}  # fmt: skip
    script = batch_script(spec_of(inventory), inventory.job, specs)
    assert "--nodes=6" in script and "(1 chief, 2 worker, 2 ps, 1 evaluator)" in script


@pytest.mark.parametrize(
    ("returncode", "joined", "signalled", "stop", "again"),
    [
        (-9, True, False, False, True),  # SIGKILL: the lost worker of the issue
        (1, None, False, False, True),  # a crash before TensorFlow said anything
        (0, True, False, False, False),  # done
        (75, True, False, False, False),  # a preemption's save
        (3, True, False, False, False),  # job.permanent_exit_codes
        (-15, True, False, False, False),  # SIGTERM: only a stop sends it
        (-9, True, True, False, False),  # the launcher passed a stop signal on
        (-9, True, False, True, False),  # orchestrate down's stop_requested
        (1, False, False, False, False),  # loaded TensorFlow, never listened: it never joined
    ],
)  # fmt: skip
def test_which_exit_the_launcher_restarts_in_place(
    returncode: int, joined: bool | None, signalled: bool, stop: bool, again: bool
) -> None:
    assert restartable(returncode, joined, [3], signalled, stop) is again


# A worker that dies of SIGKILL at its first `kills` starts, then exits `last`.
FLAKY = (
    "import os, signal, sys, json\n"
    "n = len(os.listdir('{starts}'))\n"
    "open(os.path.join('{starts}', str(n)), 'w').close()\n"
    "json.dump({{'step': 10 * (n + 1)}}, open(os.environ['ORCHESTRATE_PROGRESS_FILE'], 'w'))\n"
    "print('start', n, os.environ['TF_CONFIG'], flush=True)\n"
    "if n < {kills}: os.kill(os.getpid(), signal.SIGKILL)\n"
    "sys.exit({last})\n"
)


def launch(tmp_path: Path, role: str, restarts: int, kills: int, last: int) -> tuple[int, Path]:
    """The launcher of a two-task plan (chief, then this task) run for task 1 as srun would."""
    starts = tmp_path / "starts"
    starts.mkdir(parents=True)
    run_dir = tmp_path / "{SLURM_JOB_ID}" / "t1"
    code = FLAKY.format(starts=starts, kills=kills, last=last)
    task = {"run_dir": str(run_dir), "cwd": str(tmp_path), "role": role, "task_index": 0,
            "argv": [sys.executable, "-c", code], "restarts": restarts, "permanent": [3],
            "env": {"ORCHESTRATE_PROGRESS_FILE": str(run_dir / "progress.json")}}  # fmt: skip
    chief = {**task, "role": "chief", "restarts": 0}
    env = {"ORCHESTRATE_SLURM_PLAN": json.dumps({"port": 2222, "tasks": [chief, task]}),
           "SLURM_PROCID": "1", "SLURM_JOB_ID": "9", "SLURM_STEP_NODELIST": "n[1-2]",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", LAUNCHER_SOURCE], env=env, capture_output=True,
                          text=True, check=False, timeout=60)  # fmt: skip
    return done.returncode, tmp_path / "9" / "t1"


def test_the_launcher_restarts_a_lost_worker_in_place_and_records_each_restart(
    tmp_path: Path,
) -> None:
    returncode, run_dir = launch(tmp_path, "worker", restarts=3, kills=2, last=0)
    assert returncode == 0
    restarts = json.loads((run_dir / "restarts.json").read_text())
    assert [(r["returncode"], r["signal"], r["step"]) for r in restarts] == [
        (-9, "SIGKILL", 10), (-9, "SIGKILL", 20)]  # fmt: skip
    assert json.loads((run_dir / "exit.json").read_text())["returncode"] == 0
    starts = [line for line in (run_dir / "worker.log").read_text().splitlines()
              if line.startswith("start")]  # fmt: skip
    configs = {line.split(" ", 2)[2] for line in starts}
    assert len(starts) == 3 and len(configs) == 1  # the same TF_CONFIG, at the same address
    assert json.loads(configs.pop()) == {"cluster": {"chief": ["n1:2222"], "worker": ["n2:2222"]},
                                         "task": {"type": "worker", "index": 0}}  # fmt: skip


def test_a_spent_budget_ends_the_step_and_the_evaluator_never_does(tmp_path: Path) -> None:
    returncode, run_dir = launch(tmp_path / "w", "worker", restarts=1, kills=5, last=0)
    assert returncode == 128 + 9  # to srun: a bad exit, so --kill-on-bad-exit ends the step
    assert len(json.loads((run_dir / "restarts.json").read_text())) == 1
    assert json.loads((run_dir / "exit.json").read_text())["returncode"] == -9
    returncode, run_dir = launch(tmp_path / "p", "worker", restarts=4, kills=0, last=3)
    assert returncode == 3 and not (run_dir / "restarts.json").exists()  # permanent: no restart
    returncode, run_dir = launch(tmp_path / "e", "evaluator", restarts=1, kills=5, last=0)
    assert returncode == 0  # the training goes on; exit.json keeps the evaluator's failure
    assert json.loads((run_dir / "exit.json").read_text())["returncode"] == -9


def test_a_serving_worker_ends_with_its_chief_and_srun_is_told_it_succeeded(
    tmp_path: Path,
) -> None:
    """A ParameterServerStrategy worker serves until stopped: its launcher stops it once the
    chief's exit record says 0 (so an exported batch job ends without a supervisor), marks it
    stopped by whom, never restarts it, and exits 0 to srun."""
    chief_dir = tmp_path / "chief"
    chief_dir.mkdir()
    run_dir = tmp_path / "t1"
    serving = "import time\nprint('serving', flush=True)\nwhile True: time.sleep(0.1)\n"
    worker = {"run_dir": str(run_dir), "cwd": str(tmp_path), "env": {}, "role": "worker",
              "task_index": 0, "argv": [sys.executable, "-c", serving], "restarts": 6,
              "permanent": [], "ends_with": [str(chief_dir)],
              "ends_by": "after the chief finished"}  # fmt: skip
    chief = {**worker, "role": "chief", "run_dir": str(chief_dir), "restarts": 0}
    env = {"ORCHESTRATE_SLURM_PLAN": json.dumps({"port": 2222, "tasks": [chief, worker]}),
           "SLURM_PROCID": "1", "SLURM_JOB_ID": "9", "SLURM_STEP_NODELIST": "n[1-2]",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER_SOURCE], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            launcher.wait(timeout=3)  # serving while the chief trains
        (chief_dir / "exit.json").write_text(json.dumps({"returncode": 0}))
        output, _ = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, output
    assert "stopped after the chief finished" in output
    assert json.loads((run_dir / "exit.json").read_text())["returncode"] == -15
    assert json.loads((run_dir / "stop_requested").read_text())["by"] == "after the chief finished"
    assert not (run_dir / "restarts.json").exists()


class InPlaceBackend(FakeBackend):
    """The fake backend whose launchers restart workers in place, as Slurm's do."""

    restarts_in_place: ClassVar[bool] = True


def restarted(*steps: int) -> list[dict[str, Any]]:
    """restarts.json's entries: the worker killed by SIGKILL at each step."""
    return [{"returncode": -9, "signal": "SIGKILL", "started_at": 0.0,
             "finished_at": 10.0 + i, "step": step} for i, step in enumerate(steps)]  # fmt: skip


def test_the_supervisor_records_and_tells_the_launchers_restarts_and_starts_none(
    tmp_path: Path,
) -> None:
    backend = InPlaceBackend(scripts={
        "boss": {0: [running(5), running(10), running(15), exited(0, 20)]},
        "w0": {0: [SERVING, SERVING, SERVING, SERVING, STOPPED]},
        "w1": {0: [SERVING, {**SERVING, "restarts": restarted(40)},
                   {**SERVING, "restarts": restarted(40, 60)}, SERVING, STOPPED]},
        "p": {0: [SERVING, SERVING, SERVING, SERVING, STOPPED]},
    })  # fmt: skip
    supervisor, store = fake_ps_run(tmp_path, backend)
    said: list[str] = []
    supervisor.say = supervisor.sidecar.say = said.append
    status = supervisor.run()
    assert status.state.value == "succeeded"
    assert backend.started == [["boss", "w0", "w1", "p"]]  # the launcher restarted, not we
    lines = [f"worker w1 restarted ({n} of 6), the chief continued: w1 at step {s}: killed by "
             "SIGKILL" for n, s in ((1, 40), (2, 60))]  # fmt: skip
    assert [line for line in said if "restarted" in line] == lines
    record = store.load()
    assert [(r.worker, r.step, r.kind) for r in record.alone] == [
        ("w1", 40, "killed"), ("w1", 60, "killed")]  # fmt: skip
    assert record.restarts == () and record.attempt == 0
    told = [e["root_cause"] for e in events(tmp_path) if e["event"] == "restarting"]
    assert told == lines


def test_a_worker_whose_launcher_spent_its_budget_fails_the_run(tmp_path: Path) -> None:
    spent = {**exited(-9, 80), "restarts": restarted(40, 60)}
    backend = InPlaceBackend(scripts={
        "boss": {0: [running(5), running(10), running(15)]},
        "w0": {0: [SERVING]}, "p": {0: [SERVING]}, "w1": {0: [SERVING, spent]},
    })  # fmt: skip
    supervisor, store = fake_ps_run(tmp_path, backend, max_worker_restarts=2)
    with pytest.raises(JobFailed) as failed:
        supervisor.run()
    assert "failed again after 2 restart(s) by itself (max_worker_restarts: 2)" in (
        failed.value.message
    )
    assert backend.started == [["boss", "w0", "w1", "p"]]
    assert [r.step for r in store.load().alone] == [40, 60]
    assert isinstance(store.load().alone[0], Restart)
