"""`connection: local`: workers are processes on this machine (the local simulation)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.machines.kinds.base import Kind, ReportProblem
from orchestrator.paths import controller_path, is_loopback

if TYPE_CHECKING:
    from orchestrator.machines.runner import Runner
    from orchestrator.model.inventory import WorkerSlot


class LocalKind(Kind):
    name: ClassVar[str] = "local"
    shares_files_with_controller: ClassVar[bool] = True

    def prepare(self, values: dict[str, Any], problem: ReportProblem, base: Path) -> None:
        if "address" in values and not is_loopback(values["address"]):
            problem(
                "address",
                "a local worker runs on this machine; use localhost or 127.0.0.1, "
                f"got {values['address']!r}",
            )
        # The controller's own Python: the local simulation needs no other install.
        values.setdefault("python", sys.executable)
        values["workdir"] = str(controller_path(values["workdir"], base))

    def machine_key(self, host: WorkerSlot) -> tuple[str, ...]:
        return ("local",)

    def runner(self, host: WorkerSlot) -> Runner:
        from orchestrator.machines.runner import LocalRunner

        return LocalRunner("localhost")
