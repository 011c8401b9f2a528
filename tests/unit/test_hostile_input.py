"""Nothing on a shared machine or in a host's answer turns the tool against its user (issue 25):
names and paths with control characters, private directories another user made or swapped for
a link, predictable temporary files, names a host answers with, secrets a Slurm task prints.

Real processes where the behaviour is a process's (the host agent, the Slurm launcher, the
login node's withenv program); a fake backend implementing the real interface for the answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import hostside
from orchestrator.backends.registry import load_inventory
from orchestrator.backends.slurm.commands import Slurm
from orchestrator.backends.slurm.script import LAUNCHER_SOURCE, batch_script, sbatch_quote
from orchestrator.engine.store.checkpoints import Mirror, spread_latest_checkpoint
from orchestrator.engine.store.exports import pull_export
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import HostError, InventoryError
from orchestrator.export import kubernetes, tfjob
from orchestrator.machines.hostclient import host_program
from orchestrator.machines.runner import LocalRunner
from orchestrator.model.answers import CheckpointListing, FileListing
from orchestrator.model.inventory import Inventory, WorkerSlot
from orchestrator.model.records import RunRecord, WorkerRecord
from orchestrator.model.slurm import SlurmSpec
from orchestrator.values import NAME_PATTERN
from tests.fakes.backend import FakeBackend
from tests.fakes.planning import plan_workers

HOSTSIDE = Path(hostside.__file__).parent
OTHER_UID = 65534  # nobody: another account (the tests run as root, which may chown)
HOSTS = """\
defaults:
  connection: local
  workdir: {workdir}
hosts:
  - name: {host}
    address: localhost
    port: 23456
job:
  name: {name}
  task: worker.examples.shapes:task
  steps: 10
  checkpoint_dir: {checkpoint_dir}
  env: {{PEM: "-----BEGIN KEY-----\\nAAAA\\n-----END KEY-----\\n"}}
  args: ["--note", "two\\nlines"]
"""
SLURM = """\
slurm:
  nodes: 2
  workdir: {workdir}
  partition: {partition}
  account: {account}
  time: {time}
  python: {python}
  sbatch_args: [{sbatch_arg}]
job:
  name: shapes
  task: worker.examples.shapes:task
  steps: 10
  secret_env: [{secret}]
"""
GOOD_HOSTS = {"workdir": "./work", "host": "w0", "name": "shapes", "checkpoint_dir": "ck"}
GOOD_SLURM = {"workdir": "/shared/me", "partition": "p", "account": "lab", "time": "10",
              "python": "python3", "sbatch_arg": "'--qos=high'", "secret": "TOKEN"}  # fmt: skip


def load(tmp_path: Path, template: str, values: dict[str, str]) -> Inventory:
    path = tmp_path / "inv.yaml"
    path.write_text(template.format(**values))
    return load_inventory(path)


def refused(tmp_path: Path, template: str, values: dict[str, str]) -> str:
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, template, values)
    assert caught.value.exit_code == 2
    return caught.value.message


# --- names, paths and batch-script values ----------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "line"),
    [
        ("name", '"shapes\\n"', "inv.yaml:9: job.name"),  # a trailing newline passed re.match
        ("host", '"w0\\n"', "inv.yaml:5: hosts[0].name"),
        ("workdir", '"/tmp/w\\ntouch /tmp/x"', "inv.yaml:3: defaults.workdir"),
        ("checkpoint_dir", '"ck\\u001b[31m"', "inv.yaml:12: job.checkpoint_dir"),
    ],
)
def test_control_characters_in_names_and_paths_are_refused_with_file_and_line(
    tmp_path: Path, key: str, value: str, line: str
) -> None:
    message = refused(tmp_path, HOSTS, {**GOOD_HOSTS, key: value})
    assert line in message, message


@pytest.mark.parametrize(
    ("key", "value", "where"),
    [
        # The example: a line that would run on the compute node.
        ("workdir", '"/shared/me\\ntouch /tmp/x\\n#"', "inv.yaml:3: slurm.workdir"),
        ("partition", '"p\\n"', "inv.yaml:4: slurm.partition"),
        ("account", '"lab\\n"', "inv.yaml:5: slurm.account"),
        ("time", '"10\\n"', "inv.yaml:6: slurm.time"),
        ("python", '"python3\\nid"', "inv.yaml:7: slurm.python"),
        ("sbatch_arg", '"--qos=high\\t"', "slurm.sbatch_args"),
        ("secret", '"TOKEN\\n"', "job.secret_env"),
    ],
)
def test_control_characters_in_every_batch_script_value_are_refused(
    tmp_path: Path, key: str, value: str, where: str
) -> None:
    message = refused(tmp_path, SLURM, {**GOOD_SLURM, key: value})
    assert where in message, message


def test_env_values_and_args_keep_their_newlines(tmp_path: Path) -> None:
    # They travel as JSON (the launch request, the plan) or argv, never as a script line.
    inventory = load(tmp_path, HOSTS, GOOD_HOSTS)
    assert inventory.job.env["PEM"] == "-----BEGIN KEY-----\nAAAA\n-----END KEY-----\n"
    assert inventory.job.args == ("--note", "two\nlines")


def test_name_patterns_match_whole_strings() -> None:
    assert NAME_PATTERN.fullmatch("shapes") and not NAME_PATTERN.fullmatch("shapes\n")
    manifest = {"apiVersion": tfjob.API_VERSION, "kind": "TFJob", "metadata": {"name": "a\n"}}
    assert any("DNS-1035" in p for p in tfjob.problems(manifest))
    assert kubernetes.DNS_1035.fullmatch("a\n") is None  # every check calls fullmatch


def test_a_workdir_with_a_space_stays_one_sbatch_option(tmp_path: Path) -> None:
    values = {**GOOD_SLURM, "workdir": '"/shared/my runs"', "sbatch_arg": "'--comment=a #b'"}
    inventory = load(tmp_path, SLURM, values)
    specs = plan_workers(
        inventory, "run1", {"task0": "/shared/my runs", "task1": "/shared/my runs"}
    )
    assert isinstance(inventory.source_settings, SlurmSpec)
    script = batch_script(inventory.source_settings, inventory.job, specs,
                          output="/shared/my runs/slurm-%j.out")  # fmt: skip
    lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert '#SBATCH "--output=/shared/my runs/slurm-%j.out"' in lines
    assert '#SBATCH "--comment=a \\#b"' in lines  # an unescaped '#' starts sbatch's comment
    with pytest.raises(ValueError, match="control character"):
        sbatch_quote("--output=/a\nb")


# --- private directories and temporary files in the state directory --------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    yield RunStore(tmp_path / ".orchestrate")


def record_of(tmp_path: Path) -> RunRecord:
    inventory = load(tmp_path, HOSTS, GOOD_HOSTS)
    return RunRecord("20260101-000000-abcd", inventory, 0.0)


@pytest.mark.root  # chowns files to another account, as another user would have made them
def test_a_runs_directory_of_another_user_is_refused_and_nothing_is_written(
    tmp_path: Path, store: RunStore
) -> None:
    runs = store.root / "runs"
    runs.mkdir(parents=True, mode=0o777)
    runs.chmod(0o777)
    os.chown(runs, OTHER_UID, OTHER_UID)
    with pytest.raises(HostError) as caught:
        store.save(record_of(tmp_path))
    assert caught.value.exit_code == 3
    assert str(runs) in caught.value.message and "nobody (uid 65534)" in caught.value.message
    assert list(runs.iterdir()) == []


def test_a_symlinked_runs_directory_is_refused_and_nothing_is_written(
    tmp_path: Path, store: RunStore
) -> None:
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o700)
    store.root.mkdir(mode=0o700)
    (store.root / "runs").symlink_to(elsewhere)
    with pytest.raises(HostError, match="symbolic link") as caught:
        store.save(record_of(tmp_path))
    assert str(store.root / "runs") in caught.value.message
    assert list(elsewhere.iterdir()) == []


@pytest.mark.root  # chowns files to another account, as another user would have made them
def test_a_state_directory_of_another_user_is_refused(tmp_path: Path, store: RunStore) -> None:
    store.root.mkdir(mode=0o777)
    os.chown(store.root, OTHER_UID, OTHER_UID)
    with pytest.raises(HostError, match="another user's directory"):
        store.write_file(store.preflight_path(), "{}")
    assert list(store.root.iterdir()) == []


def test_a_looser_runs_directory_of_ours_is_tightened(tmp_path: Path, store: RunStore) -> None:
    (store.root / "runs").mkdir(parents=True)
    (store.root / "runs").chmod(0o755)
    store.save(record_of(tmp_path))
    assert (store.root / "runs").stat().st_mode & 0o777 == 0o700


def test_temporary_files_have_no_predictable_name_to_plant_a_link_at(
    tmp_path: Path, store: RunStore
) -> None:
    store.root.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    # Yesterday's name for the temporary file of `current`: a link there was followed.
    (store.root / f".current.{os.getpid()}.tmp").symlink_to(victim)
    store.save(record_of(tmp_path))
    assert victim.read_text() == "precious"
    assert (store.root / "current").read_text().strip() == "20260101-000000-abcd"
    assert oct((store.root / "current").stat().st_mode & 0o777) == oct(0o600)


# --- private directories on a host: the real agent ------------------------------------------


def agent(*requests: dict[str, object]) -> list[dict[str, object]]:
    source = host_program("agent.py")  # as it is sent, with the modules it imports
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          input="".join(json.dumps(r) + "\n" for r in requests), timeout=30,
                          check=True)  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.root  # chowns files to another account, as another user would have made them
def test_the_agent_refuses_a_runs_directory_another_user_made(tmp_path: Path) -> None:
    job = tmp_path / "shared" / "shapes"
    runs = job / "runs"
    runs.mkdir(parents=True)
    runs.chmod(0o777)
    os.chown(runs, OTHER_UID, OTHER_UID)
    run_dir = runs / "r1" / "attempt-0" / "w0"
    private = [str(runs), str(runs / "r1"), str(runs / "r1" / "attempt-0"), str(run_dir)]
    made, launched = agent(
        {"verb": "make-dirs", "directories": [str(run_dir)], "private_dirs": private},
        {"verb": "launch", "spec": {"run_dir": str(run_dir), "private_dirs": private}},
    )
    for answer in (made, launched):
        error = str(answer["error"])
        assert f"refusing {runs}: it belongs to nobody (uid 65534)" in error, answer
    assert list(runs.iterdir()) == []  # no run directory, spec.json or agent.py in theirs


def test_the_agent_refuses_a_symlinked_run_directory(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    runs = tmp_path / "shapes" / "runs"
    runs.mkdir(parents=True, mode=0o700)
    (runs / "r1").symlink_to(theirs)
    run_dir = runs / "r1" / "attempt-0" / "w0"
    private = [str(runs), str(runs / "r1"), str(runs / "r1" / "attempt-0"), str(run_dir)]
    (answer,) = agent({"verb": "make-dirs", "directories": [], "private_dirs": private})
    assert f"refusing {runs / 'r1'}: it is a symbolic link (to {theirs})" in str(answer["error"])
    assert list(theirs.iterdir()) == []


def test_the_agents_state_file_is_written_through_an_unpredictable_name(tmp_path: Path) -> None:
    # adopt-checkpoint's temporary state file: a link at any `checkpoint.tmp.N` is not opened.
    victim = tmp_path / "victim"
    victim.write_text("precious")
    argv = [sys.executable, "-c", host_program("agent.py")]
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    # It waits for its request: plant the link at yesterday's name, which held its pid.
    (tmp_path / f"checkpoint.tmp.{process.pid}").symlink_to(victim)
    request = {"verb": "adopt-checkpoint", "directory": str(tmp_path), "name": "ckpt-1"}
    out, _ = process.communicate(json.dumps(request) + "\n", timeout=30)
    assert json.loads(out).get("latest") == "ckpt-1", out
    assert victim.read_text() == "precious"
    assert 'model_checkpoint_path: "ckpt-1"' in (tmp_path / "checkpoint").read_text()


# --- the Slurm launcher: private directories, printed secrets --------------------------------


def launch_task(tmp_path: Path, run_dir: Path, code: str, secret: str | None = None,
                private: list[str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    task = {"run_dir": str(run_dir), "private_dirs": private or [str(run_dir)],
            "cwd": str(tmp_path), "env": {}, "argv": [sys.executable, "-c", code]}  # fmt: skip
    plan = {"port": 2222, "secret_env": ["TRACKER_API_KEY"] if secret else [], "tasks": [task]}
    env = {"ORCHESTRATE_SLURM_PLAN": json.dumps(plan), "SLURM_PROCID": "0", "SLURM_JOB_ID": "9",
           "SLURM_STEP_NODELIST": "n1", "PATH": "/usr/bin:/bin",
           **({"TRACKER_API_KEY": secret} if secret else {})}  # fmt: skip
    return subprocess.run([sys.executable, "-c", LAUNCHER_SOURCE], env=env, capture_output=True,
                          text=True, check=False, timeout=60)  # fmt: skip


def test_the_launcher_redacts_a_printed_secret_from_worker_log_and_exit_json(
    tmp_path: Path,
) -> None:
    secret = "sk-" + "f00d" * 6
    code = ("import hashlib, os, sys; s = os.environ['TRACKER_API_KEY']; "
            "print('digest', hashlib.sha256(s.encode()).hexdigest(), flush=True); "
            "print('leaked', s, flush=True); sys.stderr.write('bad key ' + s); "
            "sys.exit(3)")  # fmt: skip
    done = launch_task(tmp_path, tmp_path / "t0", code, secret)
    assert done.returncode == 3, done.stderr
    log = (tmp_path / "t0" / "worker.log").read_text()
    exit_record = (tmp_path / "t0" / "exit.json").read_text()
    assert f"digest {hashlib.sha256(secret.encode()).hexdigest()}" in log  # the task had it
    assert "leaked [redacted]" in log and "bad key [redacted]" in log
    assert json.loads(exit_record)["error"] == "bad key [redacted]"
    for text in (log, exit_record, done.stdout, done.stderr):
        assert secret not in text


@pytest.mark.root  # chowns files to another account, as another user would have made them
def test_the_launcher_refuses_a_run_directory_another_user_made(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o777)
    os.chown(runs, OTHER_UID, OTHER_UID)
    done = launch_task(tmp_path, runs / "t0", "print('ran')", private=[str(runs), str(runs / "t0")])
    assert done.returncode == 3
    assert f"refusing {runs}: it belongs to nobody (uid 65534)" in done.stderr
    assert list(runs.iterdir()) == []


# --- the login node's withenv program -------------------------------------------------------


def test_withenv_gives_the_command_values_from_stdin_only(tmp_path: Path) -> None:
    secret = "s3cret-" + "9" * 8
    probe = ("import hashlib, os; print(hashlib.sha256(os.environ['TRACKER_API_KEY']"
             ".encode()).hexdigest()); "
             "print(open(f'/proc/{os.getppid()}/cmdline').read())")  # fmt: skip
    request = {"argv": [sys.executable, "-c", probe], "env": {"TRACKER_API_KEY": secret},
               "timeout": 30}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", (HOSTSIDE / "withenv.py").read_text()],
                          input=json.dumps(request) + "\n", capture_output=True, text=True,
                          timeout=30, check=True)  # fmt: skip
    answer = json.loads(done.stdout)
    digest, parent_cmdline = answer["stdout"].split("\n", 1)
    assert answer["returncode"] == 0 and digest == hashlib.sha256(secret.encode()).hexdigest()
    assert "def run(request)" in parent_cmdline  # it did read withenv's own command line
    assert secret not in parent_cmdline and secret not in done.stderr


def test_sbatch_with_secrets_goes_through_withenv_on_a_real_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The login node's session numbers its requests and drops one whose answer carries another
    # id or none: withenv must echo it, as the other host programs do.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\nprintf %s "$TRACKER_API_KEY" > {tmp_path}/seen\necho 4242\n')
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    slurm = Slurm(LocalRunner("login"))
    job_id = slurm.submit("job.sh", secrets={"TRACKER_API_KEY": "s3cret"}, python=sys.executable)
    assert job_id == "4242"
    assert (tmp_path / "seen").read_text() == "s3cret"


# --- names from a host's answer --------------------------------------------------------------


class HostileHost(FakeBackend):
    """A host whose agent answers with names that are paths out of where they are copied.

    Its downloads write only inside `sandbox` (the test's directory), whatever the code under
    test asks: a regression must fail the test, never overwrite a file of the machine."""

    def __init__(self, sandbox: Path, checkpoint_listing: CheckpointListing | None = None,
                 file_listing: FileListing | None = None) -> None:  # fmt: skip
        super().__init__()
        self.sandbox = sandbox.resolve()
        self.checkpoint_listing = checkpoint_listing
        self.file_listing = file_listing
        self.downloaded: list[str] = []

    def checkpoint(self, host: WorkerSlot, directory: str) -> CheckpointListing:
        return self.checkpoint_listing or CheckpointListing(directory, None, {})

    def list_files(self, host: WorkerSlot, directory: str) -> FileListing:
        return self.file_listing or FileListing(directory, {})

    def download(self, host: WorkerSlot, remote: str, local: str) -> None:
        self.downloaded.append(local)
        if not Path(local).resolve().is_relative_to(self.sandbox):
            raise AssertionError(f"asked to write {local}, outside the test's directory")
        Path(local).write_text("from the host")


HOST = WorkerSlot(name="host1", address="10.0.0.1", port=20000)


@pytest.mark.parametrize(
    "listing",
    [
        CheckpointListing("/w/ck", "../../../escaped", {"../../../escaped.index": 1}),
        CheckpointListing("/w/ck", "ckpt-1", {"ckpt-1.index": 1, "/w/ck/ckpt-1.x": 1}),
        CheckpointListing("/w/ck", "ckpt-1", {"ckpt-1.index": 1}, ("ckpt-1", "../ckpt-0")),
    ],
)
def test_a_hostile_checkpoint_name_is_refused_naming_the_host(
    tmp_path: Path, listing: CheckpointListing
) -> None:
    mirror = Mirror(tmp_path / "state" / "checkpoints" / "run1")
    backend = HostileHost(tmp_path, checkpoint_listing=listing)
    with pytest.raises(HostError) as caught:
        mirror.update(HOST, "/w/ck", backend)
    assert caught.value.host == "host1" and "not a checkpoint's file name" in caught.value.message
    assert backend.downloaded == []
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "state" / "escaped").exists()


def test_a_hostile_checkpoint_name_is_not_spread_to_other_hosts(tmp_path: Path) -> None:
    inventory = load(tmp_path, HOSTS, GOOD_HOSTS)
    specs = plan_workers(inventory, "run1", {"w0": "/w"})
    backend = HostileHost(
        tmp_path, checkpoint_listing=CheckpointListing("/w/ck", "../x", {"../x.index": 1})
    )
    with pytest.raises(HostError, match="not a checkpoint's file name"):
        spread_latest_checkpoint(specs, backend)
    assert backend.downloaded == []


@pytest.mark.parametrize("name", ["../../outside.txt", "ABSOLUTE", "sub/../../up.txt", "."])
def test_a_hostile_export_file_name_is_refused_naming_the_host(tmp_path: Path, name: str) -> None:
    name = str(tmp_path / "absolute.txt") if name == "ABSOLUTE" else name  # inside the sandbox
    inventory = load(tmp_path, HOSTS, GOOD_HOSTS)
    run_dir = "/w/shapes/runs/r1/attempt-0/w0"
    chief = WorkerRecord("w0", 0, HOST, run_dir, run_dir + "/worker.log", "/w/shapes/ck")
    record = RunRecord("r1", inventory, 0.0, workers=(chief,))
    listing = FileListing("/w/shapes/export", {"model.keras": (1, 0.0), name: (1, 0.0)})
    backend = HostileHost(tmp_path, file_listing=listing)
    target = tmp_path / "out" / "export"
    with pytest.raises(HostError) as caught:
        pull_export(record, backend, target)
    assert caught.value.host == "host1" and repr(name) in caught.value.message
    for escaped in ("outside.txt", "up.txt", "absolute.txt"):
        assert not (tmp_path / escaped).exists()
    assert not target.exists() and list((tmp_path / "out").iterdir()) == []  # staging removed


def test_good_names_from_a_host_are_copied(tmp_path: Path) -> None:
    listing = CheckpointListing("/w/ck", "ckpt-2", {"ckpt-2.index": 1, "checkpoint": 1},
                                ("ckpt-1", "ckpt-2"))  # fmt: skip
    mirror = Mirror(tmp_path / "mirror")
    assert (
        mirror.update(HOST, "/w/ck", HostileHost(tmp_path, checkpoint_listing=listing)) == "ckpt-2"
    )
    assert (tmp_path / "mirror" / "ckpt-2" / "ckpt-2.index").read_text() == "from the host"
    assert textwrap.dedent((tmp_path / "mirror" / "latest").read_text()) == "ckpt-2"
