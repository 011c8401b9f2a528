"""Pure parts of the Slurm host source and backend: the `slurm:` block, the nodelist, TF_CONFIG,
the batch script, Slurm's answers, and a task's state from its files and its job."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.backends.slurm.backend import task_probe
from orchestrator.backends.slurm.commands import (
    JobState,
    job_state,
    parse_sbatch,
    parse_scontrol_job,
    usable,
)
from orchestrator.backends.slurm.script import LAUNCHER_SOURCE, batch_script
from orchestrator.contract import EXIT_PREEMPTED, JAX_PLACE_ENV
from orchestrator.engine.observe.state import classify
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import InventoryError, ScriptRefused
from orchestrator.hostside import slurm_launcher as launcher
from orchestrator.machines.kinds import kind_of
from orchestrator.machines.sshsettings import SshSettings
from orchestrator.model.answers import ExitRecord, WorkerProbe
from orchestrator.model.findings import PreflightOptions
from orchestrator.model.records import RunRecord, WorkerRecord
from orchestrator.model.slurm import SlurmSpec
from orchestrator.model.vocabulary import WorkerState
from tests.fakes.planning import plan_workers

JOB = "job:\n  task: worker.examples.shapes:task\n  steps: 10\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "slurm.yaml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> str:
    with pytest.raises(InventoryError) as error:
        load_inventory(write(tmp_path, text))
    assert error.value.exit_code == 2
    return error.value.message


def test_a_slurm_block_makes_one_worker_per_node(tmp_path: Path) -> None:
    inventory = load_inventory(
        write(
            tmp_path,
            "slurm:\n  nodes: 3\n  partition: gpu\n"
            "  time: '1-02:00'\n  sbatch_args: ['--qos=high']\n" + JOB,
        )
    )
    assert inventory.host_source == "slurm"
    assert [h.name for h in inventory.hosts] == ["task0", "task1", "task2"]
    assert (
        isinstance(inventory.source_settings, SlurmSpec) and inventory.source_settings.port == 20000
    )
    assert inventory.source_settings.sbatch_args == ("--qos=high",)


def test_bad_slurm_keys_name_the_line_and_a_guess(tmp_path: Path) -> None:
    message = problems(
        tmp_path,
        "slurm:\n  nodse: 2\n  time: 1h\n  port: 0\n"
        "  sbatch_args: ['--nodes=4', 'x']\n  workdir: rel/dir\n" + JOB,
    )
    assert "slurm.yaml:2: slurm.nodse: unknown key; did you mean 'nodes'?" in message
    assert "slurm.yaml:3: slurm.time: expected a Slurm time limit" in message
    assert "slurm.yaml:4: slurm.port:" in message
    assert "slurm.sbatch_args[0]: --nodes is set from slurm.nodes" in message
    assert "slurm.sbatch_args[1]: expected one sbatch option" in message
    assert "slurm.workdir: expected an absolute path" in message
    assert "slurm.nodes: missing" in message


def test_exactly_one_host_source(tmp_path: Path) -> None:
    both = "hosts:\n  - {name: a, address: localhost, port: 1, connection: local}\n"
    message = problems(tmp_path, "slurm:\n  nodes: 2\n" + both + JOB)
    assert "set exactly one of hosts, slurm" in message
    assert "spares: applies to 'hosts:'" in problems(
        tmp_path, "slurm:\n  nodes: 1\nspares:\n  - {name: b, address: x, port: 1}\n" + JOB
    )
    assert "did you mean 'slurm'" in problems(tmp_path, "slurn:\n  nodes: 1\n" + JOB)


def test_the_run_record_remembers_the_host_source(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, "slurm:\n  nodes: 2\n  account: lab\n" + JOB))
    store = RunStore(tmp_path / "state")
    store.save(RunRecord("r1", inventory, 1.0, scheduler_jobs=("41", "42")))
    loaded = store.load("r1")
    assert loaded.inventory == inventory and loaded.inventory.host_source == "slurm"
    assert loaded.scheduler_jobs == ("41", "42")


def test_a_tasks_job_id_is_its_own_field_and_older_records_that_kept_it_in_pid_still_load(
    tmp_path: Path,
) -> None:
    inventory = load_inventory(write(tmp_path, "slurm:\n  nodes: 2\n" + JOB))
    workers = tuple(WorkerRecord(h.name, i, h, f"/r/{h.name}", f"/r/{h.name}/worker.log", "/c",
                                 job_id="41") for i, h in enumerate(inventory.hosts))  # fmt: skip
    store = RunStore(tmp_path / "state")
    store.save(RunRecord("new", inventory, 1.0, workers=workers, scheduler_jobs=("41",)))
    assert [(w.pid, w.job_id) for w in store.load("new").workers] == [(None, "41")] * 2
    # What orchestrate wrote before job_id existed: the job id in pid.
    old = store.load("new").to_json()
    for worker in old["workers"]:
        worker.pop("job_id")
        worker["pid"] = 41
    (tmp_path / "state" / "runs" / "old.json").write_text(json.dumps({**old, "run_id": "old"}))
    assert [(w.pid, w.job_id) for w in store.load("old").workers] == [(None, "41")] * 2
    # A hosts run's pid stays a pid.
    hosts = load_inventory(write(tmp_path, "hosts:\n  - {name: a, address: 10.0.0.1, port: 1}\n"
                                 + JOB))  # fmt: skip
    record = RunRecord("h", hosts, 1.0, workers=(WorkerRecord("a", 0, hosts.hosts[0], "/r",
                                                              "/r/l", "/c", pid=7),))  # fmt: skip
    data = record.to_json()
    data["workers"][0].pop("job_id")
    (tmp_path / "state" / "runs" / "h.json").write_text(json.dumps(data))
    assert [(w.pid, w.job_id) for w in store.load("h").workers] == [(7, None)]


LOGIN_CONFIG = "Host hpc\n    HostName 192.0.2.7\n    User me\n    Port 2222\n"


def test_a_login_node_takes_the_ssh_kinds_keys_and_ssh_config(tmp_path: Path) -> None:
    (tmp_path / "ssh_config").write_text(LOGIN_CONFIG)
    text = ("slurm:\n  nodes: 2\n  login:\n    address: hpc\n    ssh_config: ssh_config\n"
            "    ssh_key: keys/id_hpc\n    ssh_host_key_policy: accept-new\n" + JOB)  # fmt: skip
    inventory = load_inventory(write(tmp_path, text))
    assert (
        isinstance(inventory.source_settings, SlurmSpec)
        and inventory.source_settings.login is not None
    )
    login = inventory.source_settings.login
    assert login.address == "192.0.2.7" and login.name == "login node hpc"  # the alias resolved
    assert login.settings.ssh_config == str(tmp_path / "ssh_config")  # beside the inventory
    assert login.settings.ssh_key == str(tmp_path / "keys" / "id_hpc")
    assert login.settings.ssh_host_key_policy == "accept-new" and login.python == "python3"
    # The tasks stand for the login node: what reaches their "host" reaches it.
    task = inventory.hosts[0]
    assert isinstance(task.settings, SshSettings)
    assert kind_of(task).name == "ssh" and task.settings.target == "hpc"
    details = kind_of(task).login_details(task)
    assert details is not None and details.port == 2222  # ~/.ssh/config as for a host
    from orchestrator.backends.slurm.backend import login_host

    host = login_host(inventory.source_settings)
    assert host is not None and (host.name, host.address) == ("login node hpc", "192.0.2.7")
    store = RunStore(tmp_path / "state")
    store.save(RunRecord("r1", inventory, 1.0))
    assert store.load("r1").inventory == inventory
    # Without login: the tasks' files are this machine's, as before.
    local = load_inventory(write(tmp_path, "slurm:\n  nodes: 1\n" + JOB))
    assert kind_of(local.hosts[0]).shares_files_with_controller


def test_bad_login_keys_name_the_line_and_a_guess(tmp_path: Path) -> None:
    message = problems(tmp_path, "slurm:\n  nodes: 2\n  login:\n    adress: x\n"
                       "    ssh_usr: me\n    ssh_port: 70000\n" + JOB)  # fmt: skip
    assert "slurm.yaml:4: slurm.login.adress: unknown key; did you mean 'address'?" in message
    assert "slurm.yaml:5: slurm.login.ssh_usr: unknown key; did you mean 'ssh_user'?" in message
    assert "slurm.yaml:6: slurm.login.ssh_port:" in message
    assert "slurm.yaml:4: slurm.login.address: missing" in message
    assert "slurm.login: expected a mapping" in problems(
        tmp_path, "slurm:\n  nodes: 2\n  login: hpc\n" + JOB
    )
    missing = problems(tmp_path, "slurm:\n  nodes: 2\n  login:\n    address: hpc\n"
                       "    ssh_config: nowhere\n" + JOB)  # fmt: skip
    assert "slurm.login.ssh_config: no such file" in missing
    # The CLI: exit 2 and the same lines, no traceback.
    bad = write(tmp_path, "slurm:\n  nodes: 2\n  login:\n    address: hpc\n    ssh_kye: k\n" + JOB)
    cli = subprocess.run([sys.executable, "-m", "orchestrator", "check", str(bad)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert cli.returncode == 2, cli.stderr
    flat = " ".join(cli.stderr.split())
    assert "slurm.yaml:5: slurm.login.ssh_kye: unknown key; did you mean 'ssh_key'?" in flat
    assert "Traceback" not in flat


@pytest.mark.parametrize(("nodelist", "nodes"), [
    ("n1", ["n1"]),
    ("n[1-2]", ["n1", "n2"]),
    ("gpu[07-09,12],login1", ["gpu07", "gpu08", "gpu09", "gpu12", "login1"]),
    ("r[1-2]c[3-4]", ["r1c3", "r1c4", "r2c3", "r2c4"]),
    ("b[10-9],a", ["a"]),
])  # fmt: skip
def test_the_nodelist_expands_in_order(nodelist: str, nodes: list[str]) -> None:
    assert launcher.expand_nodelist(nodelist) == nodes


def test_tf_config_from_the_allocation() -> None:
    assert launcher.tf_config(["n1", "n2"], 20000, 1) == {
        "cluster": {"worker": ["n1:20000", "n2:20000"]},
        "task": {"type": "worker", "index": 1},
    }
    assert launcher.contract.EXIT_PREEMPTED == EXIT_PREEMPTED  # the contract's, carried with it


def test_the_batch_script_is_self_contained_and_bash_parses_it(tmp_path: Path) -> None:
    inventory = load_inventory(
        write(
            tmp_path, "slurm:\n  nodes: 2\n  partition: p\n  sbatch_args: ['--comment=a b']\n" + JOB
        )
    )
    workdirs = {h.name: "/shared/o" for h in inventory.hosts}
    specs = plan_workers(inventory, "run1", workdirs)
    assert isinstance(inventory.source_settings, SlurmSpec)
    script = batch_script(
        inventory.source_settings, inventory.job, specs, output="/shared/o/%j.out"
    )
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert header == ["#SBATCH --job-name=orchestrate-slurm", "#SBATCH --nodes=2",
                      "#SBATCH --ntasks-per-node=1", "#SBATCH --no-requeue",
                      "#SBATCH --partition=p", "#SBATCH --output=/shared/o/%j.out",
                      "#SBATCH \"--comment=a b\""]  # fmt: skip
    assert "srun --kill-on-bad-exit=1" in script and "SlurmClusterResolver(" not in script
    assert "def expand_nodelist" in script  # the launcher travels inside
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    # The embedded plan reads back as the plan, through bash's here-document.
    env_plan = subprocess.run(
        ["bash", "-c", script.split("export ORCHESTRATE_SLURM_PLAN")[0].split("\n", 1)[1]
         + 'printf %s "$ORCHESTRATE_SLURM_PLAN"'], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    tasks = json.loads(env_plan)["tasks"]
    assert [t["run_dir"] for t in tasks] == [s.run_dir for s in specs]


def test_the_launcher_runs_a_task_and_records_its_exit(tmp_path: Path) -> None:
    plan = {"port": 2222, "tasks": [{"run_dir": str(tmp_path / "{SLURM_JOB_ID}" / "t0"),
            "cwd": str(tmp_path), "env": {"X": "1"},
            "argv": [sys.executable, "-c", "import os,sys; print(os.environ['TF_CONFIG']); "
                     "sys.exit(75)"]}]}  # fmt: skip
    env = {"ORCHESTRATE_SLURM_PLAN": json.dumps(plan), "SLURM_PROCID": "0", "SLURM_JOB_ID": "9",
           "SLURM_STEP_NODELIST": "n[1-2]", "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", LAUNCHER_SOURCE], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr  # preempted is no bad exit for srun
    run_dir = tmp_path / "9" / "t0"
    assert json.loads((run_dir / "exit.json").read_text())["returncode"] == 75
    logged = json.loads((run_dir / "worker.log").read_text().splitlines()[0])
    assert logged["cluster"]["worker"] == ["n1:2222", "n2:2222"]


def test_the_launcher_gives_a_jax_task_its_cluster_from_the_node_list(tmp_path: Path) -> None:
    """keras: jax on Slurm: the plan (from a real slurm: inventory) holds no addresses (the
    tasks' placeholder names are not the nodes); the launcher writes the JAX cluster from
    SLURM_STEP_NODELIST in SLURM_PROCID order, drops a TF_CONFIG the submitting shell exported,
    and pins JAX's local devices to every GPU Slurm gave the task (else JAX's own Slurm
    detection would give it [SLURM_LOCALID])."""
    (tmp_path / "train.py").write_text("")
    inventory = load_inventory(
        write(
            tmp_path,
            "slurm:\n  nodes: 2\n  port: 7000\n"
            + JOB.replace(
                "  task: worker.examples.shapes:task\n", "  script: train.py\n  keras: jax\n"
            ),
        )
    )
    assert isinstance(inventory.source_settings, SlurmSpec)
    specs = plan_workers(inventory, "run1", {h.name: str(tmp_path) for h in inventory.hosts})
    script = batch_script(inventory.source_settings, inventory.job, specs)
    plan = json.loads(script.split("<<'ORCHESTRATE_PLAN_END'\n", 1)[1].split("\nORCHE", 1)[0])
    assert plan["cluster"] == "jax"
    assert not [k for t in plan["tasks"] for k in t["env"] if k in JAX_PLACE_ENV]
    shown = [
        *JAX_PLACE_ENV,
        "KERAS_BACKEND",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION",
        "JAX_LOCAL_DEVICE_IDS",
        "TF_CONFIG",
    ]
    plan["tasks"][1]["argv"] = [sys.executable, "-c", "import json, os; print(json.dumps("
                                f"{{k: os.environ.get(k) for k in {shown!r}}}))"]  # fmt: skip
    env = {"ORCHESTRATE_SLURM_PLAN": json.dumps(plan), "SLURM_PROCID": "1", "SLURM_JOB_ID": "9",
           "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_LOCALID": "0", "PATH": "/usr/bin:/bin",
           "CUDA_VISIBLE_DEVICES": "2,5", "TF_CONFIG": '{"from": "the shell"}'}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", LAUNCHER_SOURCE], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = Path(plan["tasks"][1]["run_dir"].replace("{SLURM_JOB_ID}", "9"))
    assert json.loads((run_dir / "worker.log").read_text().splitlines()[0]) == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "gpu07:7000,gpu08:7000",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "1",
        "JAX_COORDINATOR_ADDRESS": "gpu07:7000", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1",
        "KERAS_BACKEND": "jax", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "JAX_LOCAL_DEVICE_IDS": "0,1", "TF_CONFIG": None,
    }  # fmt: skip
    assert json.loads((run_dir / "tf_config.json").read_text()) == {}
    assert launcher.jax_env(["n1"], 1, 0)["JAX_LOCAL_DEVICE_IDS"] == "0"  # no GPU: harmless


def test_slurms_answers_parse() -> None:
    assert parse_sbatch("1234\n") == "1234" and parse_sbatch("77;cluster") == "77"
    with pytest.raises(ValueError):
        parse_sbatch("")
    fields = parse_scontrol_job("JobId=5 JobName=x JobState=FAILED Reason=NonZeroExitCode "
                                "ExitCode=0:9 NodeList=n[1-2] Command=/a b")  # fmt: skip
    state = job_state("5", fields)
    assert (state.state, state.reason, state.signal, state.nodes) == (
        "FAILED",
        "NonZeroExitCode",
        9,
        "n[1-2]",
    )
    assert not state.active and JobState("6", "PENDING").active
    assert usable("idle") and usable("mix") and not usable("drain") and not usable("idle*")


def test_a_tasks_state_comes_from_its_files_and_its_job() -> None:
    alive_files = WorkerProbe(now=5.0, exists=True, pid=7, alive=True)  # this machine's view
    running = task_probe(alive_files, JobState("3", "RUNNING"), "n1")
    assert running.alive and running.node == "n1" and running.usage is None
    # A pid alive on this machine says nothing once the job has ended without an exit record.
    gone = task_probe(alive_files, JobState("3", "CANCELLED", signal=9), "n1")
    assert classify(gone).state is WorkerState.FAILED and gone.exit is not None
    assert gone.exit.returncode == -9 and "ended CANCELLED" in (gone.exit.error or "")
    never = task_probe(WorkerProbe(now=1.0), None, None)
    assert classify(never).state is WorkerState.FAILED
    saved = WorkerProbe(now=5.0, exists=True, pid=7, exit=ExitRecord(EXIT_PREEMPTED))
    assert classify(task_probe(saved, JobState("3", "COMPLETED"), "n2")).state is (
        WorkerState.STOPPED
    )
    # Held in the queue: pending, with Slurm's reason, and not alive (no stall clock yet).
    pending = task_probe(WorkerProbe(now=1.0), JobState("4", "PENDING", reason="BeginTime"), None)
    assert pending.queued == "BeginTime" and not pending.alive
    verdict = classify(pending)
    assert verdict.state is WorkerState.PENDING and "queue (BeginTime)" in (verdict.reason or "")
    configuring = task_probe(WorkerProbe(now=1.0), JobState("4", "CONFIGURING"), None)
    assert configuring.queued is None and classify(configuring).state is WorkerState.STARTING


def test_the_exported_script_of_a_login_inventory_is_the_one_to_submit_there(
    tmp_path: Path,
) -> None:
    from orchestrator.backends.slurm.export import sbatch_script
    from orchestrator.engine.workers.plan import plan_workers
    from orchestrator.model.inventory import Inventory

    def sbatch_export(inventory: Inventory) -> str:
        return sbatch_script(inventory, plan_workers)

    (tmp_path / "ssh_config").write_text(LOGIN_CONFIG)
    plain = load_inventory(write(tmp_path, "slurm:\n  nodes: 2\n" + JOB))
    login = "  login: {address: hpc, ssh_config: ssh_config}\n"
    remote = load_inventory(write(tmp_path, "slurm:\n  nodes: 2\n" + login + JOB))
    assert sbatch_export(remote) == sbatch_export(plain)  # nothing of SSH in it
    assert "{SLURM_SUBMIT_DIR}" in sbatch_export(remote)


def test_a_login_node_that_refuses_is_named_by_every_view(tmp_path: Path) -> None:
    import socket

    from orchestrator.backends.registry import open_backend
    from orchestrator.engine.observe.status import collect_status
    from orchestrator.errors import ConnectError
    from orchestrator.model.records import WorkerRecord

    with socket.socket() as closed:  # a port on loopback that nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    login = f"  login: {{address: 127.0.0.1, ssh_port: {port}, ssh_connect_timeout: 2}}\n"
    inventory = load_inventory(write(tmp_path, "slurm:\n  nodes: 2\n" + login + JOB))
    workers = tuple(WorkerRecord(h.name, i, h, f"/w/runs/r/attempt-0/{h.name}", "log", "/w/c")
                    for i, h in enumerate(inventory.hosts))  # fmt: skip
    record = RunRecord("r", inventory, 1.0, workers=workers, scheduler_jobs=("7",))
    with open_backend(inventory) as backend:
        status = collect_status(record, backend, backend.scheduler)
        assert [w.state for w in status.workers] == [WorkerState.UNKNOWN] * 2
        assert all("login node 127.0.0.1: connection refused" in (w.reason or "")
                   for w in status.workers)  # fmt: skip
        assert status.scheduler is not None and status.scheduler.state == "UNKNOWN"
        assert "login node 127.0.0.1" in (status.scheduler.reason or "")
        with pytest.raises(ConnectError, match=r"login node 127\.0\.0\.1"):
            backend.preflight(inventory, PreflightOptions(probe_timeout=5.0, min_free_bytes=0))


# The batch script's here-document end markers in a job value (issue 41): exit 2 naming it.

MARKED_JOB = ("job:\n  script: train.py\n  steps: 10\n"
              "  env: {FOO: 'x ORCHESTRATE_LAUNCHER_END y'}\n"
              "  args: ['--ok', 'a\\nORCHESTRATE_PLAN_END\\nb']\n")  # fmt: skip


def test_a_slurm_inventory_naming_an_end_marker_is_refused_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    message = problems(tmp_path, "slurm:\n  nodes: 2\n" + MARKED_JOB)
    assert ("slurm.yaml:6: job.env.FOO: contains ORCHESTRATE_LAUNCHER_END, the line that ends "
            "the batch script's embedded launcher") in message  # fmt: skip
    assert "slurm.yaml:7: job.args: contains ORCHESTRATE_PLAN_END" in message


def test_the_batch_script_refuses_an_end_marker_in_any_value_naming_it(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, "slurm:\n  nodes: 2\n" + JOB))
    assert isinstance(inventory.source_settings, SlurmSpec)
    marked = replace(inventory.job, env={"FOO": "x ORCHESTRATE_PLAN_END"})
    specs = plan_workers(inventory, "run1", {h.name: "/shared/o" for h in inventory.hosts})
    with pytest.raises(ScriptRefused, match=r"^job\.env\.FOO contains ORCHESTRATE_PLAN_END") as e:
        batch_script(inventory.source_settings, marked, specs)
    assert e.value.exit_code == 2
    # A value the job does not name (a path): the plan is named instead.
    deep = {h.name: "/shared/ORCHESTRATE_LAUNCHER_END" for h in inventory.hosts}
    with pytest.raises(ScriptRefused, match=r"^the plan \(a path.*LAUNCHER_END"):
        batch_script(
            inventory.source_settings, inventory.job, plan_workers(inventory, "run1", deep)
        )


def orchestrate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip


def test_export_sbatch_and_up_of_a_marked_job_exit_2_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    hosts = "hosts:\n  - {name: a, address: 10.0.0.1, port: 2222}\n"
    (tmp_path / "inv.yaml").write_text(hosts + MARKED_JOB)
    (tmp_path / "slurm.yaml").write_text("slurm:\n  nodes: 2\n" + MARKED_JOB)
    for args in (("export", "inv.yaml", "--format", "sbatch"),
                 ("export", "slurm.yaml", "--format", "sbatch"), ("up", "slurm.yaml")):  # fmt: skip
        done = orchestrate(tmp_path, *args)
        assert done.returncode == 2 and done.stdout == "", (args, done.stderr)
        assert "job.env.FOO: contains" in done.stderr or "job.env.FOO contains" in done.stderr
        assert "ORCHESTRATE_LAUNCHER_END" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / ".orchestrate").exists()  # up stopped before anything was recorded
