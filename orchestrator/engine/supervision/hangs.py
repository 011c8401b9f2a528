"""Stacks from every worker of a run: at a stall, before the restart (kept, and summarised into
the root cause), and at any time for `orchestrate stacks`. The summary is stacks.py's (pure);
this module asks the backend and keeps the files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.backends.base import Lifecycle
from orchestrator.engine.observe.failures import Failure
from orchestrator.engine.observe.stacks import Summary, last_dump, summarise
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import OrchestrateError
from orchestrator.model.records import RunRecord, WorkerRecord

STALL_STACKS_WAIT = 5.0  # seconds the stacks of a stalled attempt may take, all workers together


@dataclass(frozen=True)
class Stacks:
    """Every asked worker's stacks (its last dump), or why it could not answer."""

    texts: dict[str, str]
    silent: dict[str, str]
    native: dict[str, str]  # py-spy's dump, or why there is none (only when asked for)

    def summary(self) -> Summary:
        return summarise(self.texts, self.silent)


def collect(
    lifecycle: Lifecycle, workers: Sequence[WorkerRecord], wait: float, native: bool = False
) -> Stacks:
    texts: dict[str, str] = {}
    silent: dict[str, str] = {}
    natives: dict[str, str] = {}
    try:
        answers = lifecycle.stacks(workers, wait, native)
    except OrchestrateError as error:
        return Stacks({}, {w.name: error.message for w in workers}, {})
    for worker in workers:
        answer = answers.ok.get(worker.name)
        if answer is None:
            failed = answers.failed.get(worker.name)
            silent[worker.name] = failed.message if failed else "its host did not answer"
            continue
        if answer.stacks:
            texts[worker.name] = last_dump(answer.stacks)
        else:
            silent[worker.name] = answer.error or "it did not answer"
        if answer.native is not None:
            natives[worker.name] = answer.native
    return Stacks(texts, silent, natives)


def keep(store: RunStore, record: RunRecord, stacks: Stacks) -> list[Path]:
    """runs/{run_id}.stacks/attempt-{n}/{worker}.txt for every worker asked (0600): its stacks,
    or a line saying why there are none."""
    paths = []
    for name in [*stacks.texts, *stacks.silent]:
        path = store.stacks_path(record.run_id, record.attempt, name)
        text = stacks.texts.get(name) or f"# no stacks: {stacks.silent.get(name)}\n"
        store.write_private(path, text)
        paths.append(path)
    return paths


def at_stall(
    store: RunStore, record: RunRecord, lifecycle: Lifecycle, failure: Failure
) -> tuple[Failure, Path | None]:
    """A stalled attempt's stacks, kept, and the failure restated with them: which worker the
    others wait for becomes the failed worker (the watch names the first one it saw stall)."""
    stacks = collect(lifecycle, record.workers, STALL_STACKS_WAIT)
    try:
        paths = keep(store, record, stacks)
    except OSError:
        paths = []
    summary = stacks.summary()
    reason = f"{failure.reason}; {summary.describe()}"
    where = paths[0].parent if paths else None
    return replace(failure, worker=summary.blamed or failure.worker, reason=reason), where


def kept(store: RunStore, run_id: str) -> dict[int, dict[str, Path]]:
    """The stacks kept at the run's stalls: by attempt, by worker, the file."""
    found: dict[int, dict[str, Path]] = {}
    root = store.stacks_dir(run_id)
    if not root.is_dir():
        return found
    for attempt in sorted(root.glob("attempt-*")):
        number = attempt.name.removeprefix("attempt-")
        if number.isdigit() and attempt.is_dir():
            found[int(number)] = {p.stem: p for p in sorted(attempt.glob("*.txt"))}
    return found
