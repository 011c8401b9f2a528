"""Files a run writes where other accounts may be (issue 25): directories only this account can
enter, checked on the opened directory itself, and files created 0600 or replaced atomically
through a temporary file nobody could have planted.

STANDARD LIBRARY ONLY, and Python 3.7 or newer (a Slurm node's python3 may be old). Shipped, not
installed: hostside/bundle.py carries this file's source in front of the programs that import it
(the host agent, the lease program and the Slurm launcher, all in hostside/).
"""

import contextlib
import json
import os


class UnsafeDirectory(RuntimeError):
    """A private directory that is another account's, a symbolic link or no directory."""


def owner_name(uid):
    """'alice (uid 1001)', or 'uid 1001' where the account has no name here."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def private_dir(path):
    """`path` made, or found, as a directory of this account that only it can enter (0700,
    tightened when looser); anything else is refused (UnsafeDirectory) before a file is written
    into it: another user's directory (pre-created in a shared workdir, it could hold their
    spec.json and agent.py), a symbolic link, or not a directory. Checked on the opened
    directory itself (O_NOFOLLOW), so what is checked is what is tightened. Another process of
    the run may make it first: they start together."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeDirectory(
                f"refusing {path}: it is a symbolic link (to {os.readlink(path)}), not a "
                f"private directory; owner {owner_name(os.lstat(path).st_uid)}; remove it"
            ) from None
        raise UnsafeDirectory(f"refusing {path}: not a usable directory ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise UnsafeDirectory(
                f"refusing {path}: it belongs to {owner_name(info.st_uid)}, not to this account "
                f"({owner_name(os.getuid())}); another user made it, so nothing of the run is "
                "written there: remove it, or choose a workdir only you can write to"
            )
        if info.st_mode & 0o777 != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def make_private_dirs(directories):
    """Each directory private (private_dir), its parent made first with the user's umask (the
    job directory holds the shareable checkpoints)."""
    for path in directories:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        private_dir(path)


def private_open(path, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    """A text file opened for writing, 0600 from its creation on: never a moment in which
    another account could open it."""
    return open(os.open(path, flags, 0o600), "w", encoding="utf-8")


def write_text(path, text):
    with private_open(path) as handle:
        handle.write(text)


def temp_beside(path, mode=0o600):
    """A new temporary file in `path`'s directory, for an atomic replace of `path`: an
    unpredictable name, created O_EXCL|O_NOFOLLOW (mkstemp), so no file or link planted there
    is opened. Returns (fd, name)."""
    import tempfile

    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{name}.tmp.", dir=directory or ".")
    if mode != 0o600:
        os.fchmod(fd, mode)
    return fd, tmp


def write_json(path, data, mode=0o600):
    """Atomic: a reader never sees half a file, even if this process is killed mid-write."""
    fd, tmp = temp_beside(path, mode)
    with open(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)
