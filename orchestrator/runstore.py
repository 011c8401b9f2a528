"""The controller's record of runs, kept in a state directory so any later shell finds them.

{state_dir}/current                the id of the latest run
{state_dir}/runs/{run_id}.json     the run: inventory, and per worker its host and run directory
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import RunStateError
from orchestrator.inventory import Host

DEFAULT_STATE_DIR = ".orchestrate"


@dataclass(frozen=True)
class WorkerRecord:
    name: str
    index: int
    host: Host
    run_dir: str
    log_path: str
    checkpoint_dir: str
    pid: int | None = None


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    inventory_path: str
    job_name: str
    created_at: float
    workers: tuple[WorkerRecord, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        workers = tuple(
            WorkerRecord(**{**worker, "host": Host(**worker["host"])}) for worker in data["workers"]
        )
        return cls(**{**data, "workers": workers})


class RunStore:
    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir)

    def _run_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{run_id}.json"

    def save(self, record: RunRecord) -> None:
        path = self._run_path(record.run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, json.dumps(record.to_json(), indent=2))
        _atomic_write(self.root / "current", record.run_id + "\n")

    def load(self, run_id: str | None = None) -> RunRecord:
        """The named run, or the latest one."""
        run_id = run_id or self.current_id()
        if run_id is None:
            raise RunStateError(
                f"no run found in {self.root.resolve()}",
                hint="start one with 'orchestrate up INVENTORY', or point --state-dir "
                "(ORCHESTRATE_STATE_DIR) at the directory you started it from",
            )
        try:
            data = json.loads(self._run_path(run_id).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise RunStateError(
                f"no run '{run_id}' in {self.root.resolve()}",
                hint="'ls " + str(self.root / "runs") + "' lists the known runs",
            ) from exc
        except (OSError, ValueError, TypeError) as exc:
            raise RunStateError(f"the record of run '{run_id}' is unreadable: {exc}") from exc
        return RunRecord.from_json(data)

    def current_id(self) -> str | None:
        try:
            return (self.root / "current").read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
