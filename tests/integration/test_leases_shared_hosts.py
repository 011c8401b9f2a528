"""Leases on shared machines (issue 29), on namespace hosts with real sshd (tests/cluster).

Two real users of the same three hosts: root and a second, unprivileged account whose key the
hosts' sshd accepts (every account's authorized keys are the cluster's one file). Each host has
its own lease_dir (the namespaces share one filesystem). The jobs are stdlib scripts: a worker
waits for a `go` file, then counts its steps, so that a test sees the leases while it runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cluster.inventories import host_entries, write_inventory
from tests.cluster.netns import NamespaceCluster
from tests.cluster.pytest_support import SharedCluster
from tests.conftest import Cli, detached_supervisors, run_processes, wait_for

pytestmark = pytest.mark.netns

# A job's leases go when its supervisor sees the run end (at once where the exit is told, else
# within one poll), before it discards the standbys or waits for notifications; on this busy
# 2-core machine, with the `jobs` listing's own ssh, well within this (docs/machines.md).
LEASE_RELEASE_S = 20
SYSTEM_PYTHON = "/usr/bin/python3"  # the second user cannot reach root's pyenv; stdlib is enough
SCRIPT = """\
import json, os, sys, time
go = os.environ["GO_FILE"]
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
print("TF_CONFIG", os.environ["TF_CONFIG"], flush=True)
if os.environ.get("FAIL_FIRST") and "/attempt-0/" in os.environ["ORCHESTRATE_RUN_DIR"]:
    sys.exit(1)
deadline = time.time() + 120
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.1)
for step in (1, 2, 3):
    with open(os.environ["ORCHESTRATE_PROGRESS_FILE"], "w") as f:
        json.dump({"step": step, "target_steps": 3}, f)
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def shared_root() -> Iterator[Path]:
    """World-writable like /tmp: both users' workdirs, the lease dirs and the go files."""
    root = Path(tempfile.mkdtemp(prefix="orch-leases-", dir="/tmp"))
    root.chmod(0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(namespace_hosts: SharedCluster) -> NamespaceCluster:
    # sshd reads authorized_keys as the user logging in: the shared cluster's directory is
    # world-traversable for that.
    return namespace_hosts.hosts(3)


@pytest.fixture(scope="module")
def peer() -> Iterator[str]:
    """A second account on the hosts that can log in with the cluster's key (not locked)."""
    name = f"orchlease{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    subprocess.run(["usermod", "-p", "*", name], check=True)  # sshd (no PAM) refuses "!"
    try:
        yield name
    finally:
        for process in psutil.process_iter(["username"]):
            if process.info["username"] == name:
                process.kill()
        subprocess.run(["userdel", name], check=False)


class Job:
    """One user's job: its own directory and state directory, its inventory, its go file."""

    def __init__(self, root: Path, name: str, user: str) -> None:
        self.cli = Cli(root / f"ctl-{name}")
        self.cli.cwd.mkdir()
        self.name, self.user = name, user
        self.go = root / f"go-{name}"
        self.work = root / f"work-{name}"
        self.work.mkdir()
        if user != "root":
            shutil.chown(self.work, user)
        self.run_id = ""

    def write(self, cluster: NamespaceCluster, root: Path, hosts: int = 3, **keys: Any) -> None:
        job = {"name": self.name, "script": "train.py", "restart_backoff": 0,
               "env": {"GO_FILE": str(self.go), **keys.pop("env", {})},
               **keys.pop("job", {})}  # fmt: skip
        (self.cli.cwd / "train.py").write_text(SCRIPT)
        entries = host_entries(
            cluster, **{h.name: {"workdir": str(self.work / h.name),
                                 "lease_dir": str(root / f"leases-{h.name}")}
                        for h in cluster.hosts}
        )[:hosts]  # fmt: skip
        defaults = {"ssh_user": self.user, "python": SYSTEM_PYTHON, "port": "auto", **keys}
        write_inventory(self.cli.cwd / "inv.yaml", cluster, job, defaults=defaults,
                        hosts=entries)  # fmt: skip

    def up(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = self.cli("up", "--skip-checks", *args, "inv.yaml", timeout=120)
        if (self.cli.cwd / ".orchestrate" / "current").exists():
            self.run_id = self.cli.record()["run_id"]
        return result

    def jobs(self) -> dict[str, Any]:
        return json.loads(self.cli("jobs", "--json", "inv.yaml", check=True).stdout)

    def logs(self) -> dict[str, str]:
        """Each attempt's worker log, by 'attempt-N/host'."""
        runs = self.work.glob(f"*/{self.name}/runs/{self.run_id}/attempt-*/*/worker.log")
        return {f"{p.parent.parent.name}/{p.parent.name}": p.read_text() for p in runs}

    def printed(self, count: int) -> bool:
        """Whether `count` worker logs hold the script's first lines."""
        logs = self.logs()
        return len(logs) == count and all("TF_CONFIG" in text for text in logs.values())

    def finish(self) -> dict[str, Any]:
        self.go.touch()
        return self.cli.status_when(lambda s: s["state"] not in ("starting", "running"), 60)

    def cleanup(self) -> None:
        self.go.touch()
        if self.run_id:
            self.cli("down", "--grace", "1")
            for process in [*detached_supervisors(self.run_id), *run_processes(self.run_id)]:
                with _gone():
                    process.kill()


def _gone() -> contextlib.suppress:
    return contextlib.suppress(psutil.Error, ProcessLookupError)


def is_agent(cmdline: list[str]) -> bool:
    return cmdline[:3] == [SYSTEM_PYTHON, "-I", "-c"] and "The host-side agent" in cmdline[3]


def by_user(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {job["user"]: job for job in listing["jobs"]}


def ports_of(log: str) -> list[str]:
    match = re.search(r"^TF_CONFIG (.*)$", log, re.M)
    assert match is not None, log
    return json.loads(match.group(1))["cluster"]["worker"]


def visible_devices(log: str) -> set[str]:
    match = re.search(r"CUDA_VISIBLE_DEVICES (\S+)", log)
    assert match is not None, log
    return set(match.group(1).split(","))


@pytest.fixture
def jobs(shared_root: Path, peer: str, request: pytest.FixtureRequest) -> Iterator[list[Job]]:
    made = [Job(shared_root, f"{request.node.name[:12]}-{i}", user)
            for i, user in enumerate(["root", peer, "root"])]  # fmt: skip
    yield made
    for job in made:
        job.cleanup()


def test_two_users_get_distinct_ports_train_and_see_each_other(
    cluster: NamespaceCluster, shared_root: Path, jobs: list[Job], peer: str
) -> None:
    ours, theirs, _ = jobs
    ours.write(cluster, shared_root)
    theirs.write(cluster, shared_root)
    assert ours.up("-d").returncode == 0
    started = theirs.up("-d")
    assert started.returncode == 0, started.stderr
    for lease_dir in shared_root.glob("leases-*"):
        assert lease_dir.stat().st_mode & 0o7777 == 0o1777  # created sticky, world-writable

    listings = [ours.jobs(), theirs.jobs()]  # the same picture from either user
    for listing in listings:
        holders = by_user(listing)
        assert set(holders) == {"root", peer}, listing
        assert holders["root"]["run_id"] == ours.run_id
        assert holders[peer]["run_id"] == theirs.run_id and holders[peer]["job"] == theirs.name
        assert set(holders[peer]["hosts"]) == {h.name for h in cluster.hosts}
    mine, other = (by_user(listings[0])[u]["hosts"] for u in ("root", peer))
    for host in cluster.hosts:
        assert set(mine[host.name]["ports"]).isdisjoint(other[host.name]["ports"])

    # TF_CONFIG holds the leased ports, the same list on every worker of a job.
    for job, leased in ((ours, mine), (theirs, other)):
        wait_for(functools.partial(job.printed, 3), 30)
        endpoints = {tuple(ports_of(log)) for log in job.logs().values()}
        assert len(endpoints) == 1
        assert [int(e.rsplit(":", 1)[1]) for e in endpoints.pop()] == [
            leased[h.name]["ports"][0] for h in cluster.hosts
        ]
    for job in (ours, theirs):
        assert job.finish()["state"] == "succeeded"
    # The runs ended: their supervisors let go of every lease.
    wait_for(lambda: ours.jobs()["jobs"] == [], 20, "the leases released")


def test_gpus_are_leased_apart_and_a_third_job_is_told_who_holds_them(
    cluster: NamespaceCluster, shared_root: Path, jobs: list[Job], peer: str
) -> None:
    pool = {"visible_gpus": [0, 1, 2, 3], "gpus": 2}
    for job in jobs:
        job.write(cluster, shared_root, hosts=1, **pool)
    first, second, third = jobs
    assert first.up("-d").returncode == 0
    assert second.up("-d").returncode == 0
    wait_for(lambda: first.printed(1) and second.printed(1), 30)
    devices = [visible_devices(next(iter(j.logs().values()))) for j in (first, second)]
    assert all(len(d) == 2 for d in devices) and devices[0].isdisjoint(devices[1]), devices

    refused = third.up("-d")
    assert refused.returncode == 4, refused.stderr
    said = " ".join(refused.stderr.split())  # the console wraps long lines
    host = cluster.hosts[0].name
    assert f"{host}: GPUs {','.join(sorted(devices[1]))} are held by {peer}'s job " \
           f"{second.name} (run {second.run_id}) since " in said  # fmt: skip
    assert f"GPUs {','.join(sorted(devices[0]))} are held by root's job {first.name} " \
           f"(run {first.run_id})" in said  # fmt: skip
    assert "orchestrate jobs" in said  # the hint
    assert not (third.cli.cwd / ".orchestrate" / "current").exists()  # nothing started


def test_a_restart_keeps_its_port_and_gpus_while_another_job_asks(
    cluster: NamespaceCluster, shared_root: Path, jobs: list[Job], peer: str
) -> None:
    restarting, asking, _ = jobs
    restarting.write(cluster, shared_root, hosts=1, visible_gpus=[0, 1], gpus=2,
                     env={"FAIL_FIRST": "1"}, job={"restart_backoff": 4})  # fmt: skip
    asking.write(
        cluster, shared_root, hosts=1, visible_gpus=[0, 1], gpus=2, port_range="20000-20000"
    )
    assert restarting.up("-d").returncode == 0
    log = restarting.cli.cwd / ".orchestrate" / "runs" / f"{restarting.run_id}.log"
    wait_for(lambda: log.exists() and "restarting the cluster" in log.read_text(), 30)
    # In the backoff no worker of the run lives: its keeper holds the port and the GPUs.
    refused = asking.up("-d")
    assert refused.returncode == 4, refused.stderr
    said = " ".join(refused.stderr.split())
    assert f"port 20000 and GPUs 0,1 are held by root's job {restarting.name} " \
           f"(run {restarting.run_id})" in said  # fmt: skip
    wait_for(lambda: restarting.printed(2), 30, "the restarted attempt")
    assert restarting.finish()["state"] == "succeeded", log.read_text()
    logs = restarting.logs()
    assert set(logs) == {f"attempt-{n}/{cluster.hosts[0].name}" for n in (0, 1)}
    first, second = (logs[f"attempt-{n}/{cluster.hosts[0].name}"] for n in (0, 1))
    assert ports_of(first) == ports_of(second) and ports_of(first)[0].endswith(":20000")
    assert "CUDA_VISIBLE_DEVICES 0,1" in first and "CUDA_VISIBLE_DEVICES 0,1" in second


def test_a_run_killed_on_its_host_frees_its_leases_and_hostile_records_are_named(
    cluster: NamespaceCluster, shared_root: Path, jobs: list[Job], peer: str
) -> None:
    victim, successor, _ = jobs
    for job in (victim, successor):
        job.write(cluster, shared_root, hosts=1, port_range="20000-20000")
    lease_dir = shared_root / f"leases-{cluster.hosts[0].name}"
    assert victim.up("-d").returncode == 0
    wait_for(lambda: victim.printed(1), 30)
    holders = victim.jobs()["jobs"]
    assert [j["run_id"] for j in holders] == [victim.run_id]

    keeper = json.loads(next(lease_dir.glob(f"lease-0-{victim.run_id}-*.json")).read_text())
    # Another user's hostile files beside the leases: a record claiming to be root's, and a
    # record that is a symlink to a file the other user cannot read.
    peer_uid = int(subprocess.run(["id", "-u", peer], capture_output=True, text=True,
                                  check=True).stdout)  # fmt: skip
    forged = lease_dir / f"lease-0-{victim.run_id}-deadbeef.json"
    symlink = lease_dir / f"lease-{peer_uid}-20990101-000000-beef-cafebabe.json"
    as_peer = ["runuser", "-u", peer, "--"]
    subprocess.run([*as_peer, "sh", "-c", f"echo '{{\"uid\": 0}}' > {forged}"], check=True)
    subprocess.run([*as_peer, "ln", "-s", "/etc/shadow", str(symlink)], check=True)

    # Everything of the run on the host: the supervisor here first (it would restart it),
    # then its workers, supervisors, keeper and agent sessions there, at once.
    for process in detached_supervisors(victim.run_id):
        process.kill()
    agents = [p for p in psutil.process_iter(["cmdline", "username"])
              if p.info["username"] == "root" and is_agent(p.info["cmdline"] or [])]  # fmt: skip
    doomed = [*run_processes(victim.run_id), psutil.Process(keeper["pid"]), *agents]
    assert len(doomed) >= 3
    for process in doomed:
        with _gone():
            os.kill(process.pid, signal.SIGKILL)
    psutil.wait_procs(doomed, timeout=10)

    listing = successor.jobs()  # the next look: nothing holds it any more
    assert listing["jobs"] == [], listing
    reasons = {Path(i["file"]).name: i["reason"] for i in listing["ignored"]}
    assert (
        "belongs to uid" in reasons[forged.name] and "not a regular file" in reasons[symlink.name]
    )
    started = successor.up("-d")
    assert started.returncode == 0, started.stderr
    assert f"ignored {forged}" in " ".join(started.stderr.split())  # named where users look
    assert successor.finish()["state"] == "succeeded"
    log = next(iter(successor.logs().values()))
    assert ports_of(log)[0].endswith(":20000")  # the one the killed run held


# --- a neighbour with files only (issue 41) ------------------------------------------------------


def test_a_neighbours_file_operations_neither_double_book_nor_block_a_gpu(
    cluster: NamespaceCluster,
    shared_root: Path,
    jobs: list[Job],
    peer: str,
    request: pytest.FixtureRequest,
) -> None:
    """The second real user does every file operation it may in the lease directory (make
    files under the names an older orchestrate locked, delete, rename and recreate them, make
    them unreadable or a fifo, forge a ticket in root's name with times no clock shows, write
    deep JSON) while root's job holds GPU 1 and port 20000: its own job is refused each time,
    naming root's; `jobs` shows one holder; root's next job is blocked by none of it."""
    victim, neighbour, later = jobs  # root, the peer, root
    for job in jobs:
        job.write(cluster, shared_root, hosts=1, port_range="20000-20000", visible_gpus=[1],
                  gpus=1)  # fmt: skip
    lease_dir = shared_root / f"leases-{cluster.hosts[0].name}"
    lease_dir.mkdir(mode=0o1777, exist_ok=True)  # as an admin shares one: root's, sticky
    lease_dir.chmod(0o1777)
    uid = peer_uid(peer)

    def remove_the_neighbours_files() -> None:  # the module's queue tests count the tickets
        for path in lease_dir.iterdir():
            if path.lstat().st_uid == uid:
                path.unlink()

    request.addfinalizer(remove_the_neighbours_files)

    def as_peer(script: str) -> None:
        subprocess.run(["runuser", "-u", peer, "--", "sh", "-c", f"cd {lease_dir} && {script}"],
                       check=True)  # fmt: skip

    as_peer("touch gpu-1.lock port-20000.lock")  # theirs, before root's keeper comes
    assert victim.up("-d").returncode == 0
    wait_for(lambda: victim.printed(1), 30)
    held = f"port 20000 and GPU 1 are held by root's job {victim.name} (run {victim.run_id})"
    for script in (
        "rm -f gpu-1.lock port-20000.lock && touch gpu-1.lock port-20000.lock",
        "mv gpu-1.lock moved.lock && mv port-20000.lock moved2.lock",
        "touch gpu-1.lock && chmod 000 gpu-1.lock && mkfifo port-20000.lock",
    ):
        as_peer(script)
        refused = neighbour.up("-d")
        assert refused.returncode == 4, (script, refused.stderr)
        assert held in " ".join(refused.stderr.split()), (script, refused.stderr)
        holders = victim.jobs()["jobs"]
        assert [j["run_id"] for j in holders] == [victim.run_id], (script, holders)
    forged = {"user": "root", "uid": uid, "job": "j", "run_id": "forged", "controller": "x",
              "arrival": -1e300, "seen": 1e300, "pid": 1, "starttime": 0,
              "needs": {"ports": [20000], "pools": [{"gpus": [1], "count": 1}]}}  # fmt: skip
    as_peer(f"echo '{json.dumps(forged)}' > ticket-{uid}-forged.json")
    as_peer(f"printf '%060000d' 0 | tr 0 '[' > ticket-{uid}-deep.json")
    assert victim.finish()["state"] == "succeeded"
    victim.run_id = ""
    wait_for(lambda: later.jobs()["jobs"] == [], LEASE_RELEASE_S, "root's leases released")

    started = later.up("-d")  # behind no forged ticket
    assert started.returncode == 0, started.stderr
    listing = later.jobs()
    assert [j["run_id"] for j in listing["jobs"]] == [later.run_id] and listing["queued"] == []
    reasons = {Path(i["file"]).name: (i["owner_uid"], i["reason"]) for i in listing["ignored"]}
    assert reasons[f"ticket-{uid}-forged.json"] == (
        uid,
        f"claims user 'root' but belongs to {peer}",
    )
    assert reasons[f"ticket-{uid}-deep.json"] == (uid, "JSON nested too deep")
    assert reasons["port-20000.lock"] == (uid, "not a regular file")
    assert later.finish()["state"] == "succeeded"


# --- the queue (issue 30): `up -d --queue` waits its turn -----------------------------------------


def queue_up(job: Job) -> dict[str, Any]:
    """`up -d --queue`; the job's status after it returned (pending, or its run's)."""
    result = job.up("-d", "--queue")
    assert result.returncode == 0, result.stderr
    return job.cli.status()


def waiting_process(job: Job) -> psutil.Process | None:
    """The detached `up --queue` of the job (it waits, then supervises the run it started)."""
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if "--queue" in command and str(job.cli.cwd / "inv.yaml") in command:
            return process
    return None


def started(job: Job, timeout: float = 60) -> dict[str, Any]:
    """Wait until the queued job's run has started; its run id is the job's from then on."""
    status = job.cli.status_when(lambda s: s["state"] in ("starting", "running"), timeout)
    job.run_id = status["run_id"]
    return status


def peer_uid(peer: str) -> int:
    return int(subprocess.run(["id", "-u", peer], capture_output=True, text=True,
                              check=True).stdout)  # fmt: skip


def reason(job: Job) -> str:
    status = job.cli.status()
    assert status["state"] == "pending", status
    return status["reason"]


@pytest.fixture
def queued_jobs(jobs: list[Job]) -> Iterator[list[Job]]:
    yield jobs
    for job in jobs:  # a job still queued: down withdraws it; a finished one's `up` ends
        process = waiting_process(job)
        if process is None:
            continue
        if (job.cli.cwd / ".orchestrate" / "queued.json").exists():
            job.cli("down", "--grace", "1")
        with _gone():
            process.wait(10)
        with _gone():
            process.kill()


def test_three_jobs_for_the_same_two_gpus_start_in_order_and_two_gpus_are_not_starved(
    cluster: NamespaceCluster, shared_root: Path, queued_jobs: list[Job], peer: str
) -> None:
    # root's one-GPU job runs; the peer's two-GPU job queues (one GPU is not enough); root's
    # later one-GPU job queues too although a GPU is free: an earlier ticket waits for it.
    first, second, third = queued_jobs
    for job, count in zip(queued_jobs, (1, 2, 1), strict=True):
        job.write(cluster, shared_root, hosts=1, visible_gpus=[0, 1], gpus=count)
    host = cluster.hosts[0].name
    assert queue_up(first)["state"] in ("starting", "running")  # nothing held: it starts
    first.run_id = first.cli.status()["run_id"]
    assert queue_up(second)["state"] == "pending"
    assert reason(second) == f"queued behind root's job {first.name} (run {first.run_id}) " \
                             f"on {host}: GPU 0"  # fmt: skip
    assert queue_up(third)["state"] == "pending"
    second_run = second.cli.status()["run_id"]
    assert reason(third) == f"queued behind {peer}'s job {second.name} (run {second_run}, " \
                            f"queued earlier) on {host}: GPUs 0,1"  # fmt: skip
    listing = first.jobs()  # any user sees the queue, in its order
    assert [(j["user"], j["job"]) for j in listing["queued"]] == [
        (peer, second.name),
        ("root", third.name),
    ]
    assert listing["queued"][0]["hosts"][host] == {"ports": [], "gpus": [0, 1], "count": 2}
    assert "queued jobs, in order" in first.cli("jobs", "inv.yaml").stdout

    assert first.finish()["state"] == "succeeded"
    first.run_id = ""  # done: nothing to bring down
    assert started(second)["run_id"] == second_run  # the run id it queued under
    wait_for(lambda: second.printed(1), 30)
    assert "CUDA_VISIBLE_DEVICES 0,1" in next(iter(second.logs().values()))
    # The waiting `up` says the new reason at its next ask of the host (every 2 s).
    behind = f"queued behind {peer}'s job {second.name} (run {second_run}) on {host}: GPUs 0,1"
    wait_for(lambda: reason(third) == behind, 30, "the reason of the third job's wait")
    assert [j["job"] for j in first.jobs()["queued"]] == [third.name]
    assert second.finish()["state"] == "succeeded"
    second.run_id = ""
    started(third)
    assert third.finish()["state"] == "succeeded"
    third.run_id = ""
    wait_for(lambda: first.jobs()["jobs"] == [], LEASE_RELEASE_S,
             f"the last job's leases released within {LEASE_RELEASE_S} s of its end")  # fmt: skip
    after = first.jobs()  # (another test's hostile records may still be ignored there)
    assert after["jobs"] == [] and after["queued"] == [] and after["unreachable"] == {}
    log = (second.cli.cwd / ".orchestrate" / "queued.log").read_text()
    assert "pending, queued behind" in log and "its turn; starting" in log


def test_down_withdraws_a_queued_job_and_a_killed_ones_ticket_expires(
    cluster: NamespaceCluster, shared_root: Path, queued_jobs: list[Job], peer: str
) -> None:
    holder, withdrawn, killed = queued_jobs  # root, the peer, root
    for job in queued_jobs:
        job.write(cluster, shared_root, hosts=1, port_range="20000-20000")
    lease_dir = shared_root / f"leases-{cluster.hosts[0].name}"
    assert holder.up("-d").returncode == 0
    holder.run_id = holder.cli.record()["run_id"]
    assert queue_up(withdrawn)["state"] == "pending"
    assert queue_up(killed)["state"] == "pending"
    assert len(list(lease_dir.glob("ticket-*.json"))) == 2

    queued_run = withdrawn.cli.status()["run_id"]
    assert (lease_dir / f"ticket-{peer_uid(peer)}-{queued_run}.json").exists()
    down = withdrawn.cli("down")
    assert down.returncode == 0 and "withdrawn" in down.stderr, down.stderr
    assert waiting_process(withdrawn) is None
    assert not (lease_dir / f"ticket-{peer_uid(peer)}-{queued_run}.json").exists()
    assert [j["job"] for j in holder.jobs()["queued"]] == [killed.name]
    assert withdrawn.cli("status").returncode == 4  # no run: nothing had started

    # Ctrl-C of an attached queued `up` withdraws it too.
    attached = withdrawn.cli.popen("up", "--skip-checks", "--queue", "inv.yaml")
    try:
        attached_run = withdrawn.cli.status_when(lambda s: s["state"] == "pending", 30)["run_id"]
        assert (lease_dir / f"ticket-{peer_uid(peer)}-{attached_run}.json").exists()
        attached.send_signal(signal.SIGINT)
        _, said = attached.communicate(timeout=30)
    finally:
        attached.kill()
    assert attached.returncode == 130, said
    assert "pending, queued behind root's job" in said and "withdrawn" in said
    assert not (lease_dir / f"ticket-{peer_uid(peer)}-{attached_run}.json").exists()

    again = killed.cli("up", "--skip-checks", "-d", "inv.yaml")  # one run per state directory
    assert again.returncode == 4 and "is queued in this state directory" in again.stderr
    process = waiting_process(killed)
    assert process is not None
    process.kill()  # SIGKILL: no chance to withdraw
    process.wait(10)
    assert holder.jobs()["queued"] == []  # its ticket expired: its controller is gone
    assert killed.cli("status").returncode == 4
    # The next job is blocked by the holder alone, and starts when it ends.
    assert holder.finish()["state"] == "succeeded"
    wait_for(lambda: holder.jobs()["jobs"] == [], LEASE_RELEASE_S,
             f"the holder's leases released within {LEASE_RELEASE_S} s of its end")  # fmt: skip
    assert queue_up(withdrawn)["state"] in ("starting", "running")
    withdrawn.run_id = withdrawn.cli.status()["run_id"]
    assert withdrawn.finish()["state"] == "succeeded"
    holder.run_id = withdrawn.run_id = ""  # done: nothing to bring down
