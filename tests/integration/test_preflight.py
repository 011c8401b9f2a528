"""`orchestrate check` and `firewall` on namespace hosts with real sshd and real iptables."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.inventories import DEFAULT_PORT, host_entries
from tests.cluster.inventories import write_inventory as cluster_inventory
from tests.cluster.netns import ClusterHost, NamespaceCluster
from tests.cluster.pytest_support import SharedCluster
from tests.conftest import Cli

pytestmark = pytest.mark.netns

CHECK_BOUND_S = 15  # docs/supervision.md: a check finishes within this, however many hosts block
JOB = {"name": "demo", "script": "train.py"}
HOLD = (  # a process that holds port 20000 for a minute, and says so once it listens
    "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 20000)); s.listen(); "
    "print('listening', flush=True); time.sleep(60)"
)


def holding(process: subprocess.Popen[str]) -> subprocess.Popen[str]:
    """`process` (HOLD, its stdout a pipe) once it listens: its own line, not a guessed time
    (a Python's start on a loaded machine can take longer than any)."""
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "listening", "the port holder did not start"
    return process


@pytest.fixture(scope="module")
def cluster(namespace_hosts: SharedCluster) -> NamespaceCluster:
    return namespace_hosts.hosts(3)


@pytest.fixture
def inventory(cli: Cli, cluster: NamespaceCluster) -> Path:
    (cli.cwd / "train.py").write_text("print('trained')\n")
    return cluster_inventory(cli.cwd / "inv.yaml", cluster, JOB)


def iptables(cluster: NamespaceCluster, host: ClusterHost, *rule: str) -> None:
    cluster.exec_in(host, ["iptables", *rule], check=True)


@pytest.fixture
def clean_firewalls(cluster: NamespaceCluster) -> Iterator[None]:
    yield
    for host in cluster.hosts:
        iptables(cluster, host, "-F", "INPUT")


def findings(cli: Cli, *args: str) -> tuple[int, list[dict[str, Any]], float]:
    started = time.monotonic()
    result = cli("check", "--json", *args, "inv.yaml")
    return result.returncode, json.loads(result.stdout), time.monotonic() - started


def failed(items: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    return {(f["host"], f["check"]): f["detail"] for f in items if f["status"] == "fail"}


def listeners(cluster: NamespaceCluster, host: ClusterHost) -> set[int]:
    out = cluster.exec_in(host, ["ss", "-Hltn"], capture_output=True, text=True, check=True)
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.stdout.splitlines()}


def test_healthy_cluster_passes_leaves_nothing_and_up_proceeds(
    cli: Cli, cluster: NamespaceCluster, inventory: Path
):
    code, items, _ = findings(cli)
    assert code == 0, failed(items)
    checks = {(f["host"], f["check"]) for f in items if f["status"] == "ok"}
    for name in ("host1", "host2", "host3"):
        for check in ("ssh", "python", "port", "reachable", "proxy", "workdir", "checkpoints"):
            assert (name, check) in checks
    reachable = next(f for f in items if f["host"] == "host1" and f["check"] == "reachable")
    assert reachable["detail"] == f"port {DEFAULT_PORT} reachable from host2, host3"
    for host in cluster.hosts:
        assert listeners(cluster, host) == {22}  # the temporary listeners are gone
    up = cli("up", "inv.yaml")
    assert up.returncode == 0 and "job demo succeeded" in up.stderr


def test_dropped_port_is_named_as_a_firewall_within_the_bound(
    cli: Cli, cluster: NamespaceCluster, inventory: Path, clean_firewalls: None
):
    iptables(
        cluster, cluster.hosts[2], "-A", "INPUT", "-p", "tcp", "--dport", "20000", "-j", "DROP"
    )
    code, items, elapsed = findings(cli)
    assert code == 5
    detail = failed(items)[("host3", "reachable")]
    assert detail.startswith("10.231.0.13:20000 cannot be reached")
    assert "from host1: timed out after 3 s, probably a firewall" in detail
    assert "from host2: timed out after 3 s, probably a firewall" in detail
    assert set(failed(items)) == {("host3", "reachable")}
    assert elapsed < CHECK_BOUND_S
    # Blocking every host costs no more time: the probes run in parallel.
    for host in cluster.hosts[:2]:
        iptables(cluster, host, "-A", "INPUT", "-p", "tcp", "--dport", "20000", "-j", "DROP")
    code, items, elapsed = findings(cli)
    assert {check for _, check in failed(items)} == {"reachable"} and len(failed(items)) == 3
    assert elapsed < CHECK_BOUND_S
    up = cli("up", "inv.yaml")
    assert up.returncode == 5 and "preflight found 3 problem(s)" in up.stderr
    # Nothing was started (the state directory holds only the check's findings).
    assert not (cli.cwd / ".orchestrate" / "runs").exists()


def test_rejected_port_is_named_as_refused(
    cli: Cli, cluster: NamespaceCluster, inventory: Path, clean_firewalls: None
):
    iptables(cluster, cluster.hosts[1], "-A", "INPUT", "-p", "tcp", "--dport", "20000",
             "-j", "REJECT", "--reject-with", "tcp-reset")  # fmt: skip
    code, items, _ = findings(cli)
    assert code == 5
    detail = failed(items)[("host2", "reachable")]
    assert "from host1: refused: nothing listening, or a firewall REJECT rule" in detail


def test_busy_port_names_its_holder_and_a_leftover_worker(
    cli: Cli, cluster: NamespaceCluster, inventory: Path
):
    plain = cluster.popen_in(cluster.hosts[0], [sys.executable, "-c", HOLD],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    leftover = cluster.popen_in(
        cluster.hosts[1],
        [sys.executable, "-c", HOLD],
        env={"ORCHESTRATE_RUN_ID": "20261129-000000-dead", "ORCHESTRATE_WORKER": "host2"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        holding(plain)
        holding(leftover)
        code, items, _ = findings(cli)
    finally:
        for process in (plain, leftover):
            process.kill()
            process.wait()
    assert code == 5
    problems = failed(items)
    assert problems[("host1", "port")].startswith(f"port 20000 is busy: pid {plain.pid} (")
    assert "time.sleep(60)" in problems[("host1", "port")]
    assert problems[("host2", "port")] == (
        f"port 20000 is held by worker host2 of run 20261129-000000-dead (pid {leftover.pid})"
    )
    hint = next(f["hint"] for f in items if f["host"] == "host2" and f["check"] == "port")
    assert "orchestrate down --run 20261129-000000-dead" in hint


def test_dead_sshd_silent_address_and_wrong_key_are_per_host(
    cli: Cli, cluster: NamespaceCluster, tmp_path: Path
):
    (cli.cwd / "train.py").write_text("")
    hosts = [*host_entries(cluster), {"name": "ghost", "address": "10.231.0.99"}]
    cluster_inventory(cli.cwd / "inv.yaml", cluster, JOB, hosts=hosts)
    cluster.stop_sshd(cluster.hosts[1])
    try:
        code, items, elapsed = findings(cli)
    finally:
        cluster.start_sshd(cluster.hosts[1])
    assert code == 5 and elapsed < CHECK_BOUND_S
    problems = failed(items)
    assert problems[("host2", "ssh")] == "connection refused by root@10.231.0.12:22"
    assert problems[("ghost", "ssh")] == "no answer from root@10.231.0.99:22 within 3 s"
    # The reachable hosts were still checked against each other.
    ok = {(f["host"], f["check"]) for f in items if f["status"] == "ok"}
    assert ("host1", "reachable") in ok and ("host3", "port") in ok

    wrong_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)],
                   check=True)  # fmt: skip
    overrides = {"host3": {"ssh_key": str(wrong_key)}}
    cluster_inventory(cli.cwd / "inv.yaml", cluster, JOB, hosts=host_entries(cluster, **overrides))
    code, items, _ = findings(cli)
    assert failed(items)[("host3", "ssh")].startswith("authentication refused for root@10.231.0.13")


def test_localhost_among_remote_hosts_is_rejected_before_connecting(
    cli: Cli, cluster: NamespaceCluster
):
    (cli.cwd / "train.py").write_text("")
    hosts = [*host_entries(cluster)[:2], {"name": "me", "address": "localhost"}]
    cluster_inventory(cli.cwd / "inv.yaml", cluster, JOB, hosts=hosts)
    logs = {h.name: h.sshd_log_path.read_text() for h in cluster.hosts}
    code, items, _ = findings(cli)
    assert code == 5
    assert [(f["host"], f["check"]) for f in items] == [("me", "address")]
    assert "loopback address but other hosts are remote" in items[0]["detail"]
    assert {h.name: h.sshd_log_path.read_text() for h in cluster.hosts} == logs  # no login


def test_firewall_rules_reopen_a_default_drop_cluster(
    cli: Cli, cluster: NamespaceCluster, inventory: Path, clean_firewalls: None
):
    for host in cluster.hosts:
        iptables(cluster, host, "-A", "INPUT", "-p", "tcp", "--dport", "20000", "-j", "DROP")
    assert findings(cli)[0] == 5
    script = cli("firewall", "--format", "iptables", "inv.yaml", check=True).stdout
    assert "unauthenticated" in script
    blocks = script.split("## ")[1:]
    assert [block.split()[0] for block in blocks] == ["host1", "host2", "host3"]
    for host, block in zip(cluster.hosts, blocks, strict=True):
        commands = [line for line in block.splitlines()[1:] if line and not line.startswith("#")]
        assert "iptables -I INPUT 1 -p tcp -s 10.231.0.1 --dport 22 -j ACCEPT" in commands
        for command in commands:
            cluster.exec_in(host, command.split(), check=True)
    code, items, _ = findings(cli)
    assert code == 0, failed(items)
    # Only the cluster's addresses were let in: the controller's bridge address is still dropped.
    listener = cluster.popen_in(cluster.hosts[0], [sys.executable, "-c", HOLD],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        holding(listener)
        dial = "import socket; socket.create_connection(('10.231.0.11', 20000), timeout=2)"
        cluster.exec_in(cluster.hosts[1], [sys.executable, "-c", dial], check=True)
        with pytest.raises(TimeoutError):
            socket.create_connection(("10.231.0.11", 20000), timeout=1)
    finally:
        listener.kill()
        listener.wait()


def test_an_accept_policy_exposes_the_port_until_the_firewall_rules_drop_the_rest(
    cli: Cli, cluster: NamespaceCluster, inventory: Path, clean_firewalls: None
):
    # No rule and policy ACCEPT, as on most machines: this machine (10.231.0.1, no cluster
    # member) reaches every TensorFlow port, and check says so without blocking.
    code, items, _ = findings(cli)
    exposed = {f["host"]: f for f in items if f["check"] == "exposed"}
    assert code == 0 and set(exposed) == {"host1", "host2", "host3"}
    assert all(f["status"] == "warn" for f in exposed.values())
    assert "accepts connections from this machine (10.231.0.1)" in exposed["host1"]["detail"]
    assert "orchestrate firewall" in exposed["host1"]["hint"]
    script = cli("firewall", "inv.yaml", check=True).stdout
    for host, block in zip(cluster.hosts, script.split("## ")[1:], strict=True):
        commands = [line for line in block.splitlines()[1:] if line and not line.startswith("#")]
        assert commands[3] == "iptables -I INPUT 4 -p tcp --dport 20000 -j DROP"  # after 3 accepts
        for command in commands:
            cluster.exec_in(host, command.split(), check=True)
    code, items, _ = findings(cli)
    assert code == 0, failed(items)
    statuses = {(f["host"], f["check"]): f["status"] for f in items}
    assert all(statuses[(h.name, "exposed")] == "ok" for h in cluster.hosts)
    assert all(statuses[(h.name, "reachable")] == "ok" for h in cluster.hosts)


def test_other_formats_name_every_peer(cli: Cli, cluster: NamespaceCluster, inventory: Path):
    for fmt, needle in (
        ("ufw", "ufw allow proto tcp from 10.231.0.12 to any port 20000"),
        ("ufw", "ufw deny proto tcp to any port 20000"),
        ("nftables", "nft add rule inet filter input tcp dport 20000 drop"),
        ("firewalld", 'priority="32767" port port="20000" protocol="tcp" drop'),
        (
            "nftables",
            "nft insert rule inet filter input ip saddr 10.231.0.13 tcp dport 20000 accept",
        ),
        ("firewalld", 'source address="10.231.0.11" port port="20000" protocol="tcp" accept'),
    ):
        assert needle in cli("firewall", "--format", fmt, "inv.yaml", check=True).stdout
