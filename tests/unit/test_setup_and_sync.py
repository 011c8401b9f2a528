"""`setup:` and `sync:` with real processes on this machine: bash runs the setup of local
hosts through the real HostBackend, and real rsync mirrors trees through a remote shell that
runs the remote side here (what ssh would do on a host). The SSH versions: the netns tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.backends.hosts.backend import HostBackend
from orchestrator.backends.hosts.prep import prepare_hosts
from orchestrator.backends.hosts.setup import MARKER, setup_hash
from orchestrator.backends.hosts.sync import parse_stats, rsync_argv
from orchestrator.backends.registry import host_settings, load_inventory, source_settings_of
from orchestrator.errors import HostErrors, InventoryError
from orchestrator.model.inventory import Inventory, SyncSpec
from tests.fakes.planning import plan_workers


def local_inventory(root: Path, setup: list[str], hosts: int = 2) -> Inventory:
    (root / "train.py").write_text("")
    lines = "\n".join(f"  - {{name: w{i}, address: localhost, port: {23000 + i}}}"
                      for i in range(hosts))  # fmt: skip
    commands = "\n".join(f"  - {command!r}" for command in setup)
    (root / "inv.yaml").write_text(
        "defaults: {connection: local, workdir: ./work}\n"
        f"hosts:\n{lines}\nsetup:\n{commands}\njob: {{name: demo, script: train.py}}\n"
    )
    return load_inventory(root / "inv.yaml")


def prepare(inventory: Inventory, **options: bool) -> list[str]:
    said: list[str] = []
    with HostBackend() as backend:
        workdirs = dict(backend.workdirs(inventory.hosts).raise_if_failed("reaching"))
        prepare_hosts(inventory, backend, workdirs, said.append, **options)
    return said


def test_setup_runs_once_per_machine_then_skips_until_a_command_changes(tmp_path: Path):
    count = tmp_path / "count"
    setup = [f"echo ran >> {count}", "mkdir -p sub && cd sub", "pwd > where; echo hello"]
    inventory = local_inventory(tmp_path, setup)
    said = prepare(inventory)
    job = tmp_path / "work" / "demo"
    assert count.read_text() == "ran\n"  # two workers, one machine and job directory: once
    assert (job / "sub" / "where").read_text().strip() == str(job / "sub")  # one shell, in order
    assert "w0 | hello" in said and "setup done on w0" in said
    assert (job / MARKER).read_text().strip() == setup_hash(setup)

    said = prepare(inventory)
    assert count.read_text() == "ran\n"
    assert any(line.startswith("setup unchanged on w0") for line in said)

    prepare(inventory, force_setup=True)
    assert count.read_text() == "ran\nran\n"
    changed = local_inventory(tmp_path, [*setup, "true"])
    prepare(changed)
    assert count.read_text() == "ran\nran\nran\n"


def test_a_failing_command_names_the_host_its_exit_code_and_output(tmp_path: Path):
    inventory = local_inventory(tmp_path, ["echo before", "echo oops >&2; (exit 7)", "touch never"])
    with pytest.raises(HostErrors) as raised:
        prepare(inventory)
    message = raised.value.message
    assert "w0: setup failed with exit code 7" in message
    assert "before" in message and "oops" in message  # the tail, stderr included
    assert "setup: command 2 failed with exit code 7: echo oops >&2; (exit 7)" in message
    job = tmp_path / "work" / "demo"
    assert not (job / "never").exists() and not (job / MARKER).exists()


def test_spares_are_set_up_at_the_first_start_too(tmp_path: Path):
    inventory = local_inventory(tmp_path, ["pwd > where"], hosts=1)
    text = (
        (tmp_path / "inv.yaml")
        .read_text()
        .replace(
            "setup:",
            "spares:\n  - {name: s0, address: localhost, port: 23100, workdir: ./spare}\nsetup:",
        )
    )
    (tmp_path / "inv.yaml").write_text(text)
    inventory = load_inventory(tmp_path / "inv.yaml")
    said = prepare(inventory, spares=True)
    assert (tmp_path / "spare" / "demo" / "where").read_text().strip() == str(
        tmp_path / "spare" / "demo"
    )
    assert "setup done on w0, s0" in said
    assert prepare(inventory)[-1].startswith("setup unchanged on w0")  # without spares: w0 only


def test_setup_must_be_a_list_of_commands(tmp_path: Path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "inv.yaml").write_text(
        "hosts: [{name: a, address: b, port: 1}]\nsetup: pip install x\n"
        "sync: {source: nowhere, excludes: []}\njob: {script: train.py}\n"
    )
    with pytest.raises(InventoryError) as raised:
        load_inventory(tmp_path / "inv.yaml")
    text = raised.value.message
    assert "setup: expected a non-empty list of shell commands" in text
    assert "sync.excludes: unknown key; did you mean 'exclude'?" in text


# --- sync ---------------------------------------------------------------------------------------

# rsync runs `SHELL TARGET COMMAND...` like ssh; this one runs the command here instead.
HERE = ["bash", "-c", 'shift; exec bash -c "$*"', "rsh"]


def tree(root: Path, files: int) -> Path:
    source = root / "src"
    for index in range(files):
        path = source / f"pkg{index % 10}" / f"mod{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {index}\n" * 20)
    (source / ".git").mkdir()
    (source / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (source / "big.ckpt").write_text("x" * 1000)
    return source


def mirror(spec: SyncSpec, destination: Path):
    argv = rsync_argv(spec, HERE, "host", str(destination))
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return parse_stats(done.stdout)


def test_rsync_mirrors_deltas_deletions_and_excludes(tmp_path: Path):
    source = tree(tmp_path, 100)
    spec = SyncSpec(str(source), exclude=("*.ckpt",))
    destination = tmp_path / "job dir" / "code"  # created by the remote side, spaces and all
    first = mirror(spec, destination)
    assert first.files == 100 and first.file_bytes > 100 * 200
    assert not (destination / ".git").exists() and not (destination / "big.ckpt").exists()

    (source / "pkg3" / "mod3.py").write_text("VALUE = 'changed'\n")
    (source / "pkg4" / "mod4.py").unlink()
    second = mirror(spec, destination)
    assert (second.files, second.deleted) == (1, 1)
    assert second.file_bytes == len("VALUE = 'changed'\n")
    assert (destination / "pkg3" / "mod3.py").read_text() == "VALUE = 'changed'\n"
    assert not (destination / "pkg4" / "mod4.py").exists()
    assert mirror(spec, destination).files == 0

    with_git = mirror(SyncSpec(str(source), git=True), destination)
    assert (destination / ".git" / "HEAD").exists() and with_git.files == 2  # .git, big.ckpt


def test_a_script_inside_the_synced_tree_runs_from_the_mirror(tmp_path: Path):
    source = tmp_path / "src"
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "train.py").write_text("")
    (tmp_path / "inv.yaml").write_text(
        "hosts: [{name: a, address: 10.0.0.1, port: 1}]\nsync: src\n"
        "job: {name: demo, script: src/bin/train.py}\n"
    )
    inventory = load_inventory(tmp_path / "inv.yaml")
    assert inventory.sync == SyncSpec(str(source))
    (spec,) = plan_workers(inventory, "r1", {"a": "/home/u/orchestrate"})
    assert spec.argv[3] == "/home/u/orchestrate/demo/code/bin/train.py"  # after -c BOOT
    assert spec.cwd == "/home/u/orchestrate/demo/code" and spec.uploads == ()


def test_setup_and_sync_survive_the_run_record(tmp_path: Path):
    """The detached supervisor reads them back from the record for every restart."""
    import json

    from orchestrator.model.records import RunRecord

    (tmp_path / "src").mkdir()
    inventory = local_inventory(tmp_path, ["echo a", "echo b"])
    text = (
        (tmp_path / "inv.yaml")
        .read_text()
        .replace("job:", 'sync: {source: src, exclude: ["*.tmp"]}\njob:')
    )
    (tmp_path / "inv.yaml").write_text(text)
    inventory = load_inventory(tmp_path / "inv.yaml")
    record = RunRecord(run_id="r1", inventory=inventory, created_at=0.0)
    again = RunRecord.from_json(
        json.loads(json.dumps(record.to_json())), host_settings, source_settings_of
    )
    assert again.inventory.setup == ("echo a", "echo b")
    assert again.inventory.sync == SyncSpec(str(tmp_path / "src"), ("*.tmp",))


def test_setup_and_sync_are_refused_on_slurm(tmp_path: Path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "src").mkdir()
    (tmp_path / "inv.yaml").write_text(
        "slurm: {nodes: 2, time: '1:00:00'}\nsetup: [echo hi]\nsync: src\n"
        "job: {name: demo, script: train.py}\n"
    )
    with pytest.raises(InventoryError) as raised:
        load_inventory(tmp_path / "inv.yaml")
    text = raised.value.message
    assert "inv.yaml:2: setup: applies to hosts reached over SSH" in text
    assert "inv.yaml:3: sync: applies to hosts reached over SSH" in text
