"""Small pure helpers about addresses and paths on this machine."""

from __future__ import annotations

import ipaddress
from pathlib import Path


def controller_path(value: str, base: Path) -> Path:
    """Paths on this machine are relative to the inventory file, like docker-compose's."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
