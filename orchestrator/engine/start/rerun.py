"""A job started again: nothing to train when its chief's latest checkpoint reaches job.steps,
and `up --fresh`, which sets the job's checkpoints and the chief's TensorBoard events aside
(moved, never deleted) to train from 0.

Only the built-in loop's checkpoints are read: the worker names each `ckpt-<step>`
(checkpoints.checkpoint_step), so the chief's listing says the step without TensorFlow. A
script's checkpoints are its own business: a script job always starts. Without this, a finished
job run again started every worker, each found the last checkpoint and exited, and the new run,
with nothing trained, became the one `status` shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from orchestrator.backends.capabilities import Files, Lifecycle
from orchestrator.contract import EXPORT_WRITES
from orchestrator.engine.store.checkpoints import checked_listing, checkpoint_step
from orchestrator.errors import HostError, HostErrors
from orchestrator.model.answers import SetAside
from orchestrator.model.inventory import Inventory, Job
from orchestrator.model.workers import checkpoint_dir, export_dir, job_dir, tensorboard_dir


@dataclass(frozen=True)
class Trained:
    """The chief's latest checkpoint reaches job.steps already: nothing to train."""

    checkpoint: str  # ckpt-300
    steps: int  # job.steps
    directory: str  # the chief's checkpoint directory, as its host spells it
    host: str  # the chief's worker slot

    @property
    def message(self) -> str:
        return (
            f"{self.checkpoint} already reaches steps: {self.steps}: nothing to train (the "
            f"checkpoints in {self.directory} on {self.host}; raise job.steps, or 'orchestrate "
            "up --fresh' starts over from step 0, setting them aside)"
        )


def reached(job: Job, latest: str | None) -> bool:
    """Whether the chief's latest checkpoint `latest` (`ckpt-<step>`) reaches job.steps: the
    built-in loop's only (job.task); a script's checkpoints may be numbered otherwise."""
    if job.task is None or job.steps is None or latest is None:
        return False
    return checkpoint_step(latest) >= job.steps


def exported(job: Job, names: Iterable[str]) -> bool:
    """Whether the export directory's files (`names`, paths relative to it) hold the model
    job.export asks for; True when it asks for none. A finished job run again with another
    `export:` still starts: its workers export from the last checkpoint at once."""
    if job.export is None:
        return True
    wanted = EXPORT_WRITES[job.export]
    return any(name.split("/", 1)[0] in wanted for name in names)


def already_trained(inventory: Inventory, lifecycle: Lifecycle, files: Files) -> Trained | None:
    """The chief's checkpoint when it reaches job.steps and the export is there (nothing for a
    start to do); None otherwise, and when the chief's host cannot be read: the start reaches
    the hosts next and says what is wrong there. Two or three answers of the chief's agent."""
    job = inventory.job
    if job.task is None or job.steps is None:
        return None
    chief = inventory.hosts[0]  # config/roles puts the chief first
    try:
        workdir = lifecycle.workdirs([chief]).raise_if_failed("reaching the chief")[chief.name]
        directory = job_dir(job, workdir)
        listing = checked_listing(chief, files.checkpoint(chief, checkpoint_dir(job, directory)))
        if not reached(job, listing.latest) or listing.latest is None:
            return None
        names = files.list_files(chief, export_dir(directory)).files if job.export else {}
    except (HostError, HostErrors):
        return None
    if not exported(job, names):
        return None
    return Trained(listing.latest, job.steps, listing.directory, chief.name)


def fresh_stamp(now: datetime | None = None) -> str:
    """The set-aside directories' suffix: the same UTC time on every host."""
    return (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")


def set_aside_checkpoints(
    inventory: Inventory,
    lifecycle: Lifecycle,
    files: Files,
    say: Callable[[str], None],
    stamp: str | None = None,
) -> list[SetAside]:
    """`up --fresh`: the checkpoint directory of every worker slot (the chief's, and the copies
    a resume spread to the others) and of every spare, emptied into a sibling
    `DIRECTORY.set-aside-STAMP` on its host; each move said. A stale copy left on one host
    would be restored there while the chief starts from 0. One host after another: slots of one
    machine that share the directory see it moved once. A worker slot that cannot be reached
    fails the start (exit 3; nothing is lost, the moves done stay done); a spare, often the
    host that is down, is only said."""
    job = inventory.job
    stamp = stamp or fresh_stamp()
    workdirs = dict(lifecycle.workdirs(inventory.hosts).raise_if_failed(
        "reaching the hosts to set their checkpoints aside (--fresh)"))  # fmt: skip
    spares = lifecycle.workdirs(inventory.spares)
    for name, error in spares.failed.items():
        say(f"--fresh: spare {name} not reached ({error.message}): a checkpoint directory it "
            "may hold is not set aside")  # fmt: skip
    workdirs.update(spares.ok)
    hosts = [h for h in (*inventory.hosts, *inventory.spares) if h.name in workdirs]
    moved = []
    for host in hosts:
        directory = checkpoint_dir(job, job_dir(job, workdirs[host.name]))
        result = files.set_aside(host, directory, stamp)
        if result.moved_to is not None:
            say(f"--fresh: set aside {result.count} file(s) of {result.directory} on "
                f"{host.name}: moved to {result.moved_to}")  # fmt: skip
            moved.append(result)
    chief = inventory.hosts[0]
    if not moved:
        directory = checkpoint_dir(job, job_dir(job, workdirs[chief.name]))
        say(f"--fresh: no checkpoint to set aside ({directory} on {chief.name} holds none); "
            "training from step 0")  # fmt: skip
    # The chief's TensorBoard events too: the new run's curves would start again at step 0 over
    # the old ones in the same directory.
    events_dir = tensorboard_dir(checkpoint_dir(job, job_dir(job, workdirs[chief.name])))
    events = files.set_aside(chief, events_dir, stamp)
    if events.moved_to is not None:
        say(f"--fresh: set aside the TensorBoard events of {events.directory} on {chief.name}: "
            f"moved to {events.moved_to}")  # fmt: skip
    return moved
