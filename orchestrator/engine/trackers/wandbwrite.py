"""One write into a W&B run, in a process of its own (`python -m
orchestrator.engine.trackers.wandbwrite`, the plan as JSON on stdin): engine/trackers/wandbrun.py
starts it and kills it past its limit.

A process of its own because W&B's client is made for the training process: wandb.init()
installs exit hooks, starts a service process (wandb-core) and may wait on the network at
finish() for as long as an upload takes. The controller's supervisor lives for days and must
end on time; a child that hangs is killed with its whole process group, and W&B's console
output stays in the child's pipes. Only the standard library, wandb and contract.py (itself
standard library only) are imported here.

The plan (`Plan`, as JSON) says which run and what to write; the run is resumed when it exists
(resume="allow"), made otherwise. A failure is one line on stdout (`error: ...`) and exit
status 1.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract import install_hint

INIT_TIMEOUT = 20.0  # seconds wandb.init() waits for W&B's server (its default: 90)
FINISH_TIMEOUT = 20.0  # seconds finish() waits for the upload (its default: as long as it takes)
MESSAGE_LIMIT = 400  # characters of a failure's message


@dataclass(frozen=True)
class Plan:
    """One write: the run (id, project, entity), what goes into it, and its exit code."""

    id: str
    project: str
    entity: str | None
    exit_code: int  # W&B: 0 finished, another failed
    name: str | None = None  # None: the run keeps its name
    config: dict[str, Any] | None = None
    summary: dict[str, Any] = field(default_factory=dict)


def settings(wandb: Any) -> Any:
    """A quiet session that writes only what it is given: no console capture, no system
    metrics, no code, git state or requirements of the controller's machine."""
    return wandb.Settings(silent=True, quiet=True, console="off", x_disable_stats=True,
                          x_disable_machine_info=True, x_save_requirements=False,
                          save_code=False, disable_git=True, disable_job_creation=True,
                          init_timeout=INIT_TIMEOUT, finish_timeout=FINISH_TIMEOUT)  # fmt: skip


def write(plan: Plan, wandb: Any) -> None:
    """The plan's config and summary into its run, which then ends with its exit code."""
    run = wandb.init(id=plan.id, project=plan.project, entity=plan.entity, name=plan.name,
                     config=plan.config, resume="allow", settings=settings(wandb))  # fmt: skip
    try:
        if plan.summary:
            run.summary.update(plan.summary)
    finally:
        run.finish(exit_code=plan.exit_code)


def main() -> int:
    # Not from the working directory (the state directory, where W&B's own `wandb/` folder of
    # run files would import as a namespace package where wandb is not installed).
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    try:
        plan = Plan(**json.load(sys.stdin))
        try:
            import wandb
        except ImportError as exc:
            raise RuntimeError(f"job.tracking.wandb needs W&B's client on this machine ({exc}): "
                               f"{install_hint('wandb')}") from exc  # fmt: skip
        write(plan, wandb)
        wandb.teardown()
    except Exception as exc:  # whatever W&B raised: said to the controller in one line
        # A few lines: the first of a settings error only says that one was found.
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()][:3]
        print(f"error: {type(exc).__name__}: {'; '.join(lines)[:MESSAGE_LIMIT]}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
