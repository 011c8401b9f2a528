"""Run one function per item in parallel, with a bounded pool; collect every result and error."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from orchestrator.errors import HostError, HostErrors

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

MAX_PARALLEL = 32


def fan_out(keys: Iterable[K], action: Callable[[K], T]) -> dict[K, T | HostError]:
    """Call `action` for every key at once; a HostError is returned in its key's slot, not raised,
    so one dead host never hides the others' results."""
    keys = list(keys)
    if not keys:
        return {}

    def guarded(key: K) -> T | HostError:
        try:
            return action(key)
        except HostError as error:
            return error

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(keys))) as pool:
        return dict(zip(keys, pool.map(guarded, keys), strict=True))


def successes(results: dict[K, T | HostError], action: str) -> dict[K, T]:
    """The results, or HostErrors naming every host that failed."""
    errors = [r for r in results.values() if isinstance(r, HostError)]
    if errors:
        raise HostErrors(errors, action)
    return {k: r for k, r in results.items() if not isinstance(r, HostError)}
