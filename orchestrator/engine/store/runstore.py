"""The controller's record of runs, kept in a state directory so any later shell finds them.

- `{state_dir}/current`: the id of the latest run
- `{state_dir}/runs/{run_id}.json`: the run: the inventory as it was at `up` (so a restart
  reproduces the same TF_CONFIG), the current attempt's workers, and every restart with its reason
- `{state_dir}/runs/{run_id}.lock`: held by the process supervising the run
- `{state_dir}/runs/{run_id}.log`: the detached supervisor's log (`up --detach`)
- `{state_dir}/start.lock`: held by an `up` from its check for an active run to its launch
- `{state_dir}/runs/{run_id}.stop`: left by `down`, so a supervisor starts no new attempt; it
  carries the stop request (id, grace) that a live supervisor carries out itself
- `{state_dir}/runs/{run_id}.stopped`: that supervisor's answer: taken, then each worker's end
- `{state_dir}/checkpoints/{run_id}/`: the mirror of a remote chief's latest checkpoint
- `{state_dir}/tensorboard/{job}/`: a remote chief's event files, pulled for TensorBoard
- `{state_dir}/tensorboard.log`: the output of the TensorBoard that `orchestrate tensorboard` runs

Only this module spells out the layout; every other module asks RunStore for a path.
Privacy: `runs/` is 0700 and every file this module writes is 0600 (a record holds the job's
environment); checkpoints/ and tensorboard/ keep the user's umask, to be shared if wanted.
- `{state_dir}/runs/{run_id}.status.json`: the supervisor's latest status, rewritten at each poll
  (the dashboard serves it instead of probing the hosts a second time)
- `{state_dir}/runs/{run_id}.stacks/attempt-{n}/{worker}.txt`: every worker's Python stacks,
  collected at the stall that ended attempt n (0700 directories, 0600 files)
- `{state_dir}/preflight.json`: the findings of the last preflight check
- `{state_dir}/runs/{run_id}.notified`: the run's events already sent to `notify:` targets
- `{state_dir}/tensorboard.json`: where `orchestrate tensorboard` serves, while it runs
- `{state_dir}/dashboard-token`: the token every dashboard of this directory asks for (0600)
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO

from orchestrator.backends.registry import host_settings, source_settings_of
from orchestrator.boundedread import RECORD_CAP, read_text
from orchestrator.errors import HostError, RecordDamaged, RunStateError
from orchestrator.model.records import RunRecord

THIS_MACHINE = "this machine"  # what errors about the state directory name as their host


@dataclass(frozen=True)
class StopRequest:
    """One `down`: its id (the answer names it, so an old answer is never taken for a new one)
    and the grace between SIGTERM and SIGKILL."""

    id: str
    grace: float


class RunStore:
    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir)

    def _run_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{run_id}.json"

    def lock_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{run_id}.lock"

    def log_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{run_id}.log"

    def start_lock_path(self) -> Path:
        """Held by the `up` that is starting a run here, from its active-run check to the launch."""
        return self.root / "start.lock"

    def stop_flag(self, run_id: str) -> Path:
        """`orchestrate down` leaves this so a supervisor between two attempts starts no new one."""
        return self.root / "runs" / f"{run_id}.stop"

    def request_stop(self, run_id: str, grace: float) -> StopRequest:
        """`down`: leave the stop flag, carrying what a live supervisor of the run needs to stop
        the workers itself, over the sessions it already holds (see Supervisor._stop_as_asked)."""
        request = StopRequest(f"{os.getpid()}-{time.time_ns()}", grace)
        self.write_file(self.stop_flag(run_id), json.dumps(asdict(request)))
        return request

    def withdraw_stop_request(self, run_id: str) -> None:
        """`down` stops the workers itself: the flag stays (no new attempt) but carries no
        request, so a supervisor that wakes up late does not stop them a second time."""
        self.write_file(self.stop_flag(run_id), "{}")

    def stop_request(self, run_id: str) -> StopRequest | None:
        """The pending `down` of the run; None with no flag, or one that carries nothing."""
        try:
            data = json.loads(read_text(self.stop_flag(run_id), RECORD_CAP))
            return StopRequest(str(data["id"]), float(data["grace"]))
        except (OSError, ValueError, TypeError, KeyError, RecursionError):
            return None

    def stop_answer_path(self, run_id: str) -> Path:
        """Where a supervisor answers a stop request: taken, then how each worker ended."""
        return self.root / "runs" / f"{run_id}.stopped"

    def mirror_path(self, run_id: str) -> Path:
        """Where a supervised run's latest remote checkpoint is mirrored."""
        return self.root / "checkpoints" / run_id

    def event_dir(self, job_name: str) -> Path:
        """Where a remote chief's TensorBoard event files are pulled to."""
        return self.root.resolve() / "tensorboard" / job_name

    def export_dir(self, job_name: str) -> Path:
        """Where `pull-export` puts a remote chief's exported model."""
        return self.root.resolve() / "export" / job_name

    def tensorboard_log(self) -> Path:
        return self.root / "tensorboard.log"

    def snapshot_path(self, run_id: str) -> Path:
        """The supervisor's latest status of the run, for the dashboard."""
        return self.root / "runs" / f"{run_id}.status.json"

    def stacks_dir(self, run_id: str) -> Path:
        """The stacks collected at the run's stalls, one directory per attempt that stalled."""
        return self.root / "runs" / f"{run_id}.stacks"

    def stacks_path(self, run_id: str, attempt: int, worker: str) -> Path:
        return self.stacks_dir(run_id) / f"attempt-{attempt}" / f"{worker}.txt"

    def write_private(self, path: Path, text: str) -> None:
        """A file under runs/, its directories private (0700) down from runs/."""
        runs = self.root / "runs"
        for directory in reversed([path.parent, *path.parent.parents]):
            if directory == runs or runs in directory.parents:
                private_dir(directory)
        _atomic_write(path, text)

    def dashboard_log_path(self, run_id: str) -> Path:
        return self.root / "runs" / f"{run_id}.dashboard.log"

    def notified_path(self, run_id: str) -> Path:
        """The run's events told to its notify targets, one key a line
        (engine/observe/notify.py)."""
        return self.root / "runs" / f"{run_id}.notified"

    def preflight_path(self) -> Path:
        return self.root / "preflight.json"

    def tensorboard_path(self) -> Path:
        return self.root / "tensorboard.json"

    def dashboard_token_path(self) -> Path:
        """The dashboards' token (0600), for scripts to send as a Bearer header."""
        return self.root / "dashboard-token"

    def write_file(self, path: Path, text: str) -> None:
        """Replace a file of the state directory atomically: readers see old or new, never half."""
        with writing_state(path):
            self._make_parent(path)
            _atomic_write(path, text)

    def _make_parent(self, path: Path) -> None:
        """The state directory checked (state_root) before anything is written in it; runs/
        private (private_dir); other folders (checkpoints/, tensorboard/) as the umask says."""
        state_root(self.root)
        runs = self.root / "runs"
        if path.parent == runs:
            private_dir(runs)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)

    def open_private(self, path: Path, append: bool = False) -> IO[bytes]:
        """A log of the state directory, for writing: created 0600."""
        self._make_parent(path)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        return open(os.open(path, flags, 0o600), "ab" if append else "wb")

    def run_ids(self) -> list[str]:
        """Every recorded run, oldest first (run ids start with their start time)."""
        return sorted(p.name.removesuffix(".json") for p in (self.root / "runs").glob("*.json")
                      if not p.name.endswith(".status.json"))  # fmt: skip

    def save(self, record: RunRecord) -> None:
        path = self._run_path(record.run_id)
        with writing_state(path):
            self._make_parent(path)
            _atomic_write(path, json.dumps(record.to_json(), indent=2))
            _atomic_write(self.root / "current", record.run_id + "\n")

    def load(self, run_id: str | None = None) -> RunRecord:
        """The named run, or the latest one."""
        run_id = run_id or self.current_id()
        if run_id is None:
            raise RunStateError(
                f"no run found in {self.root.resolve()}",
                hint="start one with 'orchestrate up INVENTORY', or point --state-dir "
                "(ORCHESTRATE_STATE_DIR) at the directory you started it from",
            )
        try:
            data = json.loads(read_text(self._run_path(run_id), RECORD_CAP))
        except FileNotFoundError as exc:
            raise RunStateError(
                f"no run '{run_id}' in {self.root.resolve()}",
                hint="'ls " + str(self.root / "runs") + "' lists the known runs",
            ) from exc
        except RecursionError as exc:  # json's parser recurses: '[' * 60000
            raise self._damaged(run_id, "JSON nested too deep for a run record") from exc
        except (OSError, ValueError, TypeError) as exc:
            raise self._damaged(run_id, str(exc)) from exc
        try:
            record = RunRecord.from_json(data, host_settings, source_settings_of)
        except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
            raise self._damaged(run_id, f"{type(exc).__name__} {str(exc)[:200]}") from exc
        return replace(record, stop_requested=self.stop_flag(run_id).exists())

    def _damaged(self, run_id: str, why: str) -> RecordDamaged:
        return RecordDamaged(
            run_id,
            f"the record of run '{run_id}' is unreadable: {why}",
            hint=f"{self._run_path(run_id)} is damaged; 'orchestrate down' still stops the run "
            "while its supervisor lives; otherwise stop its workers on their hosts",
        )

    def exists(self, run_id: str) -> bool:
        return self._run_path(run_id).exists()

    def current_id(self) -> str | None:
        try:
            return read_text(self.root / "current", RECORD_CAP).strip() or None
        except FileNotFoundError:
            return None


@contextmanager
def writing_state(path: Path) -> Iterator[None]:
    """Writes to the state directory: one that is full, read-only or not this account's to
    write is a HostError of this machine (exit 3) that names the file, never a traceback."""
    try:
        yield
    except OSError as exc:
        raise HostError(
            THIS_MACHINE,
            f"cannot write {Path(exc.filename or path).absolute()}: {exc.strerror or exc}",
            hint="free space there or make it writable, or use another state directory "
            "(--state-dir, ORCHESTRATE_STATE_DIR)",
        ) from exc


def state_root(path: Path) -> Path:
    """The state directory itself, private like runs/; a symbolic link to it is followed only
    when the link is this account's own (`ln -s /scratch/me/state .orchestrate`)."""
    return private_dir(path, own_link_ok=True)


def private_dir(path: Path, *, own_link_ok: bool = False) -> Path:
    """`path` as a directory only its owner can enter (0700), its parents as the umask says.

    Made, or found and checked on the opened directory itself (O_NOFOLLOW: what is checked is
    what is tightened): this account's, not a symbolic link, 0700 (tightened when looser).
    Anything else, such as a runs/ another user made in a shared directory to read or swap
    what a run writes, is refused before a file is written there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):
        path.mkdir(mode=0o700)
    if own_link_ok and path.is_symlink() and path.lstat().st_uid == os.getuid():
        path = path.resolve()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        link = path.is_symlink()
        raise _unsafe(path, "a symbolic link" if link else f"unusable ({exc.strerror})",
                      path.lstat().st_uid if link else None) from None  # fmt: skip
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise _unsafe(path, "another user's directory", info.st_uid)
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def _unsafe(path: Path, what: str, uid: int | None) -> HostError:
    owner = "" if uid is None else f", owned by {owner_name(uid)}"
    return HostError(
        THIS_MACHINE,
        f"refusing {path.absolute()}: it is {what}{owner}, not a private directory of this account "
        f"({owner_name(os.getuid())}); nothing was written there",
        hint="remove it (or have its owner remove it), or use a state directory only you can "
        "write to (--state-dir, ORCHESTRATE_STATE_DIR)",
    )


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def atomic_write(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace `path` whole: readers see the old or the new text, never half. The temporary
    file has an unpredictable name and is created O_EXCL|O_NOFOLLOW (mkstemp) beside it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode != 0o600:
            os.fchmod(fd, mode)
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


_atomic_write = atomic_write


def current_umask() -> int:
    """This process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
