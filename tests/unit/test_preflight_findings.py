"""Every preflight finding from scripted host answers, through run_preflight on a fake backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.backends.hosts.checks import run_preflight
from orchestrator.backends.hosts.firewall import host_rules
from orchestrator.machines.sshsettings import SshSettings
from orchestrator.model.findings import Status
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from tests.fakes.backend import FakeBackend

GOOD_DIR = {"path": "/w", "writable": True, "checked": "/w", "free_bytes": 50 << 30}


def inspection(**over: Any) -> dict[str, Any]:
    return {
        "python": "3.11.2",
        "packages": {"tensorflow": "2.21.0", "tf-orchestrate": __version__},
        "env": {},
        "directories": [GOOD_DIR, GOOD_DIR],
        "listener_pid": 4242,
        "port_error": None,
        "holder": None,
        **over,
    }


def cluster(tmp_path: Path, **job: Any) -> Inventory:
    hosts = tuple(WorkerSlot(n, f"10.9.0.{i + 1}", 20000, settings=SshSettings(ssh_port=2222))
                  for i, n in enumerate(("a", "b", "c")))  # fmt: skip
    return Inventory(str(tmp_path / "i.yaml"), str(tmp_path), hosts,
                     Job("demo", task="pkg.mod:task", steps=5, **job))  # fmt: skip


def backend_with(inspections: dict[str, dict[str, Any]], peers: dict[str, dict[str, Any]],
                 dead: dict[str, str] | None = None) -> FakeBackend:  # fmt: skip
    preflight = {
        name: {
            "inspect": inspections.get(name, inspection()),
            "connect": {"peers": peers.get(name, {}), "token_visible": None},
            "cleanup": {"listener_left": False},
        }
        for name in "abc"
    }
    return FakeBackend(answers=preflight, dead_hosts=dead or {})


def findings(report: Any) -> dict[tuple[str, str], tuple[Status, str]]:
    return {(f.host, f.check): (f.status, f.detail) for f in report.findings}


def all_ok_peers() -> dict[str, dict[str, Any]]:
    return {n: {p: {"status": "ok"} for p in "abc" if p != n} for n in "abc"}


def test_a_healthy_cluster_passes_every_check(tmp_path: Path) -> None:
    report = run_preflight(cluster(tmp_path), backend_with({}, all_ok_peers()))
    assert not report.blocking
    found = findings(report)
    for host in "abc":
        for check in ("ssh", "python", "tensorflow", "worker", "port", "reachable", "proxy"):
            assert found[(host, check)][0] is Status.OK, (host, check)


def test_each_problem_is_named_on_its_host(tmp_path: Path) -> None:
    peers = all_ok_peers()
    peers["a"]["c"] = {"status": "timeout"}  # a cannot reach c
    peers["b"]["c"] = {"status": "refused"}
    inspections = {
        "b": inspection(
            listener_pid=None, port_error="Address already in use",
            holder={"pid": 77, "command": "python train.py", "orchestrate_run_id": "r1",
                    "orchestrate_worker": "b"},
            env={"https_proxy": "http://proxy:3128"},
            packages={"tensorflow": "2.20.0", "tf-orchestrate": "0.0.1"},
        ),
        "c": inspection(directories=[GOOD_DIR, {**GOOD_DIR, "free_bytes": 1 << 20}]),
    }  # fmt: skip
    report = run_preflight(cluster(tmp_path), backend_with(inspections, peers))
    found = findings(report)
    assert found[("b", "port")][0] is Status.FAIL
    assert "held by worker b of run r1 (pid 77)" in found[("b", "port")][1]
    assert "timed out after 3 s" in found[("c", "reachable")][1]
    assert "from b: refused" in found[("c", "reachable")][1]
    assert found[("b", "proxy")][0] is Status.FAIL and "https_proxy" in found[("b", "proxy")][1]
    assert "mixes 2.20.0, 2.21.0" in found[("a", "tensorflow")][1]
    assert "differs from the controller's" in found[("b", "worker")][1]
    assert "only 0.0 GiB free" in found[("c", "checkpoints")][1]


def test_an_unreachable_host_fails_its_login_check_and_others_are_still_checked(
    tmp_path: Path,
) -> None:
    report = run_preflight(
        cluster(tmp_path), backend_with({}, all_ok_peers(), dead={"c": "connection refused"})
    )
    found = findings(report)
    assert found[("c", "ssh")] == (Status.FAIL, "connection refused")
    assert found[("a", "python")][0] is Status.OK


def test_no_proxy_exempts_the_peers(tmp_path: Path) -> None:
    env = {"https_proxy": "http://p:1", "no_proxy": "10.9.0.0/24"}
    report = run_preflight(cluster(tmp_path), backend_with({"a": inspection(env=env)},
                                                           all_ok_peers()))  # fmt: skip
    assert findings(report)[("a", "proxy")][0] is Status.OK


def test_firewall_rules_admit_only_the_cluster_and_the_controller(tmp_path: Path) -> None:
    (rules_a, *_rest) = host_rules(cluster(tmp_path), "iptables", controller="10.9.0.100")
    text = "\n".join(rules_a.commands)
    for source in ("10.9.0.1", "10.9.0.2", "10.9.0.3"):
        assert f"-s {source} --dport 20000 -j ACCEPT" in text
    assert "-s 10.9.0.100 --dport 2222 -j ACCEPT" in text  # the kind's login port
    assert "0.0.0.0/0" not in text
