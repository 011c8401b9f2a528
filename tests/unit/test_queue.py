"""The queue (issue 30): the pure decision "may this run take now?", ticket validation and
expiry, the host's lease program keeping real tickets in a real lease directory, and the
engine's waiting over the fake backend."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.engine.start.queue import Withdrawn, controller_ticket, pending, wait_for_leases
from orchestrator.engine.store.runstore import RunStore
from orchestrator.errors import LeaseClash
from orchestrator.hostside import leasedir
from orchestrator.hostside import leasepolicy as policy
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.leases import Clash, Holder, parse_clashes, queue_reason
from tests.fakes.backend import FakeBackend
from tests.unit.test_leases import acquire, ask, listing

RUN = "20261201-104200-ab12"


def ticket(run_id: str, arrival: float, gpus: tuple[int, ...] = (), count: int = 0, *,
           ports: tuple[int, ...] = (), uid: int = 1001) -> dict[str, Any]:  # fmt: skip
    pools = [{"gpus": list(gpus), "count": count}] if count else []
    return {"user": "bob", "uid": uid, "job": "bert", "run_id": run_id, "controller": "laptop",
            "arrival": arrival, "seen": arrival, "pid": 4242, "starttime": 7,
            "boot_id": "boot", "pidns": "pid:[1]",
            "needs": {"ports": list(ports), "pools": pools}}  # fmt: skip


def needs(gpus: tuple[int, ...] = (), count: int = 0, ports: tuple[int, ...] = ()) -> dict:
    return {"ports": list(ports), "pools": [{"gpus": list(gpus), "count": count}] if count else []}


# --- the pure decision ---------------------------------------------------------------------------


def test_a_later_one_gpu_job_waits_behind_an_earlier_two_gpu_ticket_of_the_same_pool() -> None:
    big = ticket("big", 10.0, (0, 1), 2)
    small = ticket("small", 20.0, (0, 1), 1)
    free, ahead = policy.may_take(small["needs"], policy.order(small), [big, small])
    assert not free and [t["run_id"] for t in ahead] == ["big"] and ahead[0]["gpus"] == [0, 1]
    # The earliest never waits for a later one: no two runs wait for each other.
    assert policy.may_take(big["needs"], policy.order(big), [big, small]) == (True, [])


def test_only_tickets_for_the_same_resources_are_waited_behind() -> None:
    other_pool = ticket("other", 1.0, (2, 3), 2)
    other_port = ticket("port", 2.0, ports=(23457,))
    mine = needs((0, 1), 1, ports=(23456,))
    assert policy.may_take(mine, (30.0, 0, RUN), [other_pool, other_port]) == (True, [])
    same_port = ticket("same", 3.0, ports=(23456,))
    free, ahead = policy.may_take(mine, (30.0, 0, RUN), [same_port])
    assert not free and ahead[0]["ports"] == [23456] and ahead[0]["gpus"] == []


def test_a_run_without_a_ticket_arrives_now_behind_every_ticket() -> None:
    waiting = ticket("waiting", 1e12, (0,), 1)  # even one from a clock far ahead
    free, _ = policy.may_take(needs((0,), 1), (float("inf"), 0, RUN), [waiting])
    assert not free
    # Same arrival: the order is still total (user, then run), the same on every host.
    a, b = ticket("a", 5.0, (0,), 1, uid=1), ticket("b", 5.0, (0,), 1, uid=1)
    assert policy.may_take(a["needs"], policy.order(a), [b])[0]
    assert not policy.may_take(b["needs"], policy.order(b), [a])[0]


def test_a_ticket_lives_while_its_controller_does() -> None:
    t = ticket("t", 100.0)
    here = ("boot", "pid:[1]")
    assert policy.ticket_alive(t, 1000.0, here, lambda pid: 7)  # the same process
    assert not policy.ticket_alive(t, 100.0, here, lambda pid: None)  # gone
    assert not policy.ticket_alive(t, 100.0, here, lambda pid: 8)  # the pid reused
    elsewhere = ("other-boot", "pid:[1]")  # another machine: its last refresh counts
    assert policy.ticket_alive(t, 100.0 + policy.TICKET_TTL, elsewhere, lambda pid: None)
    assert not policy.ticket_alive(t, 101.0 + policy.TICKET_TTL, elsewhere, lambda pid: 7)


def test_a_valid_ticket_is_read_and_malformed_ones_are_refused_with_why() -> None:
    name = f"ticket-1001-{RUN}.json"
    good = ticket(RUN, 5.0, (0, 1), 2)
    parsed, why = policy.validate_ticket(good, 1001, name)
    assert why is None and parsed["needs"]["pools"] == [{"gpus": [0, 1], "count": 2}]
    cases = {
        "belongs to uid": (good, 1002, name),
        "not a ticket's name": (good, 1001, "ticket-x.json"),
        "run id differs": (ticket("other-run", 5.0), 1001, "ticket-1001-other.json"),
        "arrival": ({**good, "arrival": "soon"}, 1001, name),
        "needs.pools": ({**good, "needs": {"ports": [], "pools": [{"gpus": [0]}]}}, 1001, name),
        "needs.ports": ({**good, "needs": {"ports": [70000], "pools": []}}, 1001, name),
        "user": ({**good, "user": "../etc"}, 1001, name),
    }
    for expected, (data, owner, file_name) in cases.items():
        record, why = policy.validate_ticket(data, owner, file_name)
        assert record is None and expected in why, (expected, why)


def test_the_reason_names_the_holder_and_the_earlier_tickets() -> None:
    bob = Holder("bob", "bert", RUN, "laptop", 1.0e9, 1001)
    held = Clash("gpu-b", bob, (23456,), (0, 1))
    assert queue_reason([held]) == f"queued behind bob's job bert (run {RUN}) on gpu-b: " \
                                   "port 23456, GPUs 0,1"  # fmt: skip
    answer = [
        {
            "kind": "queue",
            "holders": [
                {
                    "user": "amy",
                    "uid": 1002,
                    "job": "gpt",
                    "run_id": "r2",
                    "since": 5.0,
                    "gpus": [0, 1],
                }
            ],
        }
    ]
    (queued,) = parse_clashes("gpu-a", answer)
    assert queued.queued and queued.gpus == (0, 1)
    assert queue_reason([queued]) == "queued behind amy's job gpt (run r2, queued earlier) on " \
                                     "gpu-a: GPUs 0,1"  # fmt: skip
    assert "waited for by amy's job gpt (run r2), queued since" in queued.describe()


# --- the host program: real tickets in a real lease directory ----------------------------------


# Arrivals the lease program takes for real: after 2000, not in the future (leasepolicy.moment),
# and not before the ticket's process started (a ticket whose process is seen here).


def gpu_worker(count: int) -> dict[str, Any]:
    return {"name": "w", "port": None, "range": [21000, 21099], "gpus": count, "pool": [0, 1]}


def queued(arrival: float, pid: int | None = None) -> dict[str, Any]:
    mine = controller_ticket(arrival)
    if pid is not None:  # another process of this machine (its start time)
        mine.update(pid=pid, starttime=leasedir.started_at(pid))
    return mine


def test_tickets_keep_the_order_and_a_withdrawn_or_dead_one_lets_the_next_go(
    tmp_path: Path,
) -> None:
    lease_dir = tmp_path / "leases"
    holder = acquire(lease_dir, "holder", gpu_worker(1))  # holds one GPU of the two
    assert holder["assigned"]["w"]["gpus"] == [0]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    T0 = time.time()  # noqa: N806 - after the sleeper started: its ticket arrives after that
    try:
        # The two-GPU run queues first (GPU 0 is held), then a one-GPU run: GPU 1 is free,
        # yet the one-GPU run waits behind the earlier ticket.
        big = acquire(lease_dir, "big", gpu_worker(2), ticket=queued(T0 + 10.0))
        assert big["queued"] and big["clashes"][0]["kind"] == "gpus"
        small = acquire(lease_dir, "small", gpu_worker(1), ticket=queued(T0 + 20.0, sleeper.pid))
        assert small["queued"] and small["clashes"][0]["kind"] == "queue"
        assert small["clashes"][0]["holders"][0]["run_id"] == "big"
        unqueued = acquire(lease_dir, "plain", gpu_worker(1))  # no ticket: behind them all
        assert [h["run_id"] for h in unqueued["clashes"][0]["holders"]] == ["big", "small"]
        shown = listing(lease_dir)["tickets"]
        assert [t["run_id"] for t in shown] == ["big", "small"]
        assert stat_mode(lease_dir / f"ticket-{os.getuid()}-big.json") == 0o644

        # A refreshed ticket keeps its first arrival.
        acquire(lease_dir, "big", gpu_worker(2), ticket=queued(T0 + 99.0))
        assert listing(lease_dir)["tickets"][0]["arrival"] == T0 + 10.0

        # The holder ends: the two-GPU run takes both; its start withdraws its ticket.
        ask({"verb": "release", "lease_dir": str(lease_dir), "run_id": "holder"})
        assert acquire(lease_dir, "big", gpu_worker(2), ticket=queued(T0 + 10.0))["assigned"]
        assert ask({"verb": "withdraw", "lease_dir": str(lease_dir), "run_id": "big"}) == [
            {"withdrawn": True}
        ]
        assert [t["run_id"] for t in listing(lease_dir)["tickets"]] == ["small"]
        ask({"verb": "release", "lease_dir": str(lease_dir), "run_id": "big"})

        # The small run's controller dies: its ticket expires and is removed; the plain run
        # goes.
        sleeper.kill()
        sleeper.wait()
        assert listing(lease_dir)["tickets"] == []
        assert not (lease_dir / f"ticket-{os.getuid()}-small.json").exists()
        assert acquire(lease_dir, "plain", gpu_worker(1))["assigned"]["w"]["gpus"] == [0]
    finally:
        sleeper.kill()
        for run in ("holder", "big", "plain"):
            ask({"verb": "release", "lease_dir": str(lease_dir), "run_id": run})


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_hostile_ticket_is_ignored_and_named(tmp_path: Path) -> None:
    lease_dir = tmp_path / "leases"
    lease_dir.mkdir(mode=0o1777)
    (lease_dir / "ticket-0-run.json").symlink_to("/etc/shadow")
    (lease_dir / f"ticket-{os.getuid()}-junk.json").write_text("{not json")
    answer = listing(lease_dir)
    reasons = {Path(i["file"]).name: i["reason"] for i in answer["ignored"]}
    assert answer["tickets"] == []
    assert "not a regular file" in reasons["ticket-0-run.json"]
    assert "not JSON" in reasons[f"ticket-{os.getuid()}-junk.json"]


# --- the engine's waiting over the fake backend -------------------------------------------------


def one_host(tmp_path: Path) -> Inventory:
    host = WorkerSlot("a", "10.0.0.1", 0, port_range=(20000, 20000), gpus=2, visible_gpus=(0, 1))
    return Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), (host,),
                     Job("demo", script="train.py", queue=True))  # fmt: skip


def test_a_queued_run_waits_as_pending_then_takes_and_leaves_nothing(tmp_path: Path) -> None:
    backend = FakeBackend()
    bob = Holder("bob", "bert", RUN, "laptop", time.time(), 1001)
    backend.held = {("a", "gpu", 1): bob}
    store = RunStore(tmp_path / "state")
    store.root.mkdir()
    seen: list[tuple[str, Any]] = []

    def on_wait(reason: str, since: float) -> None:
        seen.append((reason, pending(store)))
        if len(seen) == 2:
            backend.held = {}  # bob's run ended

    leased = wait_for_leases(one_host(tmp_path), "mine", backend, store, on_wait, poll=0)
    assert leased.inventory.hosts[0].leased_gpus == (0, 1)
    assert [r for r, _ in seen] == [f"queued behind bob's job bert (run {RUN}) on a: GPU 1"] * 2
    shown = seen[0][1]
    assert shown is not None and shown.run_id == "mine" and shown.reason == seen[0][0]
    assert pending(store) is None and not (store.root / "queued.json").exists()
    assert backend.lease_calls == [("queue", "mine")] * 3 + [("withdraw", "mine")]


def test_a_withdrawn_run_leaves_no_ticket_and_no_pending_entry(tmp_path: Path) -> None:
    backend = FakeBackend()
    backend.held = {("a", "gpu", 0): Holder("bob", "bert", RUN, "laptop", 1.0, 1001)}
    store = RunStore(tmp_path / "state")
    store.root.mkdir()

    def on_wait(reason: str, since: float) -> None:
        raise KeyboardInterrupt  # Ctrl-C while it waits

    with pytest.raises(KeyboardInterrupt):
        wait_for_leases(one_host(tmp_path), "mine", backend, store, on_wait, poll=0)
    assert pending(store) is None and backend.lease_calls[-1] == ("withdraw", "mine")

    def sigterm(reason: str, since: float) -> None:
        os.kill(os.getpid(), 15)  # what `down` sends the waiting process

    with pytest.raises(Withdrawn):
        wait_for_leases(one_host(tmp_path), "again", backend, store, sigterm, poll=0)
    assert pending(store) is None and backend.lease_calls[-1] == ("withdraw", "again")


def test_a_clash_without_the_queue_is_still_an_error(tmp_path: Path) -> None:
    backend = FakeBackend()
    backend.held = {("a", "gpu", 0): Holder("bob", "bert", RUN, "laptop", 1.0, 1001)}
    with pytest.raises(LeaseClash):
        backend.take_leases(one_host(tmp_path), "mine")


def test_a_target_that_lists_queued_is_told_once_with_the_reason(tmp_path: Path) -> None:
    from orchestrator.engine.observe.notify import RunEvents
    from orchestrator.model.records import RunRecord
    from tests.unit.test_notify_events import fake_inventory, received, recording

    store = RunStore(tmp_path / "state")
    inventory = fake_inventory(tmp_path, recording(tmp_path, ("queued",)))
    events = RunEvents(store, RunRecord("r1", inventory, time.time()), lambda message: None)
    events.queued("queued behind bob's job bert (run r0) on a: GPUs 0,1")
    events.queued("queued behind amy's job gpt (run r2) on a: GPU 0")  # told once per run
    events.close()
    (told,) = received(tmp_path)
    assert told["event"] == "queued" and told["run_id"] == "r1"
    assert told["root_cause"] == "queued behind bob's job bert (run r0) on a: GPUs 0,1"
    assert told["text"].startswith("orchestrate: job demo (run r1) is queued: queued behind bob")
