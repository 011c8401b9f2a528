"""`check --perf`: who is slow (pure), the ring's links, the rounds' schedule, and the round itself
over scripted hostprobe sessions (one machine's hosts never measured at once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.hosts.checks import run_preflight
from orchestrator.backends.hosts.perf import (
    LINK_BURSTS,
    LINK_RECHECKS,
    compute_findings,
    link_findings,
    measure_links,
    rate_text,
    ring_links,
    schedule,
    slow_links,
    slow_ones,
)
from orchestrator.backends.registry import load_inventory
from orchestrator.errors import InventoryError
from orchestrator.machines.runner import LineSession
from orchestrator.model.answers import ComputeProbe, Transfer
from orchestrator.model.findings import Status
from orchestrator.model.inventory import WorkerSlot
from tests.fakes.backend import healthy, scripted_session
from tests.unit.test_preflight_findings import cluster


def test_slow_ones_compares_each_with_the_median_of_the_others() -> None:
    assert slow_ones({"a": 100.0, "b": 98.0, "c": 35.0}, 0.7) == {"c": pytest.approx(35 / 99)}
    assert slow_ones({"a": 100.0, "b": 72.0}, 0.7) == {}  # 0.72x: not below
    assert slow_ones({"a": 100.0, "b": 50.0}, 0.7) == {"b": 0.5}  # two hosts: the other one
    assert slow_ones({"a": 100.0}, 0.7) == {}  # nothing to compare with
    assert slow_ones({}, 0.5) == {}


def test_the_ring_is_each_host_to_the_next_and_back_to_the_first() -> None:
    assert ring_links(["a"]) == []
    assert ring_links(["a", "b"]) == [("a", "b"), ("b", "a")]
    assert ring_links(["a", "b", "c"]) == [("a", "b"), ("b", "c"), ("c", "a")]


def test_hosts_of_one_machine_are_never_in_one_round() -> None:
    one_machine = {"a": "m", "b": "m", "c": "m"}
    assert schedule(["a", "b", "c"], lambda n: [n], one_machine) == [["a"], ["b"], ["c"]]
    machines = {"a": "m1", "b": "m2", "c": "m3"}
    assert schedule(["a", "b", "c"], lambda n: [n], machines) == [["a", "b", "c"]]
    mixed = {"a": "m1", "b": "m1", "c": "m2", "d": "m3"}
    assert schedule(["a", "b", "c", "d"], lambda n: [n], mixed) == [["a", "c", "d"], ["b"]]


def test_ring_links_run_at_once_unless_they_share_a_machine_through_two_hosts() -> None:
    links = ring_links(["a", "b", "c"])
    # a host sends on one link while it receives on another: one round on three machines
    assert schedule(links, list, {"a": "m1", "b": "m2", "c": "m3"}) == [links]
    # on one machine every pair of links involves two of its hosts: one link at a time
    assert schedule(links, list, dict.fromkeys("abc", "m")) == [[link] for link in links]


def test_a_slow_host_is_named_with_its_figure_and_ratio() -> None:
    probes = {
        "gpu-a": ComputeProbe("numpy", "cpu", 118.0),
        "gpu-b": ComputeProbe("numpy", "cpu", 117.0),
        "gpu-c": ComputeProbe("numpy", "cpu", 41.0),
        "gpu-d": ComputeProbe(None, "cpu", None, "NumPy is not installed"),
    }
    found = {f.host: f for f in compute_findings(probes)}
    assert found["gpu-c"].status is Status.WARN
    assert f"gpu-c: {found['gpu-c'].detail}" == "gpu-c: matmul 41 GFLOP/s, 0.35x the others"
    assert found["gpu-c"].figures == {"gflops": 41.0, "ratio": 0.35, "probe": "numpy",
                                      "device": "cpu", "cpu_limit": None}  # fmt: skip
    assert found["gpu-a"].status is Status.OK
    assert found["gpu-a"].detail == "numpy matmul 118 GFLOP/s (cpu), 1.49x the others"
    assert found["gpu-d"].status is Status.OK
    assert found["gpu-d"].detail == "not measured: NumPy is not installed"
    assert found["gpu-d"].to_json()["figures"]["gflops"] is None


def test_gpu_hosts_are_compared_with_gpu_hosts_only() -> None:
    probes = {
        "g1": ComputeProbe("tensorflow", "gpu", 50_000.0),
        "g2": ComputeProbe("tensorflow", "gpu", 48_000.0),
        "c1": ComputeProbe("numpy", "cpu", 100.0),  # a host whose TensorFlow sees no GPU
    }
    assert all(f.status is Status.OK for f in compute_findings(probes))
    probes["g2"] = ComputeProbe("tensorflow", "gpu", 20_000.0)
    found = {f.host: f for f in compute_findings(probes)}
    assert found["g2"].status is Status.WARN
    assert found["c1"].detail == "numpy matmul 100 GFLOP/s (cpu)"  # alone in its group


def test_a_slow_link_is_named_on_its_sender_and_a_failed_one_is_not_measured() -> None:
    transfers = {
        ("a", "b"): Transfer(True, 1.1e9, 32 << 20, 0.03),
        ("b", "c"): Transfer(True, 2.5e6, 375_000, 0.15),
        ("c", "d"): Transfer(True, 0.9e9, 32 << 20, 0.04),
        ("d", "a"): Transfer(False, None, 0, None, "Connection refused"),
    }
    found = {f.host: f for f in link_findings(transfers, {})}
    assert found["b"].status is Status.WARN
    assert found["b"].detail == "to c: 2.5 MB/s, 0.00x the other links"
    assert found["b"].figures is not None and found["b"].figures["to"] == "c"
    assert found["a"].status is Status.OK and found["a"].detail.startswith("to b: 1.1 GB/s")
    assert found["d"].status is Status.WARN
    assert found["d"].detail == "to a: not measured (Connection refused)"


def test_rates_read_as_people_read_links() -> None:
    assert rate_text(2.5e6) == "2.5 MB/s"
    assert rate_text(940e6) == "940 MB/s"
    assert rate_text(5.24e9) == "5.2 GB/s"


class Machine:
    """Scripted hostprobes of one cluster that record how many of one machine's hosts were
    being measured at once."""

    def __init__(self, boot_ids: Mapping[str, str], gflops: Mapping[str, float],
                 rates: Mapping[str, float]) -> None:  # fmt: skip
        self.boot_ids, self.gflops, self.rates = boot_ids, gflops, rates
        self.lock = threading.Lock()
        self.active: list[list[str]] = []  # the hosts of each measurement under way
        self.clashes: list[tuple[list[str], list[str]]] = []  # two hosts of one machine at once
        self.most_at_once = 0
        self.verbs: list[str] = []

    def measuring(self, hosts: list[str]) -> None:
        with self.lock:
            for other in self.active:
                if any(x != y and self.boot_ids[x] == self.boot_ids[y]
                       for x in hosts for y in other):  # fmt: skip
                    self.clashes.append((hosts, other))
            self.active.append(hosts)
            self.most_at_once = max(self.most_at_once, len(self.active))
        time.sleep(0.02)
        with self.lock:
            self.active.remove(hosts)

    def answer(self, host: str, request: Mapping[str, Any]) -> Mapping[str, Any]:
        verb = request["verb"]
        self.verbs.append(verb)
        if verb == "inspect":
            return {**healthy(request), "boot_id": self.boots(host)}
        if verb == "compute":
            if "window" in request:
                self.measuring([host])
                return {"probe": "numpy", "device": "cpu", "gflops": self.gflops[host]}
            return {"probe": "numpy", "device": "cpu"} if "start" in request else {}
        if verb == "sink":
            return {"port": 40000}
        if verb == "send":
            target = "abc"[int(request["address"].rsplit(".", 1)[1]) - 1]  # cluster()'s hosts
            self.measuring([host, target])
            return {"status": "ok", "sent": 1 << 20, "bytes": 1 << 20, "seconds": 0.01,
                    "rate": self.rates[host]}  # fmt: skip
        return healthy(request)

    def boots(self, host: str) -> str:
        return self.boot_ids[host]

    def preflight_session(self, host: WorkerSlot) -> LineSession:
        return scripted_session(host.name, lambda request: self.answer(host.name, request))


def test_the_round_measures_one_machines_hosts_in_turn_and_names_the_slow_ones(
    tmp_path: Path,
) -> None:
    inventory = cluster(tmp_path)  # a, b, c at 10.9.0.1, .2, .3
    machine = Machine(
        boot_ids={"a": "m1", "b": "m1", "c": "m2"},
        gflops={"a": 100.0, "b": 30.0, "c": 98.0},
        rates={"a": 1e9, "b": 1.1e9, "c": 2e7},  # c -> a is the slow link
    )
    report = run_preflight(inventory, machine, perf=True)
    found = {(f.host, f.check): f for f in report.findings}
    assert found[("b", "compute")].status is Status.WARN
    assert found[("b", "compute")].detail == "matmul 30 GFLOP/s, 0.30x the others"
    assert found[("c", "throughput")].status is Status.WARN
    assert found[("c", "throughput")].detail.startswith("to a: 20 MB/s")
    assert {found[(h, "compute")].status for h in "ac"} == {Status.OK}
    assert machine.clashes == []  # a and b (one machine) took turns ...
    assert machine.most_at_once == 2  # ... while the other machine was measured beside them
    assert not report.blocking  # slow is a warning: `up` goes on


def test_without_perf_nothing_is_measured(tmp_path: Path) -> None:
    machine = Machine(dict.fromkeys("abc", "m"), dict.fromkeys("abc", 1.0),
                      dict.fromkeys("abc", 1.0))  # fmt: skip
    report = run_preflight(cluster(tmp_path), machine)
    assert not {"compute", "sink", "send"} & set(machine.verbs)
    assert not {f.check for f in report.findings} & {"compute", "throughput"}


def inventory_text(extra: str) -> str:
    host = "{name: a, address: 10.0.0.1, port: 2000}"
    return f"hosts:\n  - {host}\njob: {{name: j, script: t.py}}\n{extra}"


def test_preflight_perf_is_an_inventory_key_off_by_default(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    path = tmp_path / "inv.yaml"
    path.write_text(inventory_text(""))
    assert load_inventory(path).perf_check is False
    path.write_text(inventory_text("preflight: {perf: true}\n"))
    assert load_inventory(path).perf_check is True
    path.write_text(inventory_text("preflight: {perf: sometimes, speed: 1}\n"))
    with pytest.raises(InventoryError) as raised:
        load_inventory(path)
    text = str(raised.value) + " ".join(str(p) for p in raised.value.problems)
    assert "preflight.perf" in text and "preflight.speed" in text


def _sender(slow_bursts: Mapping[tuple[str, str], int]) -> tuple[Any, list[tuple[str, str]]]:
    """A send whose link reads 2 % of the others for its first `slow_bursts` bursts (a sender
    that waited for a CPU on a busy machine), then as fast as they are; the links it sent on."""
    sent: list[tuple[str, str]] = []
    lock = threading.Lock()

    def send(link: tuple[str, str]) -> Transfer:
        with lock:
            sent.append(link)
            slow = sent.count(link) <= slow_bursts.get(link, 0)
        return Transfer(True, 2e7 if slow else 1e9, 1 << 20, 0.01)

    return send, sent


RING = [("a", "b"), ("b", "c"), ("c", "a")]
MACHINES = {"a": "m1", "b": "m2", "c": "m3"}


def test_a_link_slow_for_one_pass_is_measured_again_and_not_named() -> None:
    send, sent = _sender({("c", "a"): LINK_BURSTS})  # every burst of the first pass
    best = measure_links(RING, send, MACHINES)
    assert {link: t.rate for link, t in best.items()} == dict.fromkeys(RING, 1e9)
    assert len(sent) == 2 * LINK_BURSTS * len(RING)  # one more pass, for every link
    assert [f for f in link_findings(best, MACHINES) if f.status is not Status.OK] == []


def test_a_link_that_stays_slow_is_named_after_its_rechecks_and_a_healthy_ring_has_none() -> None:
    send, sent = _sender({("c", "a"): 10**6})  # shaped: slow however often it is measured
    best = measure_links(RING, send, MACHINES)
    assert len(sent) == (1 + LINK_RECHECKS) * LINK_BURSTS * len(RING)
    (warned,) = [f for f in link_findings(best, MACHINES) if f.status is Status.WARN]
    assert (warned.host, warned.detail) == ("c", "to a: 20 MB/s, 0.02x the other links")
    send, sent = _sender({})
    measure_links(RING, send, MACHINES)
    assert len(sent) == LINK_BURSTS * len(RING)  # nothing slow: one pass


def test_a_link_between_hosts_of_one_machine_is_named_only_far_below_the_others() -> None:
    rates = {("a", "b"): 1.5e9, ("b", "c"): 3.5e9, ("c", "a"): 3.9e9}  # CI's healthy veth, 0.39x
    one_machine = dict.fromkeys("abc", "m1")
    assert slow_links(rates, one_machine) == {}
    assert set(slow_links(rates, MACHINES)) == {("a", "b")}  # across machines: 0.5x
    shaped = {**rates, ("a", "b"): 5e6}
    assert set(slow_links(shaped, one_machine)) == {("a", "b")}
    # a link from a host of one machine to a host of another is a network link
    assert set(slow_links(rates, {"a": "m1", "b": "m2", "c": "m2"})) == {("a", "b")}
