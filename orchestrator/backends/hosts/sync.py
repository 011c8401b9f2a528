"""`sync:`: mirror a local directory into every host's job directory before each start.

rsync over OpenSSH does the work: delta transfer (only changed files, and only their changed
blocks), deletions, an exclude list. The remote shell is the host's own SSH settings translated
by its connection kind (`Kind.sync_transport`), so host keys are checked the same way as
everywhere else. Hosts that share this machine's files (the local kind) need no copy.

The mirror lands in `{workdir}/{job}/code/`, not in the job directory itself: `--delete` there
would remove the checkpoints and run directories that live beside it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.errors import HostError, MissingTool
from orchestrator.fanout import GroupResult, fan_out
from orchestrator.machines.kinds import kind_of
from orchestrator.model.inventory import SyncSpec
from orchestrator.model.workers import sync_dir

if TYPE_CHECKING:
    from orchestrator.model.inventory import WorkerSlot

SYNC_TIMEOUT = 1800.0


@dataclass(frozen=True)
class SyncStats:
    """What rsync's --stats said for one host."""

    files: int = 0  # regular files transferred
    deleted: int = 0
    file_bytes: int = 0  # total size of the transferred files
    sent_bytes: int = 0  # bytes on the wire, protocol included
    seconds: float = 0.0


@dataclass(frozen=True)
class SyncReport:
    result: GroupResult[str, SyncStats] = field(default_factory=GroupResult)

    def summary(self) -> str:
        ok = self.result.ok
        if not ok:
            return ""
        files = max(s.files for s in ok.values())
        deleted = max(s.deleted for s in ok.values())
        sent = sum(s.sent_bytes for s in ok.values())
        slowest = max(s.seconds for s in ok.values())
        changed = f"{files} file(s) changed" + (f", {deleted} deleted" if deleted else "")
        return (f"{changed}, {_size(sent)} sent to {len(ok)} host(s) "
                f"in {slowest:.1f} s")  # fmt: skip


def rsync_argv(spec: SyncSpec, shell: Sequence[str], target: str, destination: str) -> list[str]:
    """The rsync command line for one host. Pure."""
    return [
        "rsync",
        "--recursive", "--links", "--perms", "--times",  # -a without owner, group, devices
        "--delete",  # excluded files on the host stay (data kept there on purpose)
        "--stats", "--no-human-readable",
        *[f"--exclude={pattern}" for pattern in spec.excludes],
        "-e", shlex.join(shell),
        # The remote rsync creates the directory first (any rsync version, unlike --mkpath).
        f"--rsync-path=mkdir -p {shlex.quote(destination)} && rsync",
        spec.source.rstrip("/") + "/",
        f"{target}:{destination.rstrip('/')}/",
    ]  # fmt: skip


_STATS = {
    "files": re.compile(r"^Number of regular files transferred: ([\d,]+)", re.M),
    "deleted": re.compile(r"^Number of deleted files: ([\d,]+)", re.M),
    "file_bytes": re.compile(r"^Total transferred file size: ([\d,]+)", re.M),
    "sent_bytes": re.compile(r"^Total bytes sent: ([\d,]+)", re.M),
}


def parse_stats(output: str, seconds: float = 0.0) -> SyncStats:
    """rsync's --stats block; a line it does not print (old versions) counts as 0. Pure."""
    values = {}
    for key, pattern in _STATS.items():
        found = pattern.search(output)
        values[key] = int(found.group(1).replace(",", "")) if found else 0
    return SyncStats(**values, seconds=seconds)


def sync_hosts(spec: SyncSpec, hosts: Sequence[WorkerSlot], job_dirs: dict[str, str]) -> SyncReport:
    """Mirror the directory to every host that needs a copy, in parallel (one per machine and
    job directory); each host's failure is its own."""
    targets: dict[tuple[str, str], WorkerSlot] = {}
    for host in hosts:
        transport = kind_of(host).sync_transport(host)
        if transport is not None and not kind_of(host).shares_files_with_controller:
            targets.setdefault((transport.target, sync_dir(job_dirs[host.name])), host)
    if not targets:
        return SyncReport()
    if shutil.which("rsync") is None:
        raise MissingTool(
            "sync: needs rsync on this machine (and on every host)",
            hint="install it, e.g. 'apt-get install rsync', or remove 'sync:' from the inventory",
        )
    by_name = {host.name: host for host in targets.values()}
    return SyncReport(fan_out(by_name, lambda name: _sync_one(spec, by_name[name], job_dirs)))


def _sync_one(spec: SyncSpec, host: WorkerSlot, job_dirs: dict[str, str]) -> SyncStats:
    transport = kind_of(host).sync_transport(host)
    assert transport is not None
    argv = rsync_argv(spec, transport.shell, transport.target, sync_dir(job_dirs[host.name]))
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SYNC_TIMEOUT,
                              stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise HostError(host.name, f"sync did not finish within {SYNC_TIMEOUT:.0f} s") from exc
    if done.returncode != 0:
        said = "\n".join(done.stderr.strip().splitlines()[-4:])
        hint = "is rsync installed on the host?" if done.returncode in (12, 127) else None
        raise HostError(
            host.name, f"sync of {spec.source} failed (rsync exit {done.returncode}): {said}", hint
        )
    return parse_stats(done.stdout, time.monotonic() - started)


def _size(count: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
