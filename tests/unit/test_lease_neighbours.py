"""Leases that hold against a neighbour (issue 41): a second account on the same host, with
files only, can neither make two jobs hold one GPU or port, nor block one unseen, nor crash or
impersonate anyone. The real lease program on a real lease directory: the neighbour's requests
and file operations run as another uid (setpriv), the victim's as this one; claims.py on its
own first."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.hostside import claims
from orchestrator.hostside import leasepolicy as policy
from orchestrator.machines.hostclient import host_program
from orchestrator.model.leases import clock

NEIGHBOUR = 65534  # nobody: another account, with files and processes only
NEIGHBOUR_NAME = pwd.getpwuid(NEIGHBOUR).pw_name
SYSTEM_PYTHON = "/usr/bin/python3"  # stdlib is enough; the neighbour reaches no venv
GPU_ONE = {"name": "w", "port": 41500, "range": None, "gpus": 1, "pool": [1]}


# --- claims: the kernel's names ----------------------------------------------------------------


def test_one_exclusive_claim_per_name_and_none_beside_a_sharer(tmp_path: Path) -> None:
    where = claims.space(str(tmp_path))
    first = claims.claim(where, "gpus", 1)
    assert first is not None
    assert claims.claim(where, "gpus", 1) is None  # taken
    assert claims.claim(where, "gpus", 1, shared=True) is None  # an exclusive holder shares not
    assert claims.holder_uid(where, "gpus", 1) == os.getuid()
    first.close()  # the holder's end frees it: no file to clean up
    assert claims.holder_uid(where, "gpus", 1) is None
    sharers = [claims.claim(where, "gpus", 1, shared=True) for _ in range(2)]
    assert all(s is not None for s in sharers)
    assert claims.claim(where, "gpus", 1) is None  # a sharer holds it
    assert claims.sharer_uids(where, "gpus", 1) == [os.getuid()]
    other = claims.claim(claims.space(str(tmp_path / "other")), "gpus", 1)
    assert other is not None  # another lease directory is another set of names
    for held in (*sharers, other):
        assert held is not None
        held.close()


def test_times_and_owners_a_file_claims_are_checked() -> None:
    now = 1.7e9
    assert policy.moment(now - 60, now) == now - 60
    for forged in (1e300, -1e300, now + 301, 5.0, float("nan"), True, "soon"):
        assert policy.moment(forged, now) is None, forged
    assert policy.claims_owner({"uid": 7, "user": "amy"}, 7, "amy", "7") is None
    assert "belongs to uid 8" in str(policy.claims_owner({"uid": 7}, 8, None, "7"))
    said = policy.claims_owner({"uid": 7, "user": "root"}, 7, "amy", "7")
    assert said == "claims user 'root' but belongs to amy"
    assert clock(1e300) == clock(-1e300) == "?"  # an older host's answer: no OverflowError


# --- the lease program, two accounts --------------------------------------------------------------


@contextlib.contextmanager
def shared_lease_dir(prefix: str) -> Iterator[Path]:
    """A lease directory as an admin shares one (root's, 1777) where the neighbour can reach it;
    the victim's and the neighbour's leases released and the directory gone afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    leases = root / "leases"
    leases.mkdir()
    leases.chmod(0o1777)
    try:
        yield leases
    finally:
        ask(leases, {"verb": "release", "run_id": "victim"})
        ask(leases, {"verb": "release", "run_id": "neighbour"}, uid=NEIGHBOUR)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def lease_dir() -> Iterator[Path]:
    with shared_lease_dir("orch-lease-neighbours-") as leases:
        yield leases


def ask(lease_dir: Path, *requests: dict[str, Any], uid: int | None = None) -> list[Any]:
    lines = "".join(json.dumps({"lease_dir": str(lease_dir), **r}) + "\n" for r in requests)
    argv = [SYSTEM_PYTHON if uid else sys.executable, "-I", "-c", host_program("leases.py")]
    if uid:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    done = subprocess.run(argv, input=lines, capture_output=True, text=True, timeout=60,
                          check=True, cwd="/")  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines()]


def acquire(lease_dir: Path, run_id: str, uid: int | None = None, **extra: Any) -> Any:
    request = {"verb": "acquire", "run_id": run_id, "job": "j", "controller": "here",
               "idle": 30, "workers": [GPU_ONE], **extra}  # fmt: skip
    return ask(lease_dir, request, uid=uid)[0]


def as_neighbour(*argv: str) -> None:
    cmd = ["setpriv", f"--reuid={NEIGHBOUR}", f"--regid={NEIGHBOUR}", "--clear-groups", *argv]
    subprocess.run(cmd, check=True, cwd="/", capture_output=True)


def holders_of_gpu_one(lease_dir: Path) -> list[str]:
    listing = ask(lease_dir, {"verb": "list"})[0]
    return [h["run_id"] for h in listing["holders"] if 1 in h["gpus"]]


def refused(answer: dict[str, Any]) -> bool:
    return "assigned" not in answer and bool(answer.get("clashes"))


@pytest.mark.root  # setpriv to another uid: a neighbour with files only
def test_no_file_operation_of_a_neighbour_makes_two_jobs_hold_one_gpu(lease_dir: Path) -> None:
    # The neighbour's files under the names a keeper locked before: it owns them.
    for name in ("gpu-1.lock", "port-41500.lock"):
        as_neighbour("touch", str(lease_dir / name))
    assert "assigned" in acquire(lease_dir, "victim")
    moves = {
        "deletes its files": "rm -f gpu-1.lock port-41500.lock",
        "makes them again": "touch gpu-1.lock port-41500.lock",
        "renames them": "mv gpu-1.lock gone.lock; mv port-41500.lock gone2.lock",
        "makes unreadable ones": "touch gpu-1.lock; chmod 000 gpu-1.lock",
        "makes a fifo": "rm -f gpu-1.lock; mkfifo gpu-1.lock",
    }
    for what, script in moves.items():
        as_neighbour("sh", "-c", f"cd {lease_dir} && {script}")
        answer = acquire(lease_dir, "neighbour", uid=NEIGHBOUR)
        assert refused(answer), (what, answer)
        holder = answer["clashes"][0]["holders"]
        assert [h["run_id"] for h in holder] == ["victim"], (what, answer)
        assert holders_of_gpu_one(lease_dir) == ["victim"], what
    ask(lease_dir, {"verb": "release", "run_id": "victim"})
    assert "assigned" in acquire(lease_dir, "neighbour", uid=NEIGHBOUR)  # free once released
    assert refused(acquire(lease_dir, "victim"))  # and now the neighbour's, against anyone


@pytest.mark.root
def test_a_neighbours_hostile_files_block_nothing_and_are_named(lease_dir: Path) -> None:
    # Times no clock shows and every GPU: first in the queue forever; or another user's name.
    early = {"user": NEIGHBOUR_NAME, "uid": NEIGHBOUR, "job": "j", "run_id": "early",
             "controller": "here", "arrival": -1e300, "seen": 1e300, "pid": 1, "starttime": 0,
             "needs": {"ports": [41500], "pools": [{"gpus": [1], "count": 1}]}}  # fmt: skip
    tickets = {
        f"ticket-{NEIGHBOUR}-early.json": early,
        f"ticket-{NEIGHBOUR}-named.json": dict(early, user="root", run_id="named", arrival=1.7e9),
        f"ticket-{NEIGHBOUR}-deep.json": "[" * 60000,
        f"lease-{NEIGHBOUR}-deep-0123456789ab.json": "[" * 60000,
    }  # fmt: skip
    for name, content in tickets.items():
        text = content if isinstance(content, str) else json.dumps(content)
        path = lease_dir / name
        as_neighbour("touch", str(path))
        path.write_text(text)  # root writes into the neighbour's file: still theirs
    as_neighbour("sh", "-c", f"cd {lease_dir} && touch port-41500.lock && chmod 000 "
                 "port-41500.lock && mkfifo gpu-1.lock")  # fmt: skip
    answer = acquire(lease_dir, "victim")
    assert answer["assigned"]["w"] == {"port": 41500, "gpus": [1]}, answer
    named = {Path(i["file"]).name: i for i in answer["ignored"]}
    assert set(named) >= {*tickets, "gpu-1.lock"}, named
    assert all(named[n]["owner_uid"] == NEIGHBOUR for n in named), named
    reason = named[f"ticket-{NEIGHBOUR}-early.json"]["reason"]
    assert reason == "arrival is missing, malformed or out of range (-1e+300)", reason
    reason = named[f"ticket-{NEIGHBOUR}-named.json"]["reason"]
    assert reason == f"claims user 'root' but belongs to {NEIGHBOUR_NAME}", reason
    assert "nested too deep" in named[f"ticket-{NEIGHBOUR}-deep.json"]["reason"]
    listing = ask(lease_dir, {"verb": "list"})[0]
    assert listing["tickets"] == [] and [h["run_id"] for h in listing["holders"]] == ["victim"]
