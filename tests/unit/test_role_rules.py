"""Hosts' roles: the inventory's checks (each refused combination, with its line), TF_CONFIG
per role, the evaluator's command line, the TFJob's four replica types, and what the
supervisor does with roles (the chief's exit 0 ends a ParameterServerStrategy run; a failed
evaluator restarts alone) over the fake backend."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.engine.observe import rolepolicy as roles
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run
from orchestrator.engine.workers.tfconfig import tf_config
from orchestrator.errors import InventoryError
from orchestrator.export.tfjob import problems, tfjob
from orchestrator.model.answers import BY_DOWN
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.vocabulary import WorkerState
from tests.fakes.backend import FakeBackend, exited, running
from tests.fakes.planning import plan_workers

S = WorkerState


def write(tmp_path: Path, hosts: str, job: str = "script: train.py", top: str = "") -> Path:
    """Line 1 defaults, line 2 `hosts:`, a line per host, then `job:`, its keys, then `top`."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "inv.yaml"
    entries = "".join("  " + line.strip() + "\n" for line in hosts.strip().splitlines())
    path.write_text("defaults: {connection: local}\nhosts:\n" + entries
                    + f"job:\n  name: demo\n  {job}\n" + top)  # fmt: skip
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.exit_code == 2
    return [str(p) for p in caught.value.problems]


PS_HOSTS = """\
  - {name: w0, role: worker, address: localhost, port: 20001}
  - {name: ps0, role: ps, address: localhost, port: 20002}
  - {name: boss, role: chief, address: localhost, port: 20000}
  - {name: w1, address: localhost, port: 20003}
"""
PS_JOB = "script: train.py\n  strategy: parameter-server\n  keras: legacy"


def test_a_ps_inventory_loads_with_the_chief_first_and_tf_config_per_role(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, PS_HOSTS, PS_JOB))
    assert [(h.name, h.role) for h in inventory.hosts] == [
        ("boss", "chief"), ("w0", "worker"), ("ps0", "ps"), ("w1", "worker")]  # fmt: skip
    configs = [tf_config(inventory, i) for i in range(4)]
    assert configs[0]["cluster"] == {
        "chief": ["localhost:20000"],
        "worker": ["localhost:20001", "localhost:20003"],
        "ps": ["localhost:20002"],
    }
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0}, {"type": "worker", "index": 0},
        {"type": "ps", "index": 0}, {"type": "worker", "index": 1}]  # fmt: skip


def test_the_evaluator_is_in_no_cluster_and_runs_worker_evaluate(tmp_path: Path) -> None:
    hosts = """\
      - {name: ev, role: evaluator, address: localhost, port: 20009}
      - {name: a, address: localhost, port: 20000}
      - {name: b, address: localhost, port: 20001}
    """
    inventory = load_inventory(write(tmp_path, hosts, "task: pkg.mod:task\n  steps: 30"))
    assert [h.name for h in inventory.hosts] == ["a", "b", "ev"]  # the evaluator last
    config = tf_config(inventory, 2)
    assert config == {"cluster": {"worker": ["localhost:20000", "localhost:20001"]},
                      "task": {"type": "evaluator", "index": 0}}  # fmt: skip
    assert tf_config(inventory, 1)["task"] == {"type": "worker", "index": 1}
    specs = plan_workers(inventory, "r1", {"a": "/w", "b": "/w", "ev": "/w"})
    evaluator = specs[2]
    assert evaluator.argv == (evaluator.argv[0], "-m", "worker.evaluate",
                              "--watch", "--task", "pkg.mod:task",
                              "--checkpoint-dir", specs[0].checkpoint_dir,
                              "--steps", "30", "--batch-size", "64")  # fmt: skip
    assert evaluator.env["ORCHESTRATE_RUN_DIR"] == evaluator.run_dir
    assert evaluator.env["ORCHESTRATE_PROGRESS_FILE"] == evaluator.run_dir + "/progress.json"
    assert specs[0].argv[1:3] == ("-m", "worker")  # the training loop, as before


@pytest.mark.parametrize(("hosts", "job", "top", "said"), [
    ("  - {name: a, role: chief, address: localhost, port: 20000}\n"
     "  - {name: b, address: localhost, port: 20001}\n", "script: train.py", "",
     "inv.yaml:3: hosts[0].role: chief needs job.strategy: parameter-server; under "
     "multi-worker the first worker is the chief"),
    ("  - {name: a, address: localhost, port: 20000}\n"
     "  - {name: b, role: ps, address: localhost, port: 20001}\n", "script: train.py", "",
     "inv.yaml:4: hosts[1].role: ps needs job.strategy: parameter-server"),
    ("  - {name: a, role: chief, address: localhost, port: 20000}\n"
     "  - {name: b, role: worker, address: localhost, port: 20001}\n", PS_JOB, "",
     "inv.yaml:8: job.strategy: parameter-server needs exactly one 'role: chief', at least one "
     "'role: ps' and one 'role: worker' host; found 1 chief, 0 ps, 1 worker"),
    ("  - {name: a, role: chief, address: localhost, port: 20000}\n"
     "  - {name: c, role: chief, address: localhost, port: 20002}\n"
     "  - {name: p, role: ps, address: localhost, port: 20003}\n"
     "  - {name: b, address: localhost, port: 20001}\n", PS_JOB, "",
     "found 2 chief, 1 ps, 1 worker"),
    (PS_HOSTS, "task: pkg.mod:task\n  steps: 5\n  strategy: parameter-server\n"
     "  steps_per_call: 5", "", "inv.yaml:12: job.steps_per_call: not under job.strategy: "
     "parameter-server: each step is a closure the chief schedules on a worker"),
    ("  - {name: a, address: localhost, port: 20000}\n", "script: train.py\n"
     "  max_worker_restarts: 2", "", "inv.yaml:7: job.max_worker_restarts: applies under "
     "job.strategy: parameter-server only"),
    (PS_HOSTS, PS_JOB, "min_hosts: 2\n", "inv.yaml:12: min_hosts: not under job.strategy: "
     "parameter-server"),
    (PS_HOSTS, PS_JOB, "spares:\n  - {name: s, address: localhost, port: 20010}\n",
     "inv.yaml:12: spares: not under job.strategy: parameter-server"),
    ("  - {name: a, address: localhost, port: 20000}\n", "script: train.py",
     "spares:\n  - {name: s, role: evaluator, address: localhost, port: 20010}\n",
     "inv.yaml:8: spares[0].role: evaluator: a spare takes a worker's place"),
    ("  - {name: a, address: localhost, port: 20000}\n"
     "  - {name: e, role: evaluator, address: localhost, port: 20001}\n"
     "  - {name: f, role: evaluator, address: localhost, port: 20002}\n", "script: train.py", "",
     "inv.yaml:5: hosts[2].role: at most one evaluator; hosts[1] is one"),
    ("  - {name: e, role: evaluator, address: localhost, port: 20001}\n", "script: train.py", "",
     "inv.yaml:3: hosts[0].role: an evaluator needs hosts that train"),
    ("  - {name: a, address: localhost, port: 20000}\n"
     "  - {name: e, role: evaluator, address: localhost, port: 20001, workdir: /elsewhere}\n",
     "script: train.py", "",
     "inv.yaml:4: hosts[1].role: the evaluator reads the chief's checkpoints, but a's are on "
     "another machine or in another directory"),
    ("  - {name: a, address: localhost, port: 20000}\n"
     "  - {name: e, role: boss, address: localhost, port: 20001}\n", "script: train.py", "",
     "hosts[1].role: expected one of worker, chief, ps, evaluator, got 'boss'"),
])  # fmt: skip
def test_each_refused_combination_names_its_line(
    tmp_path: Path, hosts: str, job: str, top: str, said: str
) -> None:
    found = problems_of(write(tmp_path, hosts, job, top))
    assert any(said in problem for problem in found), found


def test_an_evaluator_on_another_ssh_machine_is_refused_on_the_same_one_accepted(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text("")
    base = "hosts:\n  - {name: a, address: 10.0.0.1, port: 20000}\n"
    job = "job: {name: demo, script: train.py}\n"
    other = tmp_path / "other.yaml"
    other.write_text(base + "  - {name: e, role: evaluator, address: 10.0.0.2, port: 20001}\n"
                     + job)  # fmt: skip
    assert any("reads the chief's checkpoints" in p for p in problems_of(other))
    same = tmp_path / "same.yaml"
    same.write_text(base + "  - {name: e, role: evaluator, address: 10.0.0.1, port: 20001}\n"
                    + job)  # fmt: skip
    assert load_inventory(same).hosts[1].role == "evaluator"


def test_slurm_parameter_server_needs_roles_and_ansible_stays_all_worker(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    slurm = tmp_path / "slurm.yaml"
    slurm.write_text("slurm:\n  nodes: 3\njob:\n  name: demo\n  script: train.py\n"
                     "  strategy: parameter-server\n")  # fmt: skip
    assert any("slurm.yaml:6: job.strategy: parameter-server on Slurm needs slurm.roles" in p
               for p in problems_of(slurm))  # fmt: skip
    (tmp_path / "hosts.ini").write_text("[trainers]\nnode1 tf_port=20000 role=chief\n")
    ansible = tmp_path / "ansible.yaml"
    ansible.write_text("ansible: {inventory: hosts.ini, group: trainers}\n"
                       "defaults: {role: ps}\njob: {name: demo, script: train.py}\n")  # fmt: skip
    found = problems_of(ansible)
    assert any("ansible[node1].role: ps: the hosts of an Ansible inventory are all workers" in p
               for p in found), found  # fmt: skip


def test_tfjob_with_four_replica_types_validates(tmp_path: Path) -> None:
    evaluator = "  - {name: ev, role: evaluator, address: localhost, port: 20009}\n"
    inventory = load_inventory(write(tmp_path, PS_HOSTS + evaluator, PS_JOB))
    manifest = tfjob(inventory, "me/train:1")
    assert problems(manifest) == []  # the CRD's schema and the operator's webhook rules
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert {kind: spec["replicas"] for kind, spec in specs.items()} == {
        "Chief": 1, "PS": 1, "Worker": 2, "Evaluator": 1}  # fmt: skip
    two = dict(manifest, spec={**manifest["spec"], "tfReplicaSpecs": {
        **specs, "Evaluator": {**specs["Evaluator"], "replicas": 2}}})  # fmt: skip
    assert "spec.tfReplicaSpecs.Evaluator.replicas: at most one Evaluator" in problems(two)
    task = load_inventory(write(tmp_path, "  - {name: a, address: localhost, port: 20000}\n"
                                + evaluator, "task: pkg.mod:task\n  steps: 30"))  # fmt: skip
    args = tfjob(task, "me/train:1")["spec"]["tfReplicaSpecs"]["Evaluator"]["template"]
    assert args["spec"]["containers"][0]["args"][:4] == ["python", "-m", "worker.evaluate",
                                                         "--watch"]  # fmt: skip


def test_run_state_and_who_counts() -> None:
    ps = [("chief", S.SUCCEEDED), ("worker", S.RUNNING), ("ps", S.RUNNING)]
    assert roles.run_state(ps) is S.RUNNING  # the others are still to be stopped
    assert roles.to_stop(ps) == [1, 2]
    assert roles.training(ps) == [] and roles.watched(ps) == []
    done = [("chief", S.SUCCEEDED), ("worker", S.STOPPED), ("ps", S.FAILED)]
    assert roles.run_state(done) is S.SUCCEEDED and roles.to_stop(done) == []
    training = [("chief", S.RUNNING), ("worker", S.STARTING), ("ps", S.STARTING)]
    assert roles.watched(training) == [0]  # only the chief's steps
    # Any lost task is the training's: a worker that cannot restart alone restarts the cluster.
    assert roles.training(training) == [0, 1, 2]
    assert roles.run_state([("chief", S.RUNNING), ("ps", S.FAILED)]) is S.FAILED
    mwms = [("worker", S.RUNNING), ("worker", S.RUNNING), ("evaluator", S.FAILED)]
    assert roles.run_state(mwms) is S.RUNNING  # its failure is not the training's
    assert roles.training(mwms) == [0, 1] and roles.watched(mwms) == [0, 1]
    assert roles.evaluator_restart(mwms, 0) == 2
    assert roles.evaluator_restart(mwms, roles.EVALUATOR_RESTARTS) is None
    waiting = [("worker", S.SUCCEEDED), ("evaluator", S.RUNNING)]
    assert roles.run_state(waiting) is S.RUNNING  # the final checkpoint's evaluation
    assert roles.evaluator_restart([("worker", S.SUCCEEDED), ("evaluator", S.FAILED)], 0) is None
    assert roles.run_state([("worker", S.SUCCEEDED), ("evaluator", S.FAILED)]) is S.SUCCEEDED


def fake_run(
    tmp_path: Path, hosts: tuple[WorkerSlot, ...], backend: FakeBackend, **job: Any
) -> Any:
    inventory = Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts,
                          Job("demo", restart_backoff=0, **job))  # fmt: skip
    store = RunStore(tmp_path / "state")
    record = start_run(inventory, store, backend)
    supervisor = Supervisor(store, backend, record, interval=0)
    return supervisor.run(), supervisor.record


SERVING = {"exists": True, "pid": 100, "alive": True, "worker_pid": 101, "progress": None}
STOPPED = {**exited(-15), "stop_requested": True}


def test_the_chief_exit_stops_the_ps_and_workers_as_stopped(tmp_path: Path) -> None:
    hosts = (WorkerSlot("boss", "10.0.0.1", 1, role="chief"), WorkerSlot("w", "10.0.0.2", 1),
             WorkerSlot("p", "10.0.0.3", 1, role="ps"))  # fmt: skip
    backend = FakeBackend(scripts={
        "boss": {0: [running(5), exited(0, 20)]},
        "w": {0: [SERVING, SERVING, STOPPED]},
        "p": {0: [SERVING, SERVING, STOPPED]},
    })  # fmt: skip
    status, _ = fake_run(tmp_path, hosts, backend, script="t.py", steps=20,
                         strategy="parameter-server")  # fmt: skip
    assert status.state is S.SUCCEEDED
    assert backend.stops == [["w", "p"]]  # the chief's end, no restart
    assert backend.stopped_by == ["after the chief finished"]  # what their status will say
    assert [(w.name, w.role, w.state.value) for w in status.workers] == [
        ("boss", "chief", "succeeded"),
        ("w", "worker", "stopped"),
        ("p", "ps", "stopped"),
    ]


def test_a_failed_evaluator_restarts_alone_and_the_training_goes_on(tmp_path: Path) -> None:
    hosts = (WorkerSlot("a", "127.0.0.1", 1, connection="local"),
             WorkerSlot("b", "127.0.0.1", 2, connection="local"),
             WorkerSlot("e", "127.0.0.1", 3, connection="local", role="evaluator"))  # fmt: skip
    backend = FakeBackend(scripts={
        "a": {0: [running(3)], 1: [running(5), exited(0, 10)]},
        "b": {0: [running(3)], 1: [running(5), exited(0, 10)]},
        "e": {0: [exited(1, error="boom")], 1: [running(5), exited(0)]},
    })  # fmt: skip
    status, record = fake_run(tmp_path, hosts, backend, task="m:t", steps=10)
    assert status.state is S.SUCCEEDED and status.restarts == ()  # the training's, none
    assert backend.started == [["a", "b", "e"], ["e"]]  # the evaluator alone
    assert record.workers[2].run_dir.endswith("/attempt-0/e-restart1")
    assert status.workers[2].role == "evaluator"


def test_roles_are_shown_in_status_the_dashboard_and_the_root_cause(tmp_path: Path) -> None:
    from rich.console import Console

    from orchestrator.cli.render import progress_line, status_table
    from orchestrator.dashboard.model import root_cause
    from orchestrator.engine.observe.failures import Failure
    from orchestrator.engine.supervision.policy import give_up_message
    from orchestrator.model.vocabulary import FailureKind

    hosts = (WorkerSlot("boss", "10.0.0.1", 1, role="chief"), WorkerSlot("w", "10.0.0.2", 1),
             WorkerSlot("p", "10.0.0.3", 1, role="ps"))  # fmt: skip
    backend = FakeBackend(scripts={"boss": {0: [running(5), exited(0, 20)]},
                                   "w": {0: [SERVING, SERVING, STOPPED]},
                                   "p": {0: [SERVING, SERVING, STOPPED]}})  # fmt: skip
    status, record = fake_run(tmp_path, hosts, backend, script="t.py", steps=20,
                              strategy="parameter-server")  # fmt: skip
    console = Console(record=True, width=200)
    console.print(status_table(status))
    shown = console.export_text()
    assert "boss (chief)" in shown and "p (ps)" in shown and "w (" not in shown
    assert progress_line(status.workers[2]).startswith("p (ps): stopped")
    assert status.to_json()["workers"][2]["role"] == "ps"  # the dashboard's document
    failed = replace(status, state=S.FAILED, workers=(
        replace(status.workers[2], state=S.FAILED, reason="killed by SIGKILL"),))  # fmt: skip
    assert root_cause(record, failed) == "p (ps): killed by SIGKILL"
    message = give_up_message(Failure("p", FailureKind.KILLED, "killed by SIGKILL", 5), (),
                              "it used all 3 restarts", 3, "ps")  # fmt: skip
    assert "the worker that failed first: p (the ps) at step 5: killed by SIGKILL" in message


def test_a_trainjob_export_refuses_roles(tmp_path: Path) -> None:
    from orchestrator.export.trainjob import refusals

    inventory = load_inventory(write(tmp_path, PS_HOSTS, PS_JOB))
    refused = refusals(inventory, "claim", None)
    assert any("hosts with role chief, ps: a TrainJob's pods are all workers" in r
               for r in refused), refused  # fmt: skip
    plain = load_inventory(write(tmp_path, "  - {name: a, address: localhost, port: 20000}\n"))
    assert refusals(plain, "claim", None) == []


def test_the_hosts_command_shows_each_hosts_role(tmp_path: Path) -> None:
    """`orchestrate hosts` (table and --json) of a parameter-server inventory with an
    evaluator: the chief first, then each host's own role, as status shows them."""
    from click.testing import CliRunner

    from orchestrator.cli.hosts import hosts

    evaluator = "  - {name: judge, role: evaluator, address: localhost, port: 20004}\n"
    path = write(tmp_path, PS_HOSTS + evaluator, PS_JOB)
    shown = CliRunner().invoke(hosts, ["--json", str(path)])
    assert shown.exit_code == 0, shown.output
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(r["name"], r["role"]) for r in rows] == [
        ("boss", "chief"), ("w0", "worker"), ("ps0", "ps"), ("w1", "worker"),
        ("judge", "evaluator")]  # fmt: skip
    table = CliRunner().invoke(hosts, [str(path)], terminal_width=200)
    cells = [[cell.strip() for cell in line.split("│")[1:3]]
             for line in table.stdout.splitlines() if line.startswith("│")]  # fmt: skip
    assert cells == [["boss", "chief"], ["w0", "worker"], ["ps0", "ps"],
                     ["w1", "worker"], ["judge", "evaluator"]]  # fmt: skip


class StoppingBackend(FakeBackend):
    """The fake backend whose stop ends the stopped workers as the agent does: their next probe
    says exit 0 at step 5 of 10, with the stop request and who made it."""

    def stop(self, workers: Any, grace: float, by: str = BY_DOWN) -> Any:
        for worker in workers:
            ended = exited(0, 5) | {"stop_requested": True, "stopped_by": by}
            ended["progress"]["target_steps"] = 10
            self.scripts[worker.name] = {self.attempt: [ended]}
        return super().stop(workers, grace, by)


def test_the_evaluator_gets_stall_timeout_after_the_training_then_sigterm(tmp_path: Path) -> None:
    hosts = (WorkerSlot("a", "127.0.0.1", 1, connection="local"),
             WorkerSlot("e", "127.0.0.1", 3, connection="local", role="evaluator"))  # fmt: skip
    backend = StoppingBackend(scripts={
        "a": {0: [running(5), exited(0, 10)]},
        "e": {0: [running(5)]},  # evaluating for ever, until stopped
    })  # fmt: skip
    started = time.monotonic()
    status, _ = fake_run(tmp_path, hosts, backend, task="m:t", steps=10, stall_timeout=1)
    assert time.monotonic() - started >= 1.0  # it waited stall_timeout for the evaluator
    assert status.state is S.SUCCEEDED
    assert backend.stops == [["e"]] and backend.graces == [1.0]  # SIGTERM, a grace to evaluate
    # Its exit 0 below the target is its end when stopped, not an early exit.
    evaluator = status.workers[1]
    assert (evaluator.state, evaluator.reason) == (S.STOPPED, "stopped after the training finished")


def test_a_dead_evaluator_is_neither_replaced_by_a_spare_nor_counted(tmp_path: Path) -> None:
    from orchestrator.engine.supervision.replan import plan_cluster

    hosts = (WorkerSlot("a", "10.0.0.1", 1), WorkerSlot("b", "10.0.0.2", 1),
             WorkerSlot("e", "10.0.0.9", 1, role="evaluator"))  # fmt: skip
    inventory = Inventory("inv.yaml", "/", hosts, Job("demo", task="m:t", steps=5, batch_size=2),
                          spares=(WorkerSlot("s", "10.0.0.3", 1),))  # fmt: skip
    plan = plan_cluster(inventory, [], {"e": "no route"})
    assert [h.name for h in plan.hosts] == ["a", "b"] and [h.name for h in plan.spares] == ["s"]
    assert [h.name for h in plan.dropped] == ["e"] and plan.problem is None
    worker_lost = plan_cluster(inventory, [], {"b": "no route"})
    assert [h.name for h in worker_lost.hosts] == ["a", "s", "e"]  # the spare for the worker


def test_under_a_script_job_the_evaluator_runs_the_same_script(tmp_path: Path) -> None:
    hosts = """\
      - {name: a, address: localhost, port: 20000}
      - {name: ev, role: evaluator, address: localhost, port: 20009}
    """
    inventory = load_inventory(write(tmp_path, hosts))
    specs = plan_workers(inventory, "r1", {"a": "/w", "ev": "/w"})
    assert specs[1].argv == specs[0].argv  # the script branches on its TF_CONFIG task type
    assert specs[1].tf_config["task"] == {"type": "evaluator", "index": 0}
    assert specs[0].tf_config["cluster"] == {"worker": ["localhost:20000"]}
