"""The one way the controller reads a file it is handed (an inventory, an Ansible inventory, a
run record): a regular file under a size cap, read with a bound.

A path is untrusted input. A device (/dev/zero, or a link to it) would be read until memory ran
out; a fifo would block the open forever; a file that grows while it is read would be read as
long as it grows. So the file is opened without blocking and without becoming a controlling
terminal, its kind and size are read from the open descriptor (no race with a rename), and at
most `cap` + 1 bytes are read. Any refusal is a FileRefused, an OSError: every reader's handling
of an unreadable file reports it, with a message that names the path, what it is and the cap.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from orchestrator.errors import FileRefused

MIB = 1024 * 1024
CHUNK = 1 << 16
# The caps, one per kind of file (docs/troubleshooting.md names them).
INVENTORY_CAP = 256 * 1024  # about 5,000 hosts (10 s to load here); a thousand is 50 KiB
ANSIBLE_FILE_CAP = 4 * MIB  # each file of an Ansible inventory, its group_vars and host_vars
ANSIBLE_FILES_CAP = 1000  # files in an Ansible inventory directory, group_vars and host_vars
RECORD_CAP = 64 * MIB  # a run record, its stop request, its pointer files
SSH_FILE_CAP = 4 * MIB  # an ssh_key, ssh_known_hosts or ssh_config file the inventory names

KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a fifo (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def size_text(count: int) -> str:
    """A byte count as people read it: 512 bytes, 3.2 KiB, 14.0 MiB."""
    if count < 1024:
        return f"{count} bytes"
    if count < MIB:
        return f"{count / 1024:.1f} KiB"
    return f"{count / MIB:.1f} MiB"


def kind_of(mode: int) -> str:
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def check_regular(path: str | Path, cap: int) -> int:
    """The size of the regular file at `path` (links followed), or FileRefused: a device, a
    fifo, a socket or a directory, or a file over `cap` bytes. Nothing is opened."""
    info = os.stat(path)
    return _checked(path, info, cap)


def _checked(path: str | Path, info: os.stat_result, cap: int) -> int:
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(errno.EINVAL, f"{kind_of(info.st_mode)}, not a regular file", str(path))
    if info.st_size > cap:
        raise FileRefused(
            errno.EFBIG,
            f"{size_text(info.st_size)}, over the limit of {size_text(cap)} for such a file",
            str(path),
        )
    return info.st_size


def read_bytes(path: str | Path, cap: int) -> bytes:
    """The whole of a regular file of at most `cap` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _checked(path, os.fstat(fd), cap)
        chunks: list[bytes] = []
        read = 0
        while read <= cap and (chunk := os.read(fd, min(CHUNK, cap + 1 - read))):
            chunks.append(chunk)
            read += len(chunk)
    finally:
        os.close(fd)
    if read > cap:  # it grew while it was read
        raise FileRefused(errno.EFBIG, f"over the limit of {size_text(cap)} for such a file",
                          str(path))  # fmt: skip
    return b"".join(chunks)


def read_text(path: str | Path, cap: int) -> str:
    """A regular file of at most `cap` bytes as UTF-8 text (UnicodeDecodeError if it is not)."""
    return read_bytes(path, cap).decode("utf-8")


def check_tree(path: str | Path, file_cap: int, count_cap: int) -> None:
    """A file or a directory that another reader (Ansible) will read: the file, or every file
    under the directory, a regular file under `file_cap` bytes, at most `count_cap` of them.
    FileRefused names the first that is not. (Checked before that reader opens them: it reads
    what it finds, a fifo or a device too.)"""
    pending, seen = [Path(path)], 0
    while pending:
        current = pending.pop()
        if not current.is_dir():
            check_regular(current, file_cap)
            continue
        for entry in sorted(current.iterdir()):
            seen += 1
            if seen > count_cap:
                raise FileRefused(errno.EFBIG, f"more than {count_cap} files", str(path))
            if entry.is_dir() and not entry.is_symlink():
                pending.append(entry)
            elif not entry.is_dir():
                check_regular(entry, file_cap)
