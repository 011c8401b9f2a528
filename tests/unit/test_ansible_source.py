"""`ansible:` as a host source, read by the real ansible-core, and ~/.ssh/config aliases.
No hosts are contacted: these load inventories and compare what they resolve to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.engine.workers.tfconfig import tf_config
from orchestrator.errors import InventoryError
from orchestrator.machines.kinds.ssh import openssh_argv
from orchestrator.machines.sshsettings import SshSettings
from tests.conftest import Cli

INI = """\
[trainers:children]
gpus

[gpus]
node[1:2]

[other]
elsewhere ansible_host=10.9.9.9
"""
JOB = "job: {name: demo, script: train.py}\n"


def ansible_tree(root: Path, addresses: tuple[str, str] = ("10.231.0.11", "10.231.0.12")) -> Path:
    """An INI inventory with a range, a child group, group_vars, host_vars and a per-host port."""
    tree = root / "ansible"
    (tree / "group_vars").mkdir(parents=True)
    (tree / "host_vars").mkdir()
    (tree / "hosts.ini").write_text(INI)
    (tree / "group_vars" / "gpus.yml").write_text(
        "ansible_user: root\nansible_ssh_private_key_file: keys/id\n"
        "ansible_python_interpreter: auto_silent\ntf_port: 20000\n"
    )
    (tree / "host_vars" / "node1.yml").write_text(f"ansible_host: {addresses[0]}\n")
    (tree / "host_vars" / "node2.yml").write_text(
        f"ansible_host: {addresses[1]}\ntf_port: 20001\nansible_port: '{{{{ 2200 + 22 }}}}'\n"
    )
    return tree


def yaml_twin(root: Path, addresses: tuple[str, str] = ("10.231.0.11", "10.231.0.12")) -> Path:
    path = root / "plain.yaml"
    path.write_text(
        "defaults: {ssh_user: root, ssh_key: keys/id}\n"
        "hosts:\n"
        f"  - {{name: node1, address: {addresses[0]}, port: 20000}}\n"
        f"  - {{name: node2, address: {addresses[1]}, port: 20001, ssh_port: 2222}}\n" + JOB
    )
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    ansible_tree(tmp_path)
    yaml_twin(tmp_path)
    (tmp_path / "inv.yaml").write_text(
        "ansible: {inventory: ansible/hosts.ini, group: trainers}\n" + JOB
    )
    return tmp_path


def test_ini_inventory_resolves_like_the_equivalent_yaml(project: Path):
    from_ansible = load_inventory(project / "inv.yaml")
    plain = load_inventory(project / "plain.yaml")
    assert from_ansible.hosts == plain.hosts  # names, addresses, ports, user, key, python
    assert [tf_config(from_ansible, i) for i in range(2)] == [tf_config(plain, i) for i in range(2)]
    assert tf_config(from_ansible, 1)["cluster"]["worker"] == ["10.231.0.11:20000",
                                                               "10.231.0.12:20001"]  # fmt: skip
    assert isinstance(from_ansible.hosts[1].settings, SshSettings)
    assert from_ansible.hosts[1].settings.ssh_port == 2222  # templated by Ansible
    assert from_ansible.hosts[0].python == "python3"  # auto_silent means our default


def test_a_directory_inventory_and_the_port_from_defaults(project: Path):
    (project / "ansible" / "group_vars" / "gpus.yml").write_text("ansible_user: root\n")
    (project / "ansible" / "host_vars" / "node2.yml").write_text("ansible_host: 10.0.0.2\n")
    (project / "dir.yaml").write_text(
        "ansible: {inventory: ansible, group: gpus}\ndefaults: {port: 23456}\n" + JOB
    )
    inventory = load_inventory(project / "dir.yaml")
    assert [(h.name, h.address, h.port) for h in inventory.hosts] == [
        ("node1", "10.231.0.11", 23456), ("node2", "10.0.0.2", 23456)]  # fmt: skip


def test_hosts_command_prints_both_sources_the_same(project: Path):
    cli = Cli(project)
    rows = {}
    for name in ("inv.yaml", "plain.yaml"):
        out = cli("hosts", "--json", name, check=True).stdout
        rows[name] = [json.loads(line) for line in out.splitlines()]
    assert rows["inv.yaml"] == rows["plain.yaml"]
    keys = ("name", "address", "port", "ssh_user", "ssh_port", "python")
    assert [tuple(r[k] for k in keys) for r in rows["inv.yaml"]] == [
        ("node1", "10.231.0.11", 20000, "root", 22, "python3"),
        ("node2", "10.231.0.12", 20001, "root", 2222, "python3"),
    ]
    table = cli("hosts", "inv.yaml", check=True).stdout
    assert "root@10.231.0.12:2222" in table and "20001" in table


def test_a_group_that_does_not_exist_is_named_and_exits_2(project: Path):
    (project / "inv.yaml").write_text(
        "ansible: {inventory: ansible/hosts.ini, group: tpus}\n" + JOB
    )
    result = Cli(project)("hosts", "inv.yaml")
    said = " ".join(result.stderr.split())
    assert result.returncode == 2
    assert "ansible.group: no group 'tpus' in" in said
    assert "its groups: all, gpus, other, trainers, ungrouped" in said
    assert "Traceback" not in result.stderr


def test_ansibles_own_parse_error_is_shown_with_the_file(project: Path):
    (project / "ansible" / "hosts.ini").write_text("[gpus\nnode1\n")
    result = Cli(project)("check", "inv.yaml")
    said = " ".join(result.stderr.split())  # the console wraps long lines
    assert result.returncode == 2
    assert f"Ansible cannot read {project / 'ansible' / 'hosts.ini'}" in said
    assert "Failed to parse inventory with 'ini' plugin" in said  # Ansible's own words
    assert "Traceback" not in said


def test_without_ansible_core_the_error_names_the_extra(project: Path):
    code = (
        "import sys; sys.modules['ansible'] = None\n"  # what `import ansible` meets when absent
        "from orchestrator.backends.registry import load_inventory\n"
        "from orchestrator.errors import InventoryError\n"
        f"try: load_inventory({str(project / 'inv.yaml')!r})\n"
        "except InventoryError as e: print(e.message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "needs ansible-core" in out.stdout and "pip install '.[ansible]'" in out.stdout


def test_one_host_source_only_and_a_missing_port_is_explained(project: Path):
    (project / "both.yaml").write_text(
        "ansible: {inventory: ansible/hosts.ini}\nhosts: [{name: a, address: b, port: 1}]\n" + JOB
    )
    with pytest.raises(InventoryError, match=r"set exactly one of hosts, .*ansible: each lists"):
        load_inventory(project / "both.yaml")
    (project / "noport.yaml").write_text("ansible: {inventory: ansible/hosts.ini, "
                                         "group: other}\n" + JOB)  # fmt: skip
    with pytest.raises(InventoryError, match=r"ansible\[elsewhere\]\.port: missing; set the host "
                       "variable 'tf_port'"):  # fmt: skip
        load_inventory(project / "noport.yaml")


def test_an_ssh_config_alias_gives_its_hostname_to_tf_config(tmp_path: Path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "ssh_config").write_text(
        "Host jump\n  HostName 10.233.1.10\n  User admin\n\n"
        "Host gpu-a\n  HostName 10.233.2.11\n  User root\n  Port 2200\n"
        "  IdentityFile ~/.ssh/gpu_key\n  ProxyJump jump\n"
    )
    (tmp_path / "inv.yaml").write_text(
        "defaults: {ssh_config: ssh_config, port: 20000, ssh_known_hosts: kh}\n"
        "hosts:\n  - {name: a, address: gpu-a}\n  - {name: b, address: 10.233.2.12}\n" + JOB
    )
    inventory = load_inventory(tmp_path / "inv.yaml")
    first = inventory.hosts[0]
    assert isinstance(first.settings, SshSettings)
    assert (first.address, first.settings.ssh_host) == ("10.233.2.11", "gpu-a")
    assert tf_config(inventory, 0)["cluster"]["worker"] == ["10.233.2.11:20000",
                                                            "10.233.2.12:20000"]  # fmt: skip
    row = json.loads(Cli(tmp_path)("hosts", "--json", "inv.yaml", check=True).stdout.split("\n")[0])
    assert (row["ssh_alias"], row["ssh_user"], row["ssh_port"], row["jump"]) == (
        "gpu-a", "root", 2200, "jump")  # fmt: skip
    assert row["ssh_key"].endswith("/.ssh/gpu_key")
    # rsync's OpenSSH command line: the jump is explicit, with the same host-key options.
    argv = openssh_argv(first)
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert (
        f"-F {tmp_path / 'ssh_config'}" in proxy
        and f"UserKnownHostsFile={tmp_path / 'kh'}" in proxy
    )
    assert "StrictHostKeyChecking=yes" in proxy and proxy.endswith("jump -W %h:%p")
    assert argv[:3] == ["ssh", "-F", str(tmp_path / "ssh_config")]


def test_a_missing_ssh_config_file_is_an_inventory_problem(tmp_path: Path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "inv.yaml").write_text(
        "hosts:\n  - {name: a, address: gpu-a, port: 1, ssh_config: nope}\n" + JOB
    )
    with pytest.raises(InventoryError, match=r"hosts\[0\]\.ssh_config: no such file"):
        load_inventory(tmp_path / "inv.yaml")
