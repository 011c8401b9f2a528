"""The pieces of the backend seam: fan-out results, typed answers, run records, kinds in the
inventory, and the rule that no module outside the kinds asks which kind a host is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.backends.registry import load_inventory
from orchestrator.cli.render import status_table
from orchestrator.engine.observe.status import worker_status
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import HostError, HostErrors, InventoryError
from orchestrator.fanout import fan_out, per_machine
from orchestrator.machines.sshsettings import SshSettings
from orchestrator.model.answers import WorkerProbe, parse_probe, parse_stop
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.records import Restart, RunRecord, WorkerRecord
from tests.conftest import Cli

REPO = Path(__file__).resolve().parents[2]


def test_fan_out_keeps_every_answer_and_every_error() -> None:
    def action(key: int) -> int:
        if key % 2:
            raise HostError(f"h{key}", "down")
        return key * 10

    result = fan_out(range(5), action)
    assert dict(result.ok) == {0: 0, 2: 20, 4: 40}
    assert sorted(result.failed) == [1, 3]
    with pytest.raises(HostErrors) as error:
        result.raise_if_failed("asking")
    assert error.value.partial == {0: 0, 2: 20, 4: 40}
    assert "asking failed on 2 host(s)" in error.value.message


def test_per_machine_makes_one_call_per_machine_and_maps_back() -> None:
    calls: list[list[str]] = []
    items = ["a@m1", "b@m1", "c@m2", "d@m3"]

    def ask(group: list[str]) -> dict[str, str]:
        calls.append(group)
        if group[0].endswith("m2"):
            raise HostError("m2", "unreachable")
        # m3 forgets its item: a gap is reported, not silently dropped.
        return {item: item.upper() for item in group if not item.endswith("m3")}

    result = per_machine(items, lambda i: i, lambda i: i.split("@")[1], ask)
    assert sorted(map(sorted, calls)) == [["a@m1", "b@m1"], ["c@m2"], ["d@m3"]]
    assert dict(result.ok) == {"a@m1": "A@M1", "b@m1": "B@M1"}
    assert result.failed["c@m2"].message == "m2: unreachable"
    assert "left it out" in result.failed["d@m3"].message


def test_typed_answers_read_wrong_types_as_absent() -> None:
    probes = parse_probe({"now": 5.0, "runs": {"/r": {
        "exists": True, "pid": "12", "alive": True,
        "progress": {"step": 3, "loss": "nan?", "devices": ["/device:CPU:0"], "val_loss": 0.5},
        "exit": {"returncode": None},
    }}})  # fmt: skip
    probe = probes["/r"]
    assert isinstance(probe, WorkerProbe) and probe.now == 5.0
    assert probe.pid is None and probe.exit is None  # "12" is no pid; no code, no exit record
    assert probe.progress is not None and probe.progress.step == 3 and probe.progress.loss is None
    assert probe.progress.fields["val_loss"] == 0.5  # unknown fields are kept for the views
    assert parse_stop({"outcome": {"/r": "killed"}, "left": {"/r": [7]}})["/r"].left == (7,)


def test_run_records_round_trip_with_kind_settings_and_failure_kinds(tmp_path: Path) -> None:
    host = WorkerSlot("a", "10.0.0.1", 20000, settings=SshSettings(ssh_user="me", ssh_port=2222))
    local = WorkerSlot("b", "localhost", 20001, connection="local", python="/usr/bin/python3")
    inventory = Inventory("i.yaml", "/x", (host, local), Job("demo", script="/x/t.py"))
    worker = WorkerRecord("a", 0, host, "/r/a", "/r/a/worker.log", "/c", pid=9)
    restart = Restart(2.0, 0, "a", "exit 1: boom", 4, "disk full")
    record = RunRecord("run1", inventory, 1.0, attempt=1, workers=(worker,), restarts=(restart,))
    store = RunStore(tmp_path)
    store.save(record)
    loaded = store.load("run1")
    assert loaded == record
    assert isinstance(loaded.workers[0].host.settings, SshSettings)
    assert loaded.workers[0].host.settings.ssh_port == 2222
    assert loaded.restarts[0].signature == ("a", "disk full", 4)
    assert store.stop_flag("run1").parent == store.lock_path("run1").parent


def write(
    tmp_path: Path, hosts: str, job: str = "task: worker.examples.shapes:task\n  steps: 5"
) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(f"hosts:\n{hosts}\njob:\n  {job}\n")
    return path


@pytest.mark.parametrize("task", ["pkg.:task", "a-b:c", "a.b:c:d", ".x:y", "shapes"])
def test_every_task_the_worker_would_refuse_is_an_inventory_error(
    tmp_path: Path, task: str
) -> None:
    path = write(
        tmp_path, "  - {name: a, address: 10.0.0.1, port: 1}", f"task: '{task}'\n  steps: 5"
    )
    with pytest.raises(InventoryError) as error:
        load_inventory(path)
    assert f"{path}:4: job.task: expected 'package.module:function'" in error.value.message
    from worker.cli import parse_config
    from worker.config import ConfigError

    with pytest.raises(ConfigError):  # the worker agrees: one rule, two places that apply it
        parse_config(["--task", task, "--steps", "5"], {})


def test_kind_keys_belong_to_their_kind(tmp_path: Path) -> None:
    hosts = (
        "  - {name: a, address: localhost, port: 1, connection: local, ssh_user: x}\n"
        "  - {name: b, address: localhost, port: 2, connection: telnet}"
    )
    path = write(tmp_path, hosts)
    with pytest.raises(InventoryError) as error:
        load_inventory(path)
    message = error.value.message
    assert "hosts[0].ssh_user: applies to another connection kind, not to local" in message
    assert "hosts[1].connection: expected one of local, ssh, got 'telnet'" in message


def test_status_table_renders_every_column() -> None:
    host = WorkerSlot("a", "10.0.0.1", 20000)
    worker = WorkerRecord("a", 0, host, "/r", "/r/worker.log", "/c")
    probe = WorkerProbe.parse({"exists": True, "pid": 3, "alive": True, "worker_pid": 4,
                               "progress": {"step": 7, "target_steps": 10, "loss": 0.25}},
                              now=0.0)  # fmt: skip
    from orchestrator.engine.observe.status import RunStatus
    from orchestrator.model.vocabulary import WorkerState

    status = RunStatus("run1", "demo", WorkerState.RUNNING, (worker_status(worker, probe),))
    console = Console(width=160, record=True)
    console.print(status_table(status))
    text = console.export_text()
    assert "run run1  job demo  running" in text and "7/10" in text and "0.25" in text


def test_no_module_outside_the_kinds_compares_a_connection_name() -> None:
    literal = re.compile(
        r"connection\s*[!=]=|==\s*[\"'](local|ssh)[\"']|[\"'](local|ssh)[\"']\s*=="
    )
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in (REPO / "orchestrator").rglob("*.py")
        if "kinds" not in path.parts and "config" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert offenders == []


def test_the_controller_imports_no_tensorflow() -> None:
    code = ("import sys, orchestrator.cli, orchestrator.engine.supervision.supervise, "
            "orchestrator.backends.hosts.checks; "
            "print('tensorflow' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_module_outside_the_registry_and_its_sources_names_a_backend() -> None:
    """A host source's name (`slurm`, `ansible`) is written only in the registry, the source's
    own modules (config/sources/NAME.py, model/NAME.py) and the backend's folder; `hosts` is
    also the inventory's field every layer reads, so it is not a backend's name here."""
    from dataclasses import fields

    from orchestrator.backends.registry import host_sources

    names = sorted({s.name for s in host_sources()} - {f.name for f in fields(Inventory)})
    assert names, "the registry names no backend besides hosts"
    alternatives = "|".join(map(re.escape, names))
    literal = re.compile(rf"[\"']({alternatives})[\"']|\.({alternatives})\b")

    def allowed(path: Path) -> bool:
        relative = path.relative_to(REPO / "orchestrator")
        # config/sources/NAME.py and model/NAME.py by their name, backends/NAME/ by its folder
        owner = path.stem if relative.parts[0] in ("config", "model") else relative.parent.name
        return str(relative) == "backends/registry.py" or owner in names

    offenders = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in (REPO / "orchestrator").rglob("*.py")
        if not allowed(path)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert offenders == []


def test_a_backend_without_a_role_is_answered_in_words(cli: Cli, tmp_path: Path) -> None:
    """Slurm declares no firewall and no leases (data, not stubs): `firewall` refuses in words
    with exit 2, `jobs` lists no job; neither reaches Slurm."""
    path = tmp_path / "slurm.yaml"
    path.write_text("slurm:\n  nodes: 2\njob:\n  task: worker.examples.shapes:task\n  steps: 5\n")
    refused = cli("firewall", str(path))
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2, refused.stderr
    assert "the workers are placed by `slurm:`" in said and "Traceback" not in said
    jobs = cli("jobs", str(path))
    assert jobs.returncode == 0 and "no job holds a lease" in jobs.stderr, jobs.stderr
