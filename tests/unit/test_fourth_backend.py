"""A fourth backend, defined in the test tree, runs `check` and `up` unchanged.

Its folder (tests/fakes/pool/: the backend, its host source) and one line of the registry's
table are all it takes: no module of orchestrator/ knows it, which is the proof of
docs/design.md's "What a new backend touches". Its workers are real local processes.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from orchestrator.backends import registry
from orchestrator.cli import cli
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import InventoryError
from tests.conftest import free_ports
from tests.fakes.pool.backend import PoolBackend
from tests.fakes.pool.source import SOURCE, PoolSpec

SCRIPT = """\
import json, os, sys
steps = int(sys.argv[1])
for step in range(1, steps + 1):
    with open(os.environ["ORCHESTRATE_PROGRESS_FILE"] + ".tmp", "w") as f:
        json.dump({"step": step, "target_steps": steps}, f)
    os.replace(os.environ["ORCHESTRATE_PROGRESS_FILE"] + ".tmp",
               os.environ["ORCHESTRATE_PROGRESS_FILE"])
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("finished", os.environ["ORCHESTRATE_WORKER"], "task", task["index"], flush=True)
"""


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Path]:
    registry.register(registry.Entry(SOURCE, lambda: PoolBackend))  # the one table line
    yield tmp_path
    registry.unregister(SOURCE.name)


def write_inventory(root: Path) -> Path:
    (root / "train.py").write_text(SCRIPT)
    (root / "pool").mkdir()
    inventory = root / "inv.yaml"
    inventory.write_text(
        textwrap.dedent(f"""\
        pool: {{slots: 2, base_port: {free_ports(1)[0]}, root: pool}}
        job:
          name: demo
          script: train.py
          args: [3]
          restart_backoff: 0
        """)
    )
    return inventory


def orchestrate(root: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--state-dir", str(root / "state"), *args],
                              catch_exceptions=False)  # fmt: skip


def test_check_and_up_on_a_backend_registered_from_outside(pool: Path) -> None:
    inventory = write_inventory(pool)
    check = orchestrate(pool, "check", "--json", str(inventory))
    assert check.exit_code == 0, check.output
    findings = json.loads(check.stdout)
    assert [(f["host"], f["check"], f["status"]) for f in findings] == [
        ("slot0", "pool", "ok"), ("slot1", "pool", "ok"),
    ]  # fmt: skip

    up = orchestrate(pool, "up", "--interval", "0.1", str(inventory))
    assert up.exit_code == 0, up.output
    record = RunStore(pool / "state").load()
    # The record names its host source and keeps the pool's own settings, read back as such.
    assert record.inventory.host_source == "pool"
    assert record.inventory.source_settings == PoolSpec(2, record.inventory.hosts[0].port,
                                                  str(pool / "pool"))  # fmt: skip
    for index, worker in enumerate(record.workers):
        log = Path(worker.log_path)
        assert log.is_relative_to(pool / "pool"), log  # in the pool's root, by its workdirs
        assert f"finished {worker.name} task {index}" in log.read_text()
    status = json.loads(orchestrate(pool, "status", "--json").output)
    assert status["state"] == "succeeded"
    assert [(w["name"], w["step"]) for w in status["workers"]] == [("slot0", 3), ("slot1", 3)]


def test_its_keys_are_in_the_reference_and_a_mistake_is_named(pool: Path) -> None:
    blocks = {where: entries for where, _, entries in registry.key_reference()}
    assert [key.name for key in blocks["pool"]] == ["slots", "base_port", "root"]
    inventory = write_inventory(pool)
    inventory.write_text(inventory.read_text().replace("slots: 2", "slotz: 2"))
    with pytest.raises(InventoryError) as caught:
        registry.load_inventory(inventory)
    assert caught.value.exit_code == 2
    assert [(p.key, p.message) for p in caught.value.problems] == [
        ("pool.slotz", "unknown key; did you mean 'slots'?"), ("pool.slots", "missing"),
    ]  # fmt: skip
