"""Worker logs: the last lines of each, or all of them followed at once."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence

from orchestrator.backends.base import Logs
from orchestrator.errors import HostError, RunStateError
from orchestrator.fanout import fan_out
from orchestrator.model.records import RunRecord, WorkerRecord


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


def last_lines(workers: Sequence[WorkerRecord], logs: Logs, lines: int) -> list[tuple[str, str]]:
    by_name = {w.name: w for w in workers}
    tails = fan_out(by_name, lambda n: logs.log_lines(by_name[n], lines)).raise_if_failed(
        "reading the logs"
    )
    return [(worker.name, line) for worker in workers for line in tails[worker.name]]


def follow(workers: Sequence[WorkerRecord], logs: Logs, lines: int) -> Iterator[tuple[str, str]]:
    """Interleave every worker's new lines as they arrive, until the caller stops iterating."""
    lines_queue = _followed(workers, logs, lines)
    while True:
        yield lines_queue.get()


def follow_timed(
    workers: Sequence[WorkerRecord], logs: Logs, lines: int, tick: float
) -> Iterator[tuple[float, str, str] | None]:
    """follow's lines with the time each arrived (time.monotonic), and None after every `tick`
    seconds without a line (for `tail --group` to release what it holds back)."""
    lines_queue = _followed(workers, logs, lines)
    while True:
        try:
            name, line = lines_queue.get(timeout=tick)
        except queue.Empty:
            yield None
            continue
        yield time.monotonic(), name, line


def _followed(
    workers: Sequence[WorkerRecord], logs: Logs, lines: int
) -> queue.Queue[tuple[str, str]]:
    lines_queue: queue.Queue[tuple[str, str]] = queue.Queue()

    def pump(worker: WorkerRecord) -> None:
        try:
            for line in logs.follow_log(worker, lines):
                lines_queue.put((worker.name, line))
        except HostError as error:
            lines_queue.put((worker.name, f"[orchestrate] stopped following: {error.message}"))

    for worker in workers:
        threading.Thread(target=pump, args=(worker,), daemon=True).start()
    return lines_queue
