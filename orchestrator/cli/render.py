"""Turn statuses into terminal tables and plain lines. Builds renderables; never prints.

What a host, a worker or another user's file said (a reason, a devices list, a lease holder,
a finding's detail) goes into a table as plain Text through model/printable: its control
characters shown as escapes, its brackets not read as Rich markup, its cells measured as
they will show. The lines these functions return are printable already."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from orchestrator.cli.format import (
    STATE_STYLES,
    number,
    shown,
    size,
    step_text,
)
from orchestrator.cli.statustable import StatusTable, shared_values
from orchestrator.engine.observe.rolepolicy import labelled
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.model.answers import StandbyInfo
from orchestrator.model.leases import LeaseListing, clock
from orchestrator.model.printable import printable
from orchestrator.model.timetext import duration
from orchestrator.model.vocabulary import WorkerState


def status_table(status: RunStatus) -> StatusTable:
    """The run's line and its workers' table, its columns chosen by the width it is printed at
    (cli/statustable.py)."""
    title = Text.assemble(
        f"run {status.run_id}  job {status.job}  ",
        (status.state.value, STATE_STYLES[status.state]),
    )
    if status.restarts:
        last = printable(status.restarts[-1].describe())
        title.append(f"  attempt {status.attempt}, {len(status.restarts)} restart(s), last: {last}")
    for line in status.alone:  # ParameterServerStrategy workers started again by themselves
        title.append(f"\n{printable(line)}")
    if status.eta_seconds is not None:
        title.append(f"  ETA {duration(status.eta_seconds)}")
    if status.outcome:
        title.append("\n" + printable(status.outcome), style="red")
    if status.leases_lost:
        title.append("\nrunning unleased: " + printable(status.leases_lost), style="red")
    return StatusTable(status, title)


def standby_lines(standbys: dict[str, StandbyInfo]) -> list[str]:
    """The slots' standbys (not workers): lingering after the run for the job's next `up`, or
    waiting for a restart; their pids and memory."""
    lines = []
    for name, standby in standbys.items():
        if standby.lingering:
            what = f"lingering {duration(standby.left_s)} more for the next 'up' of the job"
            if standby.run_id:
                what += f" (left by run {standby.run_id})"
        else:
            what = f"waiting for a restart of run {standby.run_id}"
        ready = "" if standby.ready else ", importing TensorFlow"
        lines.append(f"standby {name}: {what}, pid {standby.worker_pid or standby.pid}"
                     f"{ready}, {size(standby.rss_bytes)}")  # fmt: skip
    return [printable(line) for line in lines]


def kept_warm(standbys: dict[str, StandbyInfo]) -> str | None:
    """What the end of `up` leaves running: "2 standbys of worker-0, worker-1 kept warm for
    the next `up` (1.2 GiB, 5m00s; `orchestrate down` frees them)"; None when none lingers."""
    lingering = {name: s for name, s in standbys.items() if s.lingering}
    if not lingering:
        return None
    count = len(lingering)
    memory = sum(s.rss_bytes or 0 for s in lingering.values())
    left = max((s.left_s for s in lingering.values() if s.left_s is not None), default=None)
    amount = f"{memory / 2**30:.1f} GiB" if memory >= 2**30 else size(memory)
    if not all(s.ready for s in lingering.values()):  # a fresh one grows to ~450 MiB here
        amount += " so far, importing TensorFlow"
    plural = "s" if count > 1 else ""
    return printable(
        f"{count} standby{plural} of {', '.join(lingering)} kept warm for the next `up` "
        f"({amount}, {duration(left)}; `orchestrate down` frees them)"
    )


def problems(status: RunStatus) -> list[str]:
    """One line per worker that failed or could not be asked, with why and what to do; and
    each worker's note (a checkpoint fallback)."""
    lines = []
    for w in status.workers:
        if w.state in (WorkerState.FAILED, WorkerState.UNKNOWN) and w.reason:
            lines.append(f"{labelled(w.name, w.role)}: {w.state.value}: {w.reason}")
            if w.hint:
                lines.append(f"  what to do: {w.hint}")
    lines += [f"{w.name}: {w.note}" for w in status.workers if w.note]
    lines += [f"pace: {status.pace}"] if status.pace else []
    return [printable(line) for line in lines]


def progress_line(worker: WorkerStatus) -> str:
    """A plain line for logs and pipes, where a live table would be noise."""
    parts = [f"{labelled(worker.name, worker.role)}: {worker.state.value}"]
    if worker.step is not None:
        parts.append(f"step {step_text(worker)}")
    if worker.loss is not None:
        parts.append(f"loss {number(worker.loss)}")
    if worker.val_accuracy is not None:
        parts.append(f"val_accuracy {number(worker.val_accuracy, 3)}")
    if worker.checkpoint_step is not None:
        parts.append(f"checkpoint {worker.checkpoint_step}")
    if worker.eta_seconds is not None:
        parts.append(f"ETA {duration(worker.eta_seconds)}")
    if worker.reason and worker.state in (WorkerState.FAILED, WorkerState.UNKNOWN):
        parts.append(worker.reason)
    return printable("  ".join(parts))


def run_line(status: RunStatus) -> str | None:
    """One line for the whole run when its workers are in one state at one step with one loss
    (lockstep), for logs and pipes; None when they differ."""
    workers = status.workers
    if len(workers) < 2 or len({w.state for w in workers}) > 1:
        return None
    once = shared_values(workers)
    if "step" not in once:
        return None
    parts = [f"run {status.run_id}: {workers[0].state.value}, {len(workers)} workers"]
    parts += [f"{name} {value}" for name, value in once.items()]
    if status.eta_seconds is not None:
        parts.append(f"ETA {duration(status.eta_seconds)}")
    return printable("  ".join(parts))


def jobs_table(listing: LeaseListing) -> Table:
    """`orchestrate jobs`: one row per run holding leases. Every cell is printable plain Text:
    the records come from other users of the hosts."""
    table = Table(title="jobs holding leases", title_justify="left", expand=False)
    for column in ("user", "job", "run", "controller", "hosts", "ports", "GPUs", "since"):
        table.add_column(column)
    for job in listing.jobs:
        holder = job.holder
        gpus = "; ".join(f"{host}: {','.join(map(str, ids))}" for host, ids in job.gpus.items())
        table.add_row(
            *(shown(value) for value in (
                holder.user, holder.job, holder.run_id, holder.controller,
                ", ".join(job.hosts), ",".join(map(str, job.ports)) or "-", gpus or "-",
                clock(holder.since),
            ))
        )  # fmt: skip
    return table


def queue_table(listing: LeaseListing) -> Table:
    """`orchestrate jobs`: the queued runs, in their order (the next to start first)."""
    table = Table(title="queued jobs, in order", title_justify="left", expand=False)
    for column in ("#", "user", "job", "run", "controller", "hosts", "waits for", "since"):
        table.add_column(column, justify="right" if column == "#" else "left")
    for place, job in enumerate(listing.queued, 1):
        holder = job.holder
        wants = "; ".join(
            f"{host}: " + ", ".join(
                part for part in (
                    ("port " + ",".join(map(str, t.ports))) if t.ports else "",
                    (f"{t.count} of GPUs " + ",".join(map(str, t.gpus))) if t.count else "",
                ) if part
            )
            for host, t in job.hosts.items() if t.ports or t.count
        )  # fmt: skip
        table.add_row(
            *(shown(value) for value in (
                str(place), holder.user, holder.job, holder.run_id, holder.controller,
                ", ".join(job.hosts), wants or "-", clock(holder.since),
            ))
        )  # fmt: skip
    return table
