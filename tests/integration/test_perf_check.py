"""`check --perf` on namespace hosts: a tbf-shaped veth names its link, a host whose sessions run
under a CPU quota is named, and a healthy cluster is named in none of five checks.

The hosts share this machine (one boot_id), so the round measures them one after another; other
tests' load comes and goes meanwhile, which is what the healthy repeats guard against."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.inventories import write_inventory
from tests.cluster.netns import NamespaceCluster
from tests.cluster.pytest_support import SharedCluster
from tests.conftest import Cli

# quiet: it measures the hosts' compute and links, so it runs alone, after the lanes (test.sh).
pytestmark = [pytest.mark.netns, pytest.mark.quiet]

JOB = {"name": "demo", "script": "train.py"}
PERF_CHECKS = ("compute", "throughput")


@pytest.fixture(scope="module")
def cluster(namespace_hosts: SharedCluster) -> NamespaceCluster:
    return namespace_hosts.hosts(3)


@pytest.fixture
def inventory(cli: Cli, cluster: NamespaceCluster) -> Path:
    (cli.cwd / "train.py").write_text("print('trained')\n")
    return write_inventory(cli.cwd / "inv.yaml", cluster, JOB)


def perf_findings(cli: Cli) -> dict[tuple[str, str], dict[str, Any]]:
    result = cli("check", "--perf", "--json", "inv.yaml")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    return {(f["host"], f["check"]): f for f in found if f["check"] in PERF_CHECKS}


def warnings(found: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], str]:
    return {key: f["detail"] for key, f in found.items() if f["status"] != "ok"}


def test_a_healthy_cluster_is_never_named(cli: Cli, cluster: NamespaceCluster, inventory: Path):
    for attempt in range(5):
        found = perf_findings(cli)
        names = [h.name for h in cluster.hosts]
        assert set(found) == {(n, c) for n in names for c in PERF_CHECKS}
        assert warnings(found) == {}, (
            attempt,
            {k: (f["detail"], f["figures"]) for k, f in found.items()},
        )
        for name in names:
            figures = found[(name, "compute")]["figures"]
            assert figures["probe"] == "numpy" and figures["gflops"] > 0
        assert found[(names[0], "throughput")]["figures"]["to"] == names[1]


def test_a_shaped_link_is_named(cli: Cli, cluster: NamespaceCluster, inventory: Path):
    first, second, _ = cluster.hosts
    # The bridge side of the second host's veth: traffic towards it, so the link first -> second.
    shape = ["tc", "qdisc", "add", "dev", second.veth, "root", "tbf", "rate", "40mbit",
             "burst", "32kb", "latency", "100ms"]  # fmt: skip
    subprocess.run(shape, check=True)
    try:
        found = perf_findings(cli)
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", second.veth, "root"], check=True)
    assert set(warnings(found)) == {(first.name, "throughput")}, found
    detail = found[(first.name, "throughput")]["detail"]
    assert detail.startswith(f"to {second.name}: ") and "x the other links" in detail
    rate = found[(first.name, "throughput")]["figures"]["bytes_per_second"]
    # the tbf rate (5 MB/s), at most doubled by leaving out the ends' waits for a CPU
    assert rate < 40e6 / 8 * 2


def test_a_host_under_a_cpu_quota_is_named(cli: Cli, cluster: NamespaceCluster, inventory: Path):
    slow = cluster.hosts[2]
    with cluster.cpu_quota(slow, 0.2):  # a fifth of one core
        found = perf_findings(cli)
    named = warnings(found)
    assert {h for h, check in named if check == "compute"} == {slow.name}, found
    # A host held to a fifth of a core also sends and receives slowly: a link to or from it may
    # be named too (its sink and sender run in the same cgroup), never a link between the others.
    links = {(h, found[(h, c)]["figures"]["to"]) for h, c in named if c == "throughput"}
    assert all(slow.name in link for link in links), found
    detail = found[(slow.name, "compute")]["detail"]
    assert detail.startswith("matmul ") and detail.endswith("x the others")
    assert found[(slow.name, "compute")]["figures"]["ratio"] < 0.4
