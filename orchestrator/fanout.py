"""Run one function per item in parallel, with a bounded pool; collect every result and error."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from orchestrator.errors import HostError, HostErrors

K = TypeVar("K", bound=Hashable)
M = TypeVar("M", bound=Hashable)
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - an item

# Calls wait on the network and on the hosts, not on this machine: one thread per host up to
# here. With 32, a 64-host round ran in two waves, each as long as the slowest host of its wave.
MAX_PARALLEL = 256


@dataclass(frozen=True)
class GroupResult(Generic[K, T]):
    """Every key's answer or error: one dead host never hides the others' results."""

    ok: Mapping[K, T] = field(default_factory=dict)
    failed: Mapping[K, HostError] = field(default_factory=dict)

    def raise_if_failed(self, action: str) -> Mapping[K, T]:
        """The answers, or HostErrors naming every host that failed (partial results inside)."""
        if self.failed:
            raise HostErrors(list(self.failed.values()), action, partial=dict(self.ok))
        return self.ok


def fan_out(keys: Iterable[K], action: Callable[[K], T]) -> GroupResult[K, T]:
    """Call `action` for every key at once; a HostError lands in `failed`, not raised."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return GroupResult()

    def guarded(key: K) -> T | HostError:
        try:
            return action(key)
        except HostError as error:
            return error

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(keys))) as pool:
        answers = dict(zip(keys, pool.map(guarded, keys), strict=True))
    return GroupResult(
        ok={k: a for k, a in answers.items() if not isinstance(a, HostError)},
        failed={k: a for k, a in answers.items() if isinstance(a, HostError)},
    )


def per_machine(
    items: Sequence[I],
    key: Callable[[I], K],
    machine: Callable[[I], M],
    action: Callable[[list[I]], Mapping[K, T]],
) -> GroupResult[K, T]:
    """One call per machine for all of its items (one round trip), mapped back to each item's
    key. An item its machine's answer leaves out is a failure too, not a silent gap."""
    groups: dict[M, list[I]] = {}
    for item in items:
        groups.setdefault(machine(item), []).append(item)
    answers = fan_out(groups, lambda m: action(groups[m]))
    ok: dict[K, T] = {}
    failed: dict[K, HostError] = {}
    for m, members in groups.items():
        for item in members:
            if m in answers.failed:
                failed[key(item)] = answers.failed[m]
            elif key(item) in answers.ok[m]:
                ok[key(item)] = answers.ok[m][key(item)]
            else:
                failed[key(item)] = HostError(str(key(item)), "its host's answer left it out")
    return GroupResult(ok, failed)
