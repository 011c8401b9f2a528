"""Leases a neighbour cannot keep alive, block or double-book (issue 54): the real lease program
on a real lease directory, the neighbour a second real account (setpriv) with files and
processes of its own; the network-namespace case in a throwaway namespace (unshare). Each
would double-book or block on the lease program before issue 54."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.hostside import leasepolicy as policy
from orchestrator.machines.hostclient import host_program
from tests.conftest import wait_for
from tests.unit.test_lease_neighbours import (
    NEIGHBOUR,
    NEIGHBOUR_NAME,
    SYSTEM_PYTHON,
    acquire,
    ask,
    lease_dir,
    refused,
)

__all__ = ["lease_dir"]  # the fixture, shared with the neighbours' tests

GPU_ONE_OF_TWO = {"name": "w", "port": 41500, "range": None, "gpus": 1, "pool": [1, 2]}
AS_NEIGHBOUR = ["setpriv", f"--reuid={NEIGHBOUR}", f"--regid={NEIGHBOUR}", "--clear-groups"]

# The neighbour's waiter: open every keeper's lock file it can and wait for its flock (a flock
# works on a read-only descriptor), then say so and hold it.
LOCK_WAITER = """
import fcntl, os, sys, time
lease_dir = sys.argv[1]
fds = []
for name in sorted(os.listdir(lease_dir)):
    if name.startswith("lease-") and name.endswith(".lock"):
        try:
            fds.append(os.open(os.path.join(lease_dir, name), os.O_RDONLY))
        except OSError as exc:
            print("refused", name, exc.strerror, flush=True)
print("opened", len(fds), flush=True)
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(300)
"""


@pytest.fixture
def neighbour_process() -> Iterator[list[subprocess.Popen[str]]]:
    """The neighbour's long-lived processes, ended by their pids after the test."""
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait(timeout=10)


def keeper_pid(lease_dir: Path, run_id: str) -> int:
    for path in lease_dir.glob(f"lease-{os.getuid()}-{run_id}-*.json"):
        return int(json.loads(path.read_text())["pid"])
    raise AssertionError(f"no record of {run_id} in {sorted(os.listdir(lease_dir))}")


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def kill_keeper(lease_dir: Path, run_id: str) -> None:
    """The keeper dies uncleanly, as an OOM kill ends it: no cleanup of its own."""
    pid = keeper_pid(lease_dir, run_id)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), 10, f"keeper {pid} gone")


@pytest.mark.root  # setpriv to another uid
def test_a_neighbour_waiting_on_a_keepers_lock_cannot_keep_a_dead_lease_alive(
    lease_dir: Path, neighbour_process: list[subprocess.Popen[str]]
) -> None:
    assert "assigned" in acquire(lease_dir, "victim")
    locks = list(lease_dir.glob("*.lock"))
    argv = [*AS_NEIGHBOUR, SYSTEM_PYTHON, "-I", "-c", LOCK_WAITER, str(lease_dir)]
    waiter = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd="/")
    neighbour_process.append(waiter)
    assert waiter.stdout is not None
    said = waiter.stdout.readline()
    while said.startswith("refused"):  # a lock file it may not open
        said = waiter.stdout.readline()
    kill_keeper(lease_dir, "victim")
    if said.strip() != "opened 0":  # it holds a descriptor: it gets the flock now
        assert waiter.stdout.readline().strip() == "locked"
    listing = ask(lease_dir, {"verb": "list"})[0]
    assert listing["holders"] == [], listing  # the victim's keeper is dead: it holds nothing
    assert "assigned" in acquire(lease_dir, "neighbour", uid=NEIGHBOUR)  # the GPU is free
    restart = acquire(lease_dir, "victim")  # the victim's next restart keeps nothing unheld
    assert refused(restart), restart
    assert [h["run_id"] for h in restart["clashes"][0]["holders"]] == ["neighbour"], restart
    for path in locks:  # lock files, if any, are their owner's to read
        assert path.stat().st_mode & 0o077 == 0, (path.name, oct(path.stat().st_mode))


def process_start(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19])


def here() -> tuple[str, str]:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return boot, os.readlink("/proc/self/ns/pid")


def plant_ticket(
    lease_dir: Path, run_id: str, pid: int, arrival: float, count: int,
    *, pool: Iterable[int] = (1,),
) -> str:  # fmt: skip
    """A ticket of the neighbour's own (its file, its uid, its live process)."""
    boot, pidns = here()
    ticket = {"user": NEIGHBOUR_NAME, "uid": NEIGHBOUR, "job": "j", "run_id": run_id,
              "controller": "here", "arrival": arrival, "seen": time.time(), "pid": pid,
              "starttime": process_start(pid), "boot_id": boot, "pidns": pidns,
              "needs": {"ports": [], "pools": [{"gpus": list(pool), "count": count}]}}  # fmt: skip
    name = f"ticket-{NEIGHBOUR}-{run_id}.json"
    subprocess.run([*AS_NEIGHBOUR, "touch", str(lease_dir / name)], check=True, cwd="/")
    (lease_dir / name).write_text(json.dumps(ticket))  # root writes: the file stays theirs
    return name


@pytest.mark.root
def test_a_forged_ticket_of_the_neighbours_own_blocks_nothing_and_is_named(
    lease_dir: Path, neighbour_process: list[subprocess.Popen[str]]
) -> None:
    sleeper = subprocess.Popen([*AS_NEIGHBOUR, "sleep", "300"], cwd="/", text=True)
    neighbour_process.append(sleeper)
    wait_for(lambda: Path(f"/proc/{sleeper.pid}/cmdline").read_bytes().startswith(b"sleep"), 10,
             "the neighbour's process started")  # fmt: skip
    too_many = plant_ticket(lease_dir, "greedy", sleeper.pid, time.time(), count=5)
    too_early = plant_ticket(lease_dir, "early", sleeper.pid, policy.EARLIEST + 1, count=1)
    answer = acquire(lease_dir, "victim")
    assert answer.get("assigned", {}).get("w") == {"port": 41500, "gpus": [1]}, answer
    named = {Path(i["file"]).name: i["reason"] for i in answer["ignored"]}
    assert named.get(too_many) == "asks for 5 GPUs of a pool of 1: it could never be served"
    assert "before its process started" in str(named.get(too_early)), named
    listing = ask(lease_dir, {"verb": "list"})[0]
    assert listing["tickets"] == [], listing


@pytest.mark.root
def test_a_ticket_for_more_gpus_than_the_host_has_blocks_nothing(
    lease_dir: Path, neighbour_process: list[subprocess.Popen[str]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # This host has two GPUs, as its nvidia-smi says (a stand-in first on the PATH).
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: Stand-in'\necho 'GPU 1: Stand-in'\n")
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    sleeper = subprocess.Popen([*AS_NEIGHBOUR, "sleep", "300"], cwd="/", text=True)
    neighbour_process.append(sleeper)
    wait_for(lambda: Path(f"/proc/{sleeper.pid}/cmdline").read_bytes().startswith(b"sleep"), 10,
             "the neighbour's process started")  # fmt: skip
    name = plant_ticket(lease_dir, "wide", sleeper.pid, time.time(), count=50, pool=range(100))
    answer = acquire(lease_dir, "victim")
    assert answer.get("assigned", {}).get("w") == {"port": 41500, "gpus": [1]}, answer
    named = {Path(i["file"]).name: i["reason"] for i in answer["ignored"]}
    assert named.get(name) == (
        "asks for 50 GPUs of a pool of which this host has 2: it could never be served"
    ), named


def ask_elsewhere(lease_dir: Path, request: dict[str, Any], neighbour: bool = True) -> Any:
    """The neighbour's (or this account's) lease program in a network namespace of its own (a
    throwaway one: it lives while the processes in it do), on the same lease directory."""
    who = AS_NEIGHBOUR if neighbour else []
    argv = ["unshare", "--net", *who, SYSTEM_PYTHON, "-I", "-c", host_program("leases.py")]
    line = json.dumps({"lease_dir": str(lease_dir), **request}) + "\n"
    done = subprocess.run(argv, input=line, capture_output=True, text=True, timeout=60,
                          check=True, cwd="/")  # fmt: skip
    return json.loads(done.stdout.splitlines()[0])


def acquire_elsewhere(lease_dir: Path, run_id: str, neighbour: bool = True,
                      pool: tuple[int, ...] = (1,)) -> Any:  # fmt: skip
    worker = {"name": "w", "port": 41500, "range": None, "gpus": 1, "pool": list(pool)}
    return ask_elsewhere(lease_dir, {"verb": "acquire", "run_id": run_id, "job": "j",
                                     "controller": "there", "idle": 30, "workers": [worker]},
                         neighbour)  # fmt: skip


@pytest.fixture
def keepers_ended(lease_dir: Path) -> Iterator[Path]:
    """Keepers in throwaway namespaces: no later request reaches their namespace to release
    them, so the test ends them by the pids their records name (keepers it started)."""
    yield lease_dir
    for path in lease_dir.glob("lease-*.json"):
        pid = int(json.loads(path.read_text())["pid"])
        if is_keeper(pid):
            os.kill(pid, signal.SIGKILL)


def is_keeper(pid: int) -> bool:
    """Whether `pid` is a lease keeper (the lease program's source is its command line), not
    a pid the system gave to another process since."""
    try:
        return b"def keep(" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.root  # unshare and setpriv
def test_a_lease_held_in_another_network_namespace_counts_as_taken(keepers_ended: Path) -> None:
    lease_dir = keepers_ended
    assert "assigned" in acquire(lease_dir, "victim")
    there = acquire_elsewhere(lease_dir, "neighbour")
    assert refused(there), there  # the victim's record is live: its keeper is
    assert [h["run_id"] for h in there["clashes"][0]["holders"]] == ["victim"], there
    kill_keeper(lease_dir, "victim")
    there = acquire_elsewhere(lease_dir, "neighbour")
    assert "assigned" in there, there  # a dead keeper's lease is free everywhere
    here_ = acquire(lease_dir, "victim")
    assert refused(here_), here_  # and the other namespace's live one is taken here
    assert [h["run_id"] for h in here_["clashes"][0]["holders"]] == ["neighbour"], here_


# --- the decisions, pure --------------------------------------------------------------------------

HERE = ("boot", "pid:[1]", "net:[1]")


def record(**changes: Any) -> dict[str, Any]:
    base = {"uid": 1000, "pid": 40, "keeper_start": 7, "boot_id": "boot", "pidns": "pid:[1]",
            "netns": "net:[1]", "ports": [41500], "gpus": [1], "touched": 100.0}  # fmt: skip
    return {**base, **changes}


def test_a_record_lives_only_while_its_keeper_holds_every_claim_it_names() -> None:
    def held_by(*holders: tuple[int, int]) -> Any:
        return lambda kind, number: list(holders)

    def alive(rec: dict[str, Any], holders_of: Any) -> bool:
        return policy.record_alive(rec, HERE, holders_of, lambda pid: None, 110.0)

    assert alive(record(), held_by((40, 1000)))
    assert not alive(record(), held_by())  # its keeper died: the kernel freed the claims
    assert not alive(record(), held_by((41, 1000)))  # another process of its uid holds them
    assert not alive(record(), held_by((40, 65534)))  # another account holds them
    assert not alive(record(ports=[], gpus=[]), held_by((40, 1000)))  # names nothing
    assert alive(record(pidns="pid:[2]"), held_by((0, 1000)))  # a pid not seen here: its uid
    assert alive(record(keeper_start=None), held_by((9, 1000)))  # an older keeper: its uid


def test_a_record_of_another_network_namespace_is_its_keeper_process_or_its_touch() -> None:
    there = record(netns="net:[2]")
    keeper = {40: (1000, 7)}
    assert policy.record_alive(there, HERE, lambda k, n: [], keeper.get, 110.0)
    assert not policy.record_alive(there, HERE, lambda k, n: [], {40: (1000, 8)}.get, 110.0)
    assert not policy.record_alive(there, HERE, lambda k, n: [], {}.get, 110.0)
    elsewhere = record(netns="net:[2]", pidns="pid:[2]")  # its keeper cannot be seen: touched?
    assert policy.record_alive(elsewhere, HERE, lambda k, n: [], {}.get, 100.0 + 30)
    assert not policy.record_alive(elsewhere, HERE, lambda k, n: [], {}.get, 100.0 + 31)


def test_a_ticket_that_could_never_be_served_or_arrived_before_its_process_is_refused() -> None:
    good = {"ports": [], "pools": [{"gpus": [0, 1], "count": 2}]}
    assert policy._valid_needs(good)[1] is None
    greedy = {"ports": [], "pools": [{"gpus": [0, 1], "count": 3}]}
    assert policy._valid_needs(greedy) == (
        None, "asks for 3 GPUs of a pool of 2: it could never be served")  # fmt: skip
    ticket = {"arrival": 1000.0}
    assert policy.arrival_forged(ticket, None) is None  # its process is not seen here
    assert policy.arrival_forged(ticket, 1001.5) is None  # within the clock's ticks
    assert policy.arrival_forged(ticket, 1010.0) == (
        "its arrival (1000) is before its process started (1010)")  # fmt: skip


@pytest.mark.root  # unshare
def test_a_runs_workers_in_two_namespaces_share_a_port_number_never_a_gpu(
    keepers_ended: Path,
) -> None:
    lease_dir = keepers_ended
    here_ = acquire(lease_dir, "victim", workers=[dict(GPU_ONE_OF_TWO)])
    assert here_["assigned"]["w"] == {"port": 41500, "gpus": [1]}, here_
    there = acquire_elsewhere(lease_dir, "victim", neighbour=False, pool=(1, 2))
    assert there["assigned"]["w"] == {"port": 41500, "gpus": [2]}, there  # the machine's GPUs
    listing = ask(lease_dir, {"verb": "list"})[0]
    assert [(h["gpus"], h["here"]) for h in listing["holders"]] in (
        [([1], True), ([2], False)], [([2], False), ([1], True)])  # fmt: skip


def test_a_ticket_asking_more_gpus_of_a_pool_than_the_host_has_is_never_served() -> None:
    ticket = {"needs": {"ports": [], "pools": [{"gpus": list(range(100)), "count": 50}]}}
    assert policy.never_served(ticket, None) is None  # no nvidia-smi: nothing to say
    why = "asks for 50 GPUs of a pool of which this host has 4: it could never be served"
    assert policy.never_served(ticket, [0, 1, 2, 3]) == why
    fits = {"needs": {"ports": [], "pools": [{"gpus": [0, 1, 7], "count": 2}]}}
    assert policy.never_served(fits, [0, 1, 2, 3]) is None
