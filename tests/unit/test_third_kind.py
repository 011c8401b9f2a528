"""A connection kind defined here, in the test tree, runs `up`, `status` and `down` unchanged.

The kind is registered from outside orchestrator/ and no module of orchestrator/ knows it: the
proof that a new kind of cluster is its own module plus one registration. "sandbox" machines are
directories on this machine that pretend to be remote: each has its own home, files reach it only
through the runner's put/get (nothing is shared with the controller), and its workers are real
local processes started by the real host agent.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from orchestrator.backends.registry import key_reference, load_inventory, open_backend
from orchestrator.cli import cli
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.workers.lifecycle import start_run
from orchestrator.machines import kinds
from orchestrator.machines.kinds.base import Kind
from orchestrator.machines.runner import CommandResult, LineSession, LocalRunner, Runner
from orchestrator.model.inventory import KindSettings, WorkerSlot
from orchestrator.values import Checker, Key, checkers, string
from tests.conftest import free_ports, wait_for


@dataclass(frozen=True)
class SandboxSettings(KindSettings):
    sandbox_root: str = "/nonexistent"


def sandbox_root(host: WorkerSlot) -> str:
    assert isinstance(host.settings, SandboxSettings), host.settings
    return host.settings.sandbox_root


class SandboxRunner(Runner):
    """Local processes whose HOME is the sandbox: `~` on that "machine" is its own directory."""

    def __init__(self, host: WorkerSlot) -> None:
        super().__init__(host.name)
        self.home = sandbox_root(host)
        self.local = LocalRunner(host.name)
        self.copies: list[str] = []

    def _env(self, argv: Sequence[str]) -> list[str]:
        return ["env", f"HOME={self.home}", *argv]

    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        return self.local.run(self._env(argv), timeout=timeout)

    def session(self, argv: Sequence[str]) -> LineSession:
        return self.local.session(self._env(argv))

    def stream(self, argv: Sequence[str]) -> Iterator[str]:
        return self.local.stream(self._env(argv))

    def put(self, local: str, remote: str) -> None:
        self.copies.append(remote)
        self.local.put(local, remote)

    def get(self, remote: str, local: str) -> None:
        self.local.get(remote, local)

    def close(self) -> None:
        self.local.close()


class SandboxKind(Kind):
    name: ClassVar[str] = "sandbox"
    # Its keys, described for the manual's key reference (tests/unit/test_key_reference.py).
    key_entries: ClassVar[tuple[Key, ...]] = (
        Key("sandbox_root", "string", "required", "the directory that stands for the machine",
            string),
    )  # fmt: skip
    keys: ClassVar[dict[str, Checker]] = checkers(key_entries)
    settings_type: ClassVar[type] = SandboxSettings
    controller_paths: ClassVar[tuple[str, ...]] = ("sandbox_root",)
    default_python: ClassVar[str] = sys.executable

    def machine_key(self, host: WorkerSlot) -> tuple[str, ...]:
        return ("sandbox", sandbox_root(host))

    def runner(self, host: WorkerSlot) -> Runner:
        return SandboxRunner(host)


SCRIPT = """\
import json, os, sys, time
steps = int(sys.argv[1])
for step in range(1, steps + 1):
    time.sleep(float(os.environ["DELAY"]))
    with open(os.environ["ORCHESTRATE_PROGRESS_FILE"] + ".tmp", "w") as f:
        json.dump({"step": step, "target_steps": steps}, f)
    os.replace(os.environ["ORCHESTRATE_PROGRESS_FILE"] + ".tmp",
               os.environ["ORCHESTRATE_PROGRESS_FILE"])
print("finished", os.environ["ORCHESTRATE_WORKER"], "home", os.environ["HOME"], flush=True)
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Path]:
    kinds.register(SandboxKind())
    yield tmp_path
    kinds.unregister(SandboxKind.name)


def write_inventory(root: Path, delay: float, steps: int) -> Path:
    (root / "train.py").write_text(SCRIPT)
    for name in ("m1", "m2"):
        (root / name).mkdir()
    ports = free_ports(2)
    inventory = root / "inv.yaml"
    inventory.write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: sandbox, workdir: jobs}}
        hosts:
          - {{name: m1, address: 127.0.0.1, port: {ports[0]}, sandbox_root: m1}}
          - {{name: m2, address: 127.0.0.1, port: {ports[1]}, sandbox_root: m2}}
        job:
          name: demo
          script: train.py
          args: [{steps}]
          env: {{DELAY: {delay}}}
          restart_backoff: 0
        """)
    )
    return inventory


def orchestrate(root: Path, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["--state-dir", str(root / "state"), *args],
                                catch_exceptions=False)  # fmt: skip
    return result


def test_up_status_down_on_a_kind_registered_from_outside(sandbox: Path) -> None:
    inventory = write_inventory(sandbox, delay=0.01, steps=5)
    result = orchestrate(sandbox, "up", "--skip-checks", "--interval", "0.1", str(inventory))
    assert result.exit_code == 0, result.output
    status = json.loads(orchestrate(sandbox, "status", "--json").output)
    assert status["state"] == "succeeded"
    assert [(w["name"], w["step"]) for w in status["workers"]] == [("m1", 5), ("m2", 5)]
    for name in ("m1", "m2"):
        # The script was uploaded into the machine's own home, not run from the controller's dir.
        log = next((sandbox / name / "jobs" / "demo" / "runs").glob("*/attempt-0/*/worker.log"))
        assert f"finished {name} home {sandbox / name}" in log.read_text()
        assert (log.parent / "train.py").read_text() == SCRIPT

    # A long run, started as `up --detach` starts it (the detached supervisor is another
    # process, which would not have this test's registration), then status and down.
    long = sandbox / "long"
    long.mkdir()
    inventory = write_inventory(long, delay=0.2, steps=1000)
    with open_backend() as backend:
        start_run(load_inventory(inventory), RunStore(long / "state"), backend)

    def all_running() -> dict[str, Any] | None:
        status = json.loads(orchestrate(long, "status", "--json").output)
        return status if {w["state"] for w in status["workers"]} == {"running"} else None

    running = wait_for(all_running, timeout=30)
    assert all(w["step"] >= 1 for w in running["workers"])
    down = orchestrate(long, "down", "--grace", "2")
    assert down.exit_code == 0, down.output
    assert "m1: stopped" in down.output and "m2: stopped" in down.output
    final = json.loads(orchestrate(long, "status", "--json").output)
    assert {w["state"] for w in final["workers"]} == {"stopped"}
    pids = [w["pid"] for w in final["workers"]]
    assert not [p for p in pids if p and _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_kind_registered_from_outside_is_in_the_key_reference(sandbox: Path) -> None:
    blocks = {where: entries for where, _, entries in key_reference()}
    assert [key.name for key in blocks["connection: sandbox"]] == ["sandbox_root"]
