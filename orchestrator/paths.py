"""Small pure helpers about addresses and paths on this machine."""

from __future__ import annotations

import ipaddress
from pathlib import Path, PurePosixPath

# The controller's state directory, relative to where a command runs (--state-dir).
DEFAULT_STATE_DIR = ".orchestrate"


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


def inside(root: Path, relative: str) -> Path | None:
    """`root / relative` when `relative`, a name a host answered with, is a relative path that
    stays under `root` (no `..`, not absolute, no `~`, no control character, and no symbolic
    link already under `root` leading out); None for any other name."""
    pure = PurePosixPath(relative)
    if (not relative or pure.is_absolute() or relative.startswith("~") or ".." in pure.parts
            or any(ord(c) < 32 or ord(c) == 127 for c in relative)):  # fmt: skip
        return None
    candidate = root / pure
    base = root.resolve()
    return candidate if candidate.resolve().is_relative_to(base) and candidate != root else None


def plain_name(name: str) -> bool:
    """Whether `name` is one file or checkpoint name (`ckpt-100`), never a path: no `/`, not
    `.` or `..`, no control character."""
    return (
        bool(name)
        and "/" not in name
        and name not in (".", "..")
        and not any(ord(c) < 32 or ord(c) == 127 for c in name)
    )
