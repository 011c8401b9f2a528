"""`tail`'s grouping of the same text printed by several workers: `[worker-0,1,2] Epoch 3/10`
once instead of three times (epoch banners, TensorFlow's warnings). Pure.

Lines that differ keep their own worker and order: every worker's lines come out in the order
it printed them, and a line joins an earlier group only when that keeps it so. Followed logs
(`Grouper`) group the same text that arrives within a window (1 s) of its first copy, holding
a line back at most that long; the last lines of finished logs (`merge`) have no times and
group the lines the logs share in order (a diff's common subsequence).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field

WINDOW = 1.0  # seconds within which the same text from several workers is one line


@dataclass(frozen=True)
class Line:
    workers: tuple[str, ...]  # who printed it, in the order of the run's workers
    text: str


def label(names: Sequence[str]) -> str:
    """The workers of a group in one prefix: `worker-0,1,2` where the names differ only in a
    trailing number, else every name (`alpha,beta`)."""
    common = _common_start(names).rstrip("0123456789")
    rests = [name[len(common) :] for name in names]
    if len(names) > 1 and common and all(rest.isdigit() for rest in rests):
        return common + ",".join(rests)
    return ",".join(names)


@dataclass
class _Group:
    text: str
    first_at: float
    members: list[str] = field(default_factory=list)


class Grouper:
    """Followed lines in, grouped lines out, in order. `add` a line as it arrives (with the
    time it arrived); what it returns is ready to print. `flush(now)` releases what waited out
    its window (call it when no line arrived for a while); `flush()` releases everything."""

    def __init__(self, workers: Sequence[str], window: float = WINDOW) -> None:
        self.workers = tuple(workers)
        self.window = window
        self._pending: list[_Group] = []

    def add(self, worker: str, text: str, at: float) -> list[Line]:
        joined = None
        for group in reversed(self._pending):
            if worker in group.members:
                break  # joining an earlier group would print this worker's lines out of order
            if group.text == text and at - group.first_at <= self.window:
                joined = group
        if joined is None:
            self._pending.append(_Group(text, at, [worker]))
        else:
            joined.members.append(worker)
        return self.flush(at)

    def flush(self, now: float | None = None) -> list[Line]:
        ready = []
        while self._pending:
            head = self._pending[0]
            complete = len(head.members) >= len(self.workers)
            if not (now is None or complete or now - head.first_at > self.window):
                break  # later lines wait behind it: the order stays
            ready.append(self._line(self._pending.pop(0)))
        return ready

    def _line(self, group: _Group) -> Line:
        return Line(_ordered(group.members, self.workers), group.text)


def merge(logs: Sequence[tuple[str, Sequence[str]]]) -> list[Line]:
    """The last lines of several logs (worker, lines) as one list: the lines they share in the
    same order once, with every worker that printed them; the others where they fall."""
    order = [name for name, _ in logs]
    merged: list[_Group] = []
    for name, lines in logs:
        matcher = difflib.SequenceMatcher(None, [g.text for g in merged], list(lines),
                                          autojunk=False)  # fmt: skip
        result: list[_Group] = []
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for group in merged[i1:i2]:
                    group.members.append(name)
            result.extend(merged[i1:i2])
            if tag != "equal":
                result.extend(_Group(text, 0.0, [name]) for text in lines[j1:j2])
        merged = result
    return [Line(_ordered(g.members, order), g.text) for g in merged]


def _common_start(names: Sequence[str]) -> str:
    shortest = min(names, key=len, default="")
    for index, char in enumerate(shortest):
        if any(name[index] != char for name in names):
            return shortest[:index]
    return shortest


def _ordered(members: Sequence[str], workers: Sequence[str]) -> tuple[str, ...]:
    rank = {name: index for index, name in enumerate(workers)}
    return tuple(sorted(members, key=lambda name: rank.get(name, len(rank))))
