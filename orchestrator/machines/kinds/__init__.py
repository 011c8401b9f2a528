"""The registry of connection kinds. A new kind is its own module and one line here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import InventoryError
from orchestrator.machines.kinds.base import Kind
from orchestrator.machines.kinds.local import LocalKind
from orchestrator.machines.kinds.ssh import SshKind

if TYPE_CHECKING:
    from orchestrator.model.inventory import WorkerSlot

_KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> None:
    """Make `connection: <kind.name>` known to the inventory and every command."""
    _KINDS[kind.name] = kind


def unregister(name: str) -> None:
    _KINDS.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_KINDS)


def get(name: str) -> Kind:
    try:
        return _KINDS[name]
    except KeyError:
        raise InventoryError(
            [], hint=f"connection {name!r} is not known; known: {', '.join(_KINDS)}"
        ) from None


def kind_of(host: WorkerSlot) -> Kind:
    return get(host.connection)


def all_keys() -> dict[str, object]:
    """Every kind's own host keys (a key of one kind may sit in `defaults:` beside another)."""
    keys: dict[str, object] = {}
    for kind in _KINDS.values():
        keys.update(kind.keys)
    return keys


register(LocalKind())
register(SshKind())

__all__ = [
    "Kind", "get", "kind_of", "names", "register", "unregister",
]  # fmt: skip
