"""Ansible inventories, `setup:` and `sync:` against namespace hosts with real sshd
(tests/cluster): the real CLI, ansible-core, bash over SSH and rsync over OpenSSH."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.inventories import write_inventory
from tests.cluster.netns import NamespaceCluster
from tests.cluster.pytest_support import SharedCluster
from tests.conftest import Cli
from tests.unit.test_ansible_source import INI

pytestmark = pytest.mark.netns

PRINT_TF_CONFIG = "import os\nprint('tf_config', os.environ['TF_CONFIG'], flush=True)\n"


@pytest.fixture(scope="module")
def cluster(namespace_hosts: SharedCluster) -> NamespaceCluster:
    return namespace_hosts.hosts(2)


def tf_configs(cli: Cli) -> list[dict[str, Any]]:
    record = cli.record()
    return [json.loads((Path(w["run_dir"]) / "tf_config.json").read_text())
            for w in record["workers"]]  # fmt: skip


def test_an_ini_inventory_starts_the_same_cluster_as_the_yaml_one(
    cli: Cli, cluster: NamespaceCluster
):
    """A range, a child group, group_vars, host_vars and a per-host port, read by Ansible."""
    (cli.cwd / "train.py").write_text(PRINT_TF_CONFIG)
    tree = cli.cwd / "ansible"
    (tree / "group_vars").mkdir(parents=True)
    (tree / "host_vars").mkdir()
    (tree / "hosts.ini").write_text(INI.replace("node[1:2]", "host[1:2]"))
    (tree / "group_vars" / "gpus.yml").write_text(
        f"ansible_user: root\nansible_ssh_private_key_file: {cluster.client_key_path}\n"
        f"ansible_python_interpreter: {sys.executable}\ntf_port: 20000\n"
    )
    for index, host in enumerate(cluster.hosts, 1):
        port = "tf_port: 20001\n" if index == 2 else ""
        (tree / "host_vars" / f"host{index}.yml").write_text(
            f"ansible_host: {host.address}\norchestrate_workdir: {host.workdir}\n{port}"
        )
    job = {"name": "same", "script": "train.py"}
    ports = {"host2": {"port": 20001}}
    write_inventory(cli.cwd / "plain.yaml", cluster, job,
                    hosts=[{"name": h.name, "address": h.address, "workdir": str(h.workdir),
                            **ports.get(h.name, {})} for h in cluster.hosts])  # fmt: skip
    (cli.cwd / "inv.yaml").write_text(
        "ansible: {inventory: ansible/hosts.ini, group: trainers}\n"
        f"defaults: {{ssh_known_hosts: {cluster.known_hosts_path}, ssh_connect_timeout: 3}}\n"
        f"job: {json.dumps(job)}\n"
    )
    shown = cli("hosts", "inv.yaml", check=True).stdout
    assert "root@10.231.0.12:22" in shown and "20001" in shown

    cli("up", "plain.yaml", check=True)
    from_yaml = tf_configs(cli)
    cli("up", "inv.yaml", check=True)
    from_ansible = tf_configs(cli)
    assert from_ansible == from_yaml
    assert from_ansible[1] == {"cluster": {"worker": ["10.231.0.11:20000", "10.231.0.12:20001"]},
                               "task": {"type": "worker", "index": 1}}  # fmt: skip
    logs = cli("tail", "-n", "5", check=True).stdout
    assert "host2 | tf_config" in logs

    (cli.cwd / "inv.yaml").write_text("ansible: {inventory: ansible, group: tpu}\n"
                                      f"job: {json.dumps(job)}\n")  # fmt: skip
    missing = cli("up", "inv.yaml")
    assert missing.returncode == 2 and "no group 'tpu'" in missing.stderr


def setup_inventory(cli: Cli, cluster: NamespaceCluster, setup: list[str], **extra: Any) -> Path:
    (cli.cwd / "train.py").write_text("print('trained', flush=True)\n")
    path = write_inventory(cli.cwd / "inv.yaml", cluster, {"name": "prep", "script": "train.py"})
    text = path.read_text().replace("job:", f"setup: {json.dumps(setup)}\njob:")
    for key, value in extra.items():
        text = text.replace("job:", f"{key}: {json.dumps(value)}\njob:")
    path.write_text(text)
    return path


def test_setup_runs_once_skips_unchanged_reruns_changed_and_stops_on_a_failure(
    cli: Cli, cluster: NamespaceCluster
):
    counter = "ran-setup"
    setup = [f"echo ran >> {counter}", 'echo "hello from $(hostname -I)"']
    setup_inventory(cli, cluster, setup)
    first = cli("up", "inv.yaml", check=True)
    assert "host1 | hello from 10.231.0.11" in first.stderr
    assert "host2 | hello from 10.231.0.12" in first.stderr
    assert "setup done on host1, host2" in first.stderr
    job_dirs = [host.workdir / "prep" for host in cluster.hosts]
    assert [(d / counter).read_text() for d in job_dirs] == ["ran\n", "ran\n"]
    assert all((d / ".orchestrate-setup").is_file() for d in job_dirs)  # the marker, on the host

    second = cli("up", "inv.yaml", check=True)
    assert "setup unchanged on host1, host2 (skipped" in second.stderr
    assert "hello from" not in second.stderr
    assert [(d / counter).read_text() for d in job_dirs] == ["ran\n", "ran\n"]

    setup_inventory(cli, cluster, [*setup, "echo changed"])
    third = cli("up", "inv.yaml", check=True)
    assert "host1 | changed" in third.stderr
    assert [(d / counter).read_text() for d in job_dirs] == ["ran\nran\n", "ran\nran\n"]
    forced = cli("setup", "--force", "inv.yaml", check=True)
    assert "host2 | changed" in forced.stderr and "hosts ready" in forced.stderr

    fail_on_host2 = 'case "$PWD" in */host2/*) echo "no GPU driver here"; exit 9;; esac'
    setup_inventory(cli, cluster, [fail_on_host2, "echo after"])
    runs_before = cli.record()["run_id"]
    failed = cli("up", "inv.yaml")
    assert failed.returncode == 3
    said = " ".join(failed.stderr.split())
    assert "host2: setup failed with exit code 9; its last lines: " in said
    # What root's ~/.bashrc prints at an ssh login may come first (pyenv's rehash, racing other
    # lanes' logins, says the shims are busy): the setup's own last line ends them.
    last_lines = said.split("its last lines: ", 1)[1].split(" hint:", 1)[0]
    assert last_lines.endswith("no GPU driver here"), said
    assert "host1:" not in failed.stderr.split("failed on", 1)[1]
    assert cli.record()["run_id"] == runs_before  # nothing started: no new run


def test_sync_mirrors_a_1000_file_tree_and_then_only_what_changed(
    cli: Cli, cluster: NamespaceCluster
):
    source = cli.cwd / "project"
    for index in range(1000):
        path = source / f"pkg{index % 20}" / f"mod{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {index}\n")
    (source / ".git").mkdir()
    (source / ".git" / "config").write_text("[core]\n")
    (source / "scratch.tmp").write_text("not synced\n")
    (source / "train.py").write_text(
        "import os, pathlib\n"
        "print('cwd', os.getcwd(), flush=True)\n"
        "print('value', pathlib.Path('pkg3/mod3.py').read_text().strip(), flush=True)\n"
    )
    write_inventory(cli.cwd / "inv.yaml", cluster, {"name": "synced", "script": "project/train.py"})
    path = cli.cwd / "inv.yaml"
    path.write_text(path.read_text().replace(
        "job:", 'sync: {source: project, exclude: ["*.tmp"]}\njob:'))  # fmt: skip
    first = cli("up", "inv.yaml", check=True)
    assert "synced " in first.stderr and "1001 file(s) changed" in first.stderr
    mirrors = [host.workdir / "synced" / "code" for host in cluster.hosts]
    for mirror in mirrors:
        assert len(list(mirror.rglob("mod*.py"))) == 1000
        assert not (mirror / ".git").exists() and not (mirror / "scratch.tmp").exists()
    logs = cli("tail", "-n", "5", check=True).stdout
    assert f"host2 | cwd {mirrors[1]}" in logs and "host1 | value VALUE = 3" in logs

    (source / "pkg3" / "mod3.py").write_text("VALUE = 'changed'\n")
    (source / "pkg5" / "mod5.py").unlink()
    second = cli("up", "inv.yaml", check=True)
    assert "1 file(s) changed, 1 deleted" in second.stderr
    assert all((m / "pkg3" / "mod3.py").read_text() == "VALUE = 'changed'\n" for m in mirrors)
    assert not any((m / "pkg5" / "mod5.py").exists() for m in mirrors)
    assert "host1 | value VALUE = 'changed'" in cli("tail", "-n", "5", check=True).stdout
