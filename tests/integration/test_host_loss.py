"""Losing the chief's whole host mid-run, on namespace hosts: the supervisor had mirrored the
chief's checkpoints to the controller, a spare host takes the lost one's place, and training
resumes from at most one checkpoint interval back."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from tests.cluster.inventories import host_entries
from tests.cluster.inventories import write_inventory as cluster_inventory
from tests.cluster.netns import ClusterError, NamespaceCluster
from tests.cluster.pytest_support import SharedCluster
from tests.conftest import Cli, wait_for

pytestmark = [pytest.mark.netns, pytest.mark.tf]


@pytest.fixture(scope="module")
def cluster(namespace_hosts: SharedCluster) -> NamespaceCluster:
    return namespace_hosts.hosts(3)


def test_lost_chief_host_is_replaced_by_a_spare_from_the_mirrored_checkpoint(
    cli: Cli, cluster: NamespaceCluster
) -> None:
    host1, host2, host3 = host_entries(cluster)
    job = {
        "name": "shapes",
        "task": "worker.examples.shapes:task",
        "steps": 1500,
        "checkpoint_every": 50,
        "log_every": 10,
        # Only a safety net here (the lost host is found by its refused connection); a
        # restarted worker's TensorFlow import and first batch (over 20 s on a busy CI
        # machine) have start_timeout, 300 s by default.
        "stall_timeout": 60,
        "restart_backoff": 1,
        "env": {"TF_CPP_MIN_LOG_LEVEL": "2"},
    }
    inventory = cluster_inventory(cli.cwd / "inv.yaml", cluster, job, hosts=[host1, host2])
    inventory.write_text(inventory.read_text() + f"spares:\n  - {json.dumps(host3)}\n")
    lost = cluster.hosts[0]
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        status = cli.status_when(lambda s: (s["workers"][0]["checkpoint_step"] or 0) >= 100, 180)
        mirror = cli.cwd / ".orchestrate" / "checkpoints" / status["run_id"] / "latest"
        wait_for(mirror.exists, timeout=30, what="this machine's copy of the checkpoint")
        mirrored = int(mirror.read_text().rsplit("-", 1)[1])
        # The chief's host dies: its sshd and every process in it.
        cluster.stop_sshd(lost, kill_sessions=True)
        for pid in cluster.pids_in(lost):
            os.kill(pid, signal.SIGKILL)
        out, err = up.communicate(timeout=300)
    finally:
        up.kill()
        with contextlib.suppress(ClusterError):  # already running if the test failed early
            cluster.start_sshd(lost)
    assert up.returncode == 0, out + err
    assert "host1 does not answer; spare host3 takes its place" in out
    assert "(from this machine's copy)" in out
    final = cli.status()
    assert [(w["name"], w["step"]) for w in final["workers"]] == [("host3", 1500), ("host2", 1500)]
    logs = cli("tail", "-n", "400", check=True).stdout
    restored = [
        int(line.split("restored checkpoint at step ")[1].split()[0])
        for line in logs.splitlines()
        if "restored checkpoint at step" in line
    ]
    # Both workers resumed from the mirrored checkpoint or a later one: nothing before it lost.
    assert len(restored) == 2 and min(restored) >= mirrored
