"""The supervisor's look at its run's leases (issue 54), pure: what a dead keeper let go, and
taking it back one worker at a time, pinned to what the workers use."""

from __future__ import annotations

from typing import Any

from orchestrator.engine.supervision.leasewatch import Missing, missing, pinned, reclaim
from orchestrator.errors import LeaseClash
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.leases import Holder, Lease, LeaseListing, by_run

RUN = "r1"
ACTIVE = {"a", "b", "c"}  # the workers that have not ended


def host(name: str, port: int, gpus: tuple[int, ...] | None) -> WorkerSlot:
    return WorkerSlot(
        name,
        "localhost",
        port,
        port_range=(port, port + 9),
        gpus=len(gpus or ()) or None,
        visible_gpus=(0, 1, 2, 3),
        leased_gpus=gpus,
    )


INVENTORY = Inventory(
    "inv.yaml",
    "/tmp",
    (host("a", 21000, (1,)), host("b", 21001, (2, 3)), WorkerSlot("c", "localhost", 21002)),
    Job("demo"),
)


def listing(*leases: tuple[str, str, tuple[int, ...], tuple[int, ...]], **failed: str) -> Any:
    found = [Lease(machine, Holder("me", "demo", run, "here", 1.0, 1000), ports, gpus)
             for machine, run, ports, gpus in leases]  # fmt: skip
    return LeaseListing(by_run(found), (), failed)


def test_what_no_keeper_of_the_run_holds_is_missing_and_an_unanswering_host_is_not() -> None:
    whole = listing(("a+b", RUN, (21000, 21001), (1, 2, 3)))
    assert missing(INVENTORY, RUN, ACTIVE, whole) == ()
    assert missing(INVENTORY, RUN, ACTIVE, listing()) == (
        Missing("a", (21000,), (1,)), Missing("b", (21001,), (2, 3)))  # fmt: skip
    other_run = listing(("a+b", "r2", (21000, 21001), (1, 2, 3)))  # another run holds them
    assert len(missing(INVENTORY, RUN, ACTIVE, other_run)) == 2
    partly = listing(("a+b", RUN, (21000, 21001), (1, 2)))
    assert missing(INVENTORY, RUN, ACTIVE, partly) == (Missing("b", (), (3,)),)
    assert missing(INVENTORY, RUN, ACTIVE, listing(**{"a+b": "no answer"})) == ()  # unknown
    ended = missing(INVENTORY, RUN, {"b"}, listing())  # a's worker ended: its keeper lets go
    assert ended == (Missing("b", (21001,), (2, 3)),)
    assert Missing("b", (21001,), (2, 3)).describe() == "b: port 21001 and GPUs 2,3"


def test_a_lost_lease_is_taken_again_pinned_one_worker_at_a_time_or_said_lost() -> None:
    asked: list[tuple[WorkerSlot, ...]] = []

    def take(inventory: Inventory, run_id: str) -> None:
        asked.append(inventory.hosts)
        if inventory.hosts[0].name == "b":
            raise LeaseClash("GPU 3 of b is held by amy's job gpt", [])

    gone = (Missing("a", (21000,), (1,)), Missing("b", (), (3,)))
    found = reclaim(gone, INVENTORY, RUN, take)
    assert [[h.name for h in hosts] for hosts in asked] == [["a"], ["b"]]
    assert asked[0][0] == pinned(INVENTORY.hosts[0])
    assert asked[0][0].port_range is None and asked[0][0].visible_gpus == (1,)
    assert found.reclaimed == ("a: port 21000 and GPU 1: its keeper had died; leased again",)
    assert found.lost == (
        "b: GPU 3: its keeper died and it could not be leased again (GPU 3 of b is held by "
        "amy's job gpt); another job may use it now",
    )
