"""Secrets and shared machines, on namespace hosts with real sshd (tests/cluster).

The hosts' workdirs sit under a world-traversable directory, as a home or /data directory
would on a lab machine, and a second, unprivileged Unix user exists on the hosts: it must not
read a run's files, and its processes must never be taken for, or stopped as, the run's.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.inventories import host_entries
from tests.cluster.inventories import write_inventory as cluster_inventory
from tests.cluster.netns import NamespaceCluster
from tests.cluster.pytest_support import SharedCluster
from tests.conftest import Cli, clean_env, wait_for

pytestmark = pytest.mark.netns

SECRET_NAME = "TRACKER_API_KEY"
LIVE = ("starting", "running")  # the script writes its progress only at the end
# A failing first attempt makes the supervisor restart the cluster: the restart must find the
# secret again, in the detached supervisor's memory.
SCRIPT = """\
import hashlib, json, os, sys, time
secret = os.environ.get("TRACKER_API_KEY", "")
print("secret sha256", hashlib.sha256(secret.encode()).hexdigest(), flush=True)
print("plain", os.environ.get("PLAIN_SETTING"), flush=True)
time.sleep(float(os.environ.get("HOLD", "1.5")))
with open(os.environ["ORCHESTRATE_PROGRESS_FILE"], "w") as f:
    json.dump({"step": 1, "target_steps": 1}, f)
if os.environ.get("FAIL_FIRST") and "/attempt-0/" in os.environ["ORCHESTRATE_RUN_DIR"]:
    sys.exit(1)
"""


@pytest.fixture(scope="module")
def shared_root() -> Iterator[Path]:
    """A world-traversable parent of the workdirs (not pytest's 0700 temporary directory)."""
    root = Path(tempfile.mkdtemp(prefix="orch-shared-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(namespace_hosts: SharedCluster) -> NamespaceCluster:
    return namespace_hosts.hosts(2)


@pytest.fixture(scope="module")
def peer() -> Iterator[str]:
    """A second, unprivileged account on the hosts (they share this machine's users)."""
    name = f"orchpeer{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=True)  # each test ends its own processes


def as_peer(cluster: NamespaceCluster, peer: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return cluster.exec_in(cluster.hosts[0], ["runuser", "-u", peer, "--", *argv],
                           capture_output=True, text=True, timeout=30)  # fmt: skip


def inventory(cli: Cli, cluster: NamespaceCluster, shared_root: Path, **job: Any) -> Path:
    (cli.cwd / "train.py").write_text(SCRIPT)
    hosts = host_entries(
        cluster, **{h.name: {"workdir": str(shared_root / cli.cwd.name / h.name)}
                    for h in cluster.hosts}
    )  # fmt: skip
    settings = {"name": "demo", "script": "train.py", "restart_backoff": 0, **job}
    return cluster_inventory(cli.cwd / "inv.yaml", cluster, settings, hosts=hosts)


def orchestrate(cli: Cli, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI with extra variables in its environment (the secret, when the user exported it)."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cli.cwd,
                          env=clean_env(**env), capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


class CmdlineSampler(threading.Thread):
    """Reads every process's command line on the machine (the hosts share its pid space), as
    any user could with `ps`, until stopped; keeps every distinct one."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[bytes] = set()
        self.rounds = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        with open(f"/proc/{entry}/cmdline", "rb") as handle:
                            self.seen.add(handle.read())
                    except OSError:
                        continue
            self.rounds += 1
            time.sleep(0.001)

    def stop(self) -> set[bytes]:
        self._done.set()
        self.join(10)
        return self.seen


def files_containing(roots: list[Path], needle: bytes) -> list[Path]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(path)
    return found


def test_a_secret_reaches_the_workers_through_a_restart_and_is_written_nowhere(
    cli: Cli, cluster: NamespaceCluster, shared_root: Path
) -> None:
    secret = f"sk-{secrets.token_hex(12)}"
    plain = f"plain-{secrets.token_hex(6)}"
    token = f"tok-{secrets.token_hex(6)}"
    env = {"PLAIN_SETTING": plain, "SERVICE_TOKEN": token, "FAIL_FIRST": "1"}
    inventory(cli, cluster, shared_root, env=env, secret_env=[SECRET_NAME], max_restarts=1)

    missing = orchestrate(cli, "up", "--skip-checks", "inv.yaml")
    assert missing.returncode == 2, missing.stderr
    assert f"job.secret_env: {SECRET_NAME} is not set" in missing.stderr
    assert not (cli.cwd / ".orchestrate" / "runs").exists()
    assert not (shared_root / cli.cwd.name).exists()  # nothing started on any host

    sampler = CmdlineSampler()
    sampler.start()
    try:
        up = orchestrate(cli, "up", "--detach", "--skip-checks", "inv.yaml",
                         **{SECRET_NAME: secret})  # fmt: skip
        assert up.returncode == 0, up.stderr
        # Until the detached supervisor is done: succeeded, or an outcome in the record.
        final = cli.status_when(lambda s: s["state"] == "succeeded" or cli.record().get("outcome"),
                                timeout=60)  # fmt: skip
    finally:
        seen = sampler.stop()
    assert final["state"] == "succeeded", final
    record = cli.record()
    assert record["attempt"] == 1 and len(record["restarts"]) == 1  # the detached restart

    # The worker of the restarted attempt had the value, on both hosts.
    logs = cli("tail", "-n", "50", check=True).stdout
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert logs.count(f"secret sha256 {digest}") == 2 and logs.count(f"plain {plain}") == 2

    # No command line of any process during the launch held a job value...
    assert sampler.rounds > 10
    joined = b"\n".join(seen)
    for value in (secret, plain, token):
        assert value.encode() not in joined
    run_dirs = [w["run_dir"] for w in record["workers"]]
    assert any(b"supervise" in c and run_dirs[0].encode() in c for c in seen)  # it did look

    # ...no file here or on the hosts holds the secret, and nothing printed shows it.
    roots = [cli.cwd, shared_root / cli.cwd.name]
    assert files_containing(roots, secret.encode()) == []
    assert files_containing(roots, plain.encode())  # the search does find what is written
    status = cli("status", "--json", check=True).stdout
    for text in (up.stdout, up.stderr, status, logs):
        assert secret not in text
    assert f"{SECRET_NAME}=[redacted]" in up.stderr and "SERVICE_TOKEN=[redacted]" in up.stderr
    assert f"PLAIN_SETTING={plain}" in up.stderr and token not in up.stderr


def test_attach_cannot_take_over_a_run_without_its_secrets(
    cli: Cli, cluster: NamespaceCluster, shared_root: Path
) -> None:
    inventory(cli, cluster, shared_root, env={"HOLD": "120"}, secret_env=[SECRET_NAME])
    up = orchestrate(cli, "up", "-d", "--skip-checks", "inv.yaml", **{SECRET_NAME: "s3cret-v"})
    assert up.returncode == 0, up.stderr
    try:
        cli.status_when(lambda s: s["state"] in LIVE, timeout=30)
        state = cli.cwd / ".orchestrate" / "runs"
        supervisor = int(next(state.glob("*.lock")).read_text())
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{supervisor}").exists()
                 or "Z" in Path(f"/proc/{supervisor}/stat").read_text().split()[2],
                 timeout=10)  # fmt: skip
        attach = orchestrate(cli, "attach")
        assert attach.returncode == 2, attach.stderr
        assert f"job.secret_env: {SECRET_NAME} is not set" in attach.stderr
        assert "taking over the supervision" in attach.stderr
        assert cli.status()["state"] in LIVE  # the workers were left alone
    finally:
        cli("down", "--grace", "2")


def test_run_files_are_private_from_another_user(
    cli: Cli, cluster: NamespaceCluster, shared_root: Path, peer: str
) -> None:
    inventory(cli, cluster, shared_root, env={"HOLD": "0"})
    cli("up", "--skip-checks", "inv.yaml", check=True)
    record = cli.record()
    run_dir = Path(record["workers"][0]["run_dir"])
    job_dir = run_dir.parents[3]
    # The path is traversable for the peer: it sees the job directory (checkpoints keep the
    # user's umask)...
    listing = as_peer(cluster, peer, "ls", str(job_dir))
    assert listing.returncode == 0 and "runs" in listing.stdout, listing.stderr
    # ...but nothing of the run.
    for target in (run_dir / "spec.json", run_dir / "worker.log", run_dir / "tf_config.json"):
        read = as_peer(cluster, peer, "cat", str(target))
        assert read.returncode != 0 and "Permission denied" in read.stderr, read.stdout
    for directory in (run_dir, *run_dir.parents[:3]):  # down to {job}/runs
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    # What orchestrate writes; the job's own files (its progress, the uploaded script) keep
    # their modes inside the 0700 directory.
    for name in ("spec.json", "tf_config.json", "agent.py", "pid", "worker.pid", "worker.log",
                 "exit.json"):  # fmt: skip
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
    state = cli.cwd / ".orchestrate"
    assert stat.S_IMODE((state / "runs").stat().st_mode) == 0o700
    for path in [*(state / "runs").iterdir(), state / "current"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_another_users_process_is_neither_seen_nor_stopped(
    cli: Cli, cluster: NamespaceCluster, shared_root: Path, peer: str
) -> None:
    inventory(cli, cluster, shared_root, env={"HOLD": "120"})
    cli("up", "-d", "--skip-checks", "inv.yaml", check=True)
    cli.status_when(lambda s: s["state"] in LIVE, timeout=30)
    state = cli.cwd / ".orchestrate" / "runs"
    os.kill(int(next(state.glob("*.lock")).read_text()), signal.SIGKILL)  # no restarts
    run_dir = Path(cli.record()["workers"][0]["run_dir"])
    os.killpg(int((run_dir / "pid").read_text()), signal.SIGKILL)  # host1's worker is gone
    # The peer's own process, whose command line even names the run directory, now holds the
    # pid the run's record points at (pid reuse, staged).
    other = cluster.popen_in(
        cluster.hosts[0],
        ["runuser", "-u", peer, "--", "setsid", "/usr/bin/python3", "-c",
         "import time; time.sleep(60)", "supervise", str(run_dir)],
    )  # fmt: skip
    holder = None
    try:
        holder = wait_for(lambda: _child_of(other.pid, peer), timeout=10)
        (run_dir / "pid").write_text(str(holder))
        first = cli.status()["workers"][0]
        assert first["state"] not in LIVE, first  # not taken for the run's supervisor
        down = cli("down", "--grace", "2")
        assert "host1: not running" in down.stdout, down.stdout + down.stderr
        assert other.poll() is None and Path(f"/proc/{holder}").exists()  # not stopped
    finally:
        if holder is not None:
            os.kill(holder, signal.SIGKILL)
        other.kill()
        other.wait()


def _child_of(pid: int, user: str) -> int | None:
    """The process runuser started for `user` (the peer's python), by its parent's pid."""
    import psutil

    for process in psutil.Process(pid).children(recursive=True):
        if process.username() == user and "supervise" in process.cmdline():
            return process.pid
    try:
        own = psutil.Process(pid)
        if own.username() == user and "supervise" in own.cmdline():
            return pid
    except psutil.Error:
        return None
    return None


def test_private_directories_another_user_made_or_linked_are_refused(
    cli: Cli, cluster: NamespaceCluster, shared_root: Path, peer: str
) -> None:
    """Issue 25: a runs/ directory the peer pre-created (or swapped for a link to one of theirs)
    in a shared place, on a host or in the state directory, is refused before anything is
    written there: otherwise the run's spec.json and agent.py would land in the peer's
    directory and run from it (code execution as the user)."""
    inventory(cli, cluster, shared_root, env={"HOLD": "0"})
    state_runs = cli.cwd / ".orchestrate" / "runs"
    scratch = shared_root / f"scratch-{cli.cwd.name}"  # a group scratch directory, like /tmp
    scratch.mkdir()
    scratch.chmod(0o1777)
    theirs = scratch / "theirs"
    assert as_peer(cluster, peer, "mkdir", "-m", "777", str(theirs)).returncode == 0
    # The state directory: runs/ the peer's (made as it could in a shared project directory).
    state_runs.mkdir(parents=True)
    os.chown(state_runs, *_ids(peer))
    refused = cli("up", "--skip-checks", "inv.yaml")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())  # rich wraps long lines
    assert f"refusing {state_runs}: it is another user's directory, owned by {peer}" in said
    assert list(state_runs.iterdir()) == [] and list(theirs.iterdir()) == []
    assert not (shared_root / cli.cwd.name).exists()  # nothing started on any host
    state_runs.rmdir()
    state_runs.symlink_to(theirs)  # and a link to theirs
    linked = cli("up", "--skip-checks", "inv.yaml")
    assert linked.returncode == 3, linked.stdout + linked.stderr
    assert f"refusing {state_runs}: it is a symbolic link" in " ".join(linked.stderr.split())
    assert list(theirs.iterdir()) == []
    state_runs.unlink()

    # The hosts: a world-writable workdir (sticky, like /tmp), where the peer made host1's
    # {job}/runs and made host2's a link to its own directory.
    workdirs = {h.name: shared_root / cli.cwd.name / h.name for h in cluster.hosts}
    for workdir in workdirs.values():
        workdir.mkdir(parents=True)
        workdir.chmod(0o1777)
    first, second = (workdirs[h.name] / "demo" for h in cluster.hosts)
    assert as_peer(cluster, peer, "mkdir", "-p", str(first / "runs")).returncode == 0
    assert as_peer(cluster, peer, "mkdir", "-p", str(second)).returncode == 0
    assert as_peer(cluster, peer, "ln", "-s", str(theirs), str(second / "runs")).returncode == 0
    up = cli("up", "--skip-checks", "inv.yaml")
    assert up.returncode == 3, up.stdout + up.stderr
    said = " ".join(up.stderr.split())
    assert f"refusing {first / 'runs'}: it belongs to {peer}" in said, up.stderr
    assert f"refusing {second / 'runs'}: it is a symbolic link (to {theirs})" in said, up.stderr
    assert list((first / "runs").iterdir()) == [] and list(theirs.iterdir()) == []
    # (Not checked: paramiko's "Exception ignored in BufferedFile.__del__" at interpreter exit,
    # which this error path can print after orchestrate's own message; noted in issue 25b.)
    assert "Traceback" not in up.stderr.split("Exception ignored")[0], up.stderr


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid
