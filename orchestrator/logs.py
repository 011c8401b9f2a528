"""Worker logs: the last lines of each, or all of them followed at once."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

from orchestrator.connect import Machines
from orchestrator.errors import HostError, RunStateError
from orchestrator.fanout import fan_out, successes
from orchestrator.runstore import RunRecord, WorkerRecord


def select_workers(record: RunRecord, names: Sequence[str]) -> list[WorkerRecord]:
    if not names:
        return list(record.workers)
    known = {w.name: w for w in record.workers}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise RunStateError(
            f"no worker named {', '.join(unknown)} in run {record.run_id}",
            hint=f"the workers are: {', '.join(known)}",
        )
    return [known[n] for n in names]


def _tail_argv(worker: WorkerRecord, lines: int, follow: bool) -> list[str]:
    # -F keeps following across the log being created late or rotated.
    return ["tail", "-n", str(lines), *(["-F"] if follow else []), worker.log_path]


def last_lines(
    workers: Sequence[WorkerRecord], machines: Machines, lines: int
) -> list[tuple[str, str]]:
    def read(worker: WorkerRecord) -> list[str]:
        result = machines.runner(worker.host).run(_tail_argv(worker, lines, follow=False))
        if not result.ok and "No such file" not in result.stderr:
            raise HostError(worker.name, f"cannot read {worker.log_path}: {result.tail(2)}")
        return result.stdout.splitlines()

    logs = successes(fan_out(workers, read), "reading the logs")
    return [(worker.name, line) for worker in workers for line in logs[worker]]


def follow(
    workers: Sequence[WorkerRecord], machines: Machines, lines: int
) -> Iterator[tuple[str, str]]:
    """Interleave every worker's new lines as they arrive, until the caller stops iterating."""
    lines_queue: queue.Queue[tuple[str, str]] = queue.Queue()

    def pump(worker: WorkerRecord) -> None:
        try:
            for line in machines.runner(worker.host).stream(_tail_argv(worker, lines, True)):
                lines_queue.put((worker.name, line))
        except HostError as error:
            lines_queue.put((worker.name, f"[orchestrate] stopped following: {error.message}"))

    for worker in workers:
        threading.Thread(target=pump, args=(worker,), daemon=True).start()
    while True:
        yield lines_queue.get()
