"""The pool backend: each worker is a child process of this controller, in a directory that
stands for the pool; no host agent, no SSH, no scheduler.

It implements the five capabilities every backend has (backends/capabilities.py) on local files and
processes and declares it has none of the optional ones (its properties stay None), which is all
`check` and `up` need: registered with one registry line (tests/unit/test_fourth_backend.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from orchestrator.backends.base import Backend
from orchestrator.contract import TF_CONFIG_ENV
from orchestrator.fanout import GroupResult
from orchestrator.model.answers import (
    BY_DOWN,
    CheckpointListing,
    FileListing,
    SetAside,
    StackAnswer,
    StopAnswer,
    WorkerProbe,
)
from orchestrator.model.findings import CHECK, Finding, PreflightOptions, PreflightReport, Status
from orchestrator.model.inventory import Inventory, WorkerSlot
from orchestrator.model.records import WorkerRecord
from orchestrator.model.workers import Started, WorkerSpec
from tests.fakes.pool.source import PoolSpec

EXIT_FILE = "exit.json"
# Runs a worker and records how it ended, as a host's minder does (hostside/minder.py).
RUNNER = """\
import json, os, subprocess, sys, time
code = subprocess.call(sys.argv[2:])
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump({"returncode": code, "finished_at": time.time()}, f)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


class PoolBackend(Backend):
    shared_checkpoints = True  # every slot's files are this machine's

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.children: dict[str, subprocess.Popen[bytes]] = {}  # run dir -> its runner

    @classmethod
    def for_inventory(cls, inventory: Inventory | None) -> PoolBackend:
        assert inventory is not None and isinstance(inventory.source_settings, PoolSpec)
        return cls(inventory.source_settings)

    def close(self) -> None:
        for child in self.children.values():
            child.wait(timeout=30)  # a foreground `up` returns after its workers ended

    # --- Lifecycle ---------------------------------------------------------------------------
    def workdirs(self, hosts: Sequence[WorkerSlot]) -> GroupResult[str, str]:
        return GroupResult({host.name: self.spec.root for host in hosts})

    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, Started]:
        started = {}
        for spec in specs:
            Path(spec.run_dir).mkdir(parents=True, exist_ok=True)
            env = {**os.environ, **spec.env, TF_CONFIG_ENV: json.dumps(spec.tf_config)}
            with open(spec.log_path, "wb") as log:
                child = subprocess.Popen(
                    [sys.executable, "-c", RUNNER, str(Path(spec.run_dir) / EXIT_FILE), *spec.argv],
                    cwd=spec.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            self.children[spec.run_dir] = child
            started[spec.name] = Started(pid=child.pid)
        return GroupResult(started)

    def probe(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, WorkerProbe]:
        return GroupResult({w.name: self._probe(w) for w in workers})

    def _probe(self, worker: WorkerRecord) -> WorkerProbe:
        run_dir = Path(worker.run_dir)
        ended = _json(run_dir / EXIT_FILE)
        child = self.children.get(worker.run_dir)
        alive = ended is None and child is not None and child.poll() is None
        return WorkerProbe.parse({"exists": run_dir.is_dir(), "pid": worker.pid, "alive": alive,
                                  "progress": _json(run_dir / "progress.json"), "exit": ended},
                                 now=time.time())  # fmt: skip

    def stop(
        self, workers: Sequence[WorkerRecord], grace: float, by: str = BY_DOWN
    ) -> GroupResult[str, StopAnswer]:
        answers = {}
        for worker in workers:
            child = self.children.get(worker.run_dir)
            if child is None or child.poll() is not None:
                answers[worker.name] = StopAnswer("not running")
                continue
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=grace)
                answers[worker.name] = StopAnswer("stopped")
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                answers[worker.name] = StopAnswer("killed")
        return GroupResult(answers)

    def stacks(
        self, workers: Sequence[WorkerRecord], wait: float, native: bool = False
    ) -> GroupResult[str, StackAnswer]:
        return GroupResult({w.name: StackAnswer(error="a pool keeps no stacks") for w in workers})

    # --- Logs ---------------------------------------------------------------------------------
    def log_lines(self, worker: WorkerRecord, lines: int) -> list[str]:
        path = Path(worker.log_path)
        return path.read_text().splitlines()[-lines:] if path.exists() else []

    def follow_log(self, worker: WorkerRecord, lines: int) -> Iterator[str]:
        yield from self.log_lines(worker, lines)

    # --- Files: the pool's root is this machine's -----------------------------------------------
    def checkpoint(self, host: WorkerSlot, directory: str) -> CheckpointListing:
        return CheckpointListing(directory, None, {})  # the scripts here keep none

    def adopt_checkpoint(
        self, host: WorkerSlot, directory: str, name: str, checkpoints: Sequence[str]
    ) -> None:
        raise AssertionError("the pool's checkpoints are shared: none is ever adopted")

    def set_aside(self, host: WorkerSlot, directory: str, stamp: str) -> SetAside:
        return SetAside(directory, None)  # the scripts here keep no checkpoint to set aside

    def list_files(self, host: WorkerSlot, directory: str) -> FileListing:
        root = Path(directory)
        return FileListing(directory, {str(p.relative_to(root)): (p.stat().st_size,
                                                                  p.stat().st_mtime)
                                       for p in root.rglob("*") if p.is_file()})  # fmt: skip

    def read_text(self, host: WorkerSlot, path: str) -> str | None:
        return Path(path).read_text() if Path(path).exists() else None

    def download(self, host: WorkerSlot, remote: str, local: str) -> None:
        shutil.copyfile(remote, local)

    def upload(self, host: WorkerSlot, files: Sequence[tuple[str, str]]) -> None:
        for here, there in files:
            Path(there).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(here, there)

    # --- Preparation and Reach ------------------------------------------------------------------
    def preflight(self, inventory: Inventory, options: PreflightOptions = CHECK) -> PreflightReport:
        root = Path(self.spec.root)
        usable = root.is_dir() and os.access(root, os.W_OK)
        return PreflightReport(tuple(
            Finding(host.name, "pool", Status.OK if usable else Status.FAIL,
                    f"slot of the pool at {root}" if usable else f"{root} is no writable directory")
            for host in inventory.hosts
        ))  # fmt: skip

    def unreachable(self, hosts: Sequence[WorkerSlot]) -> dict[str, str]:
        return {}

    def reads_in_place(self, host: WorkerSlot) -> bool:
        return True


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
