"""Inventory loading and every validation error: each names the file, line, key and expectation."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.errors import InventoryError

GOOD = """\
defaults:
  connection: local
  workdir: ./work
hosts:
  - name: w0
    address: localhost
    port: 23456
  - name: w1
    address: 127.0.0.1
    port: 23457
job:
  task: worker.examples.shapes:task
  steps: 50
  args: [--log-every, 5]
  env:
    OMP_NUM_THREADS: 1
"""


def write(tmp_path: Path, text: str, name: str = "inv.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return [str(p) for p in caught.value.problems]


def test_good_inventory_resolves_defaults_and_paths(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, GOOD))
    assert [h.name for h in inventory.hosts] == ["w0", "w1"]
    assert all(h.connection == "local" for h in inventory.hosts)
    # Local workers use the controller's interpreter; relative paths are relative to the file.
    assert inventory.hosts[0].python == sys.executable
    assert inventory.hosts[0].workdir == str(tmp_path / "work")
    assert inventory.job.name == "inv"  # the file's stem when the job has no name
    assert inventory.job.args == ("--log-every", "5")
    assert inventory.job.env == {"OMP_NUM_THREADS": "1"}
    assert inventory.job.checkpoint_every == 100 and inventory.job.max_to_keep == 3


def test_ssh_hosts_default_to_python3_and_home_workdir(tmp_path: Path) -> None:
    text = GOOD.replace("  connection: local\n", "").replace("  workdir: ./work\n", "")
    text = text.replace("localhost", "10.0.0.1").replace("127.0.0.1", "10.0.0.2")
    inventory = load_inventory(write(tmp_path, text))
    host = inventory.hosts[0]
    assert (host.connection, host.python, host.workdir) == ("ssh", "python3", "~/orchestrate")
    assert host.endpoint == "10.0.0.1:23456"


def test_host_overrides_default(tmp_path: Path) -> None:
    text = GOOD.replace("    port: 23457\n", "    port: 23457\n    workdir: /srv/w1\n")
    inventory = load_inventory(write(tmp_path, text))
    assert inventory.hosts[0].workdir == str(tmp_path / "work")
    assert inventory.hosts[1].workdir == "/srv/w1"


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    found = problems_of(tmp_path, GOOD.replace("    port: 23457", "    prot: 23457"))
    assert any(":10: hosts[1].prot: unknown key; did you mean 'port'?" in p for p in found)
    # The same mistake also leaves port missing; both are reported at once.
    assert any("hosts[1].port: missing" in p for p in found)


def test_wrong_types_and_ranges_are_all_reported(tmp_path: Path) -> None:
    text = GOOD.replace("port: 23456", "port: 70000").replace("steps: 50", "steps: many")
    text = text.replace("connection: local", "connection: telnet")
    found = problems_of(tmp_path, text)
    assert any(
        ":2: defaults.connection: expected one of local, ssh, got 'telnet'" in p for p in found
    )
    assert any(
        ":7: hosts[0].port: expected an integer from 1 to 65535, got 70000" in p for p in found
    )
    assert any(":13: job.steps: expected an integer of at least 1, got 'many'" in p for p in found)
    assert all(p.startswith(str(tmp_path / "inv.yaml")) for p in found)


def test_boolean_is_not_a_port(tmp_path: Path) -> None:
    found = problems_of(tmp_path, GOOD.replace("port: 23456", "port: true"))
    assert any("hosts[0].port: expected an integer from 1 to 65535, got True" in p for p in found)


def test_duplicate_endpoint_and_name(tmp_path: Path) -> None:
    text = GOOD.replace("name: w1", "name: w0").replace("port: 23457", "port: 23456")
    found = problems_of(tmp_path, text)
    assert any("hosts[1].name: 'w0' is already used by hosts[0]" in p for p in found)
    # localhost and 127.0.0.1 are the same machine for a local worker.
    assert any("hosts[1].port: 127.0.0.1:23456 is already used by hosts[0]" in p for p in found)


def test_missing_required_keys(tmp_path: Path) -> None:
    found = problems_of(tmp_path, "hosts:\n  - {name: a}\n")
    assert any("hosts[0].address: missing" in p for p in found)
    assert any("hosts[0].port: missing" in p for p in found)
    assert any("job: missing" in p for p in found)


def test_empty_host_list(tmp_path: Path) -> None:
    found = problems_of(tmp_path, "hosts: []\njob: {task: a:b, steps: 1}\n")
    assert any("hosts: expected a non-empty list of hosts" in p for p in found)


def test_not_yaml(tmp_path: Path) -> None:
    found = problems_of(tmp_path, "hosts: [\n  - {name: a\njob: x\n")
    assert len(found) == 1 and "not valid YAML" in found[0]
    assert f"{tmp_path / 'inv.yaml'}:" in found[0]


def test_not_a_mapping(tmp_path: Path) -> None:
    found = problems_of(tmp_path, "- just\n- a list\n")
    assert found == [
        f"{tmp_path / 'inv.yaml'}: expected a mapping with 'hosts:' and 'job:', got a list"
    ]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path / "nope.yaml")
    assert "cannot read the file" in str(caught.value.problems[0])


def test_task_and_script_are_exclusive(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    found = problems_of(
        tmp_path, GOOD.replace("  steps: 50\n", "  steps: 50\n  script: train.py\n")
    )
    assert any("set exactly one of 'task'" in p for p in found)


def test_script_is_resolved_and_must_exist(tmp_path: Path) -> None:
    text = GOOD.replace("  task: worker.examples.shapes:task\n", "  script: missing.py\n")
    found = problems_of(tmp_path, text)
    assert any(f"job.script: no such file: {tmp_path / 'missing.py'}" in p for p in found)
    (tmp_path / "missing.py").write_text("")
    assert load_inventory(tmp_path / "inv.yaml").job.script == str(tmp_path / "missing.py")


def test_task_needs_steps_and_shape(tmp_path: Path) -> None:
    found = problems_of(
        tmp_path, GOOD.replace("  steps: 50\n", "").replace("shapes:task", "shapes")
    )
    assert any("job.task: expected 'package.module:function'" in p for p in found)
    assert any("job.steps: missing" in p for p in found)


def test_reserved_and_invalid_env(tmp_path: Path) -> None:
    text = GOOD.replace("    OMP_NUM_THREADS: 1", "    TF_CONFIG: x\n    1BAD: y\n    OK: [1]")
    found = problems_of(tmp_path, text)
    assert any("job.env.TF_CONFIG: is set by orchestrate" in p for p in found)
    assert any("job.env.1BAD: expected an environment variable name" in p for p in found)
    assert any("job.env.OK: expected a string or number, got a list" in p for p in found)


def test_local_worker_must_be_on_loopback(tmp_path: Path) -> None:
    found = problems_of(tmp_path, GOOD.replace("127.0.0.1", "10.1.2.3"))
    assert any("hosts[1].address: a local worker runs on this machine" in p for p in found)


def test_name_and_address_cannot_be_defaults(tmp_path: Path) -> None:
    found = problems_of(tmp_path, GOOD.replace("defaults:\n", "defaults:\n  name: x\n"))
    assert any("defaults.name: must be set on each host" in p for p in found)


def test_repeated_key(tmp_path: Path) -> None:
    found = problems_of(
        tmp_path, GOOD.replace("    port: 23456\n", "    port: 23456\n    port: 1\n")
    )
    assert any(":8: hosts[0].port: repeated key" in p for p in found)


def test_bundled_inventories_load() -> None:
    root = Path(__file__).resolve().parents[2] / "inventory"
    local = load_inventory(root / "local.yaml")
    assert [h.port for h in local.hosts] == [23456, 23457]
    cluster = load_inventory(root / "cluster.example.yaml")
    assert len(cluster.hosts) >= 2 and all(h.connection == "ssh" for h in cluster.hosts)
    ps = load_inventory(root / "local-ps.yaml")
    assert [h.role for h in ps.hosts] == ["chief", "worker", "worker", "ps"]
    assert ps.job.strategy == "parameter-server" and ps.job.task == local.job.task


def test_gpu_settings_and_their_invalid_combinations(tmp_path: Path) -> None:
    good = GOOD.replace(
        "  workdir: ./work\n",
        "  workdir: ./work\n  gpu_memory_limit_mb: 4096\n  logical_gpus: 2\n"
        "  visible_gpus: [0, 1]\n",
    )
    host = load_inventory(write(tmp_path, good)).hosts[0]
    assert (host.gpu_memory_limit_mb, host.logical_gpus, host.visible_gpus) == (4096, 2, (0, 1))
    found = problems_of(
        tmp_path, good.replace("  logical_gpus: 2\n", "  gpu_memory_growth: true\n")
    )
    assert any("hosts[0].gpu_memory_growth: cannot be combined with gpu_memory_limit_mb" in p
               for p in found)  # fmt: skip
    found = problems_of(tmp_path, good.replace("  gpu_memory_limit_mb: 4096\n", ""))
    assert any("hosts[1].logical_gpus: needs gpu_memory_limit_mb" in p for p in found)
    found = problems_of(tmp_path, good.replace("[0, 1]", "[0, 0]"))
    assert any("visible_gpus: expected distinct integers, got [0, 0]" in p for p in found)
    found = problems_of(tmp_path, good.replace("[0, 1]", "[-1]"))
    assert any("visible_gpus: expected a list of integers of at least 0" in p for p in found)


def test_strategy_and_profile_steps(tmp_path: Path) -> None:
    found = problems_of(tmp_path, GOOD + "  strategy: mirrored\n  profile_steps: [9, 3]\n")
    assert any(
        "job.strategy: mirrored runs on one host, but 2 hosts are listed" in p for p in found
    )
    assert any("job.profile_steps: expected [start, end] with start < end" in p for p in found)
    one_host = GOOD.replace("  - name: w1\n    address: 127.0.0.1\n    port: 23457\n", "")
    job = load_inventory(write(tmp_path, one_host + "  strategy: mirrored\n")).job
    assert job.strategy == "mirrored"


def test_eval_every_and_export(tmp_path: Path) -> None:
    job = load_inventory(write(tmp_path, GOOD + "  eval_every: 50\n  export: keras\n")).job
    assert (job.eval_every, job.export) == (50, "keras")
    assert (load_inventory(write(tmp_path, GOOD)).job.export) is None
    found = problems_of(tmp_path, GOOD + "  eval_every: 0\n  export: onnx\n")
    assert any("job.eval_every: expected an integer of at least 1, got 0" in p for p in found)
    assert any("job.export: expected one of keras, saved_model, got 'onnx'" in p for p in found)


def test_eval_and_export_apply_to_tasks_only(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    text = GOOD.replace(
        "  task: worker.examples.shapes:task\n  steps: 50\n", "  script: train.py\n"
    )
    found = problems_of(tmp_path, text + "  eval_every: 5\n  export: keras\n")
    assert any("job.eval_every: applies to job.task only" in p for p in found)
    assert any("job.export: applies to job.task only" in p for p in found)
