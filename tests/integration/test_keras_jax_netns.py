"""Keras 3 on JAX across two machines (job.keras: jax, issue 57): namespace hosts with their own
sshd, address and port space (tests/cluster), the run driven over real SSH. The model.fit script
of test_keras_jax.py (tests/scripts/fit_keras3_jax.py, uploaded with its helper) trains on both,
one worker is SIGKILLed, the cluster restarts whole, resumes from BackupAndRestore and ends with
bit-identical weights on both hosts. Each process's JAX coordinator and gloo collectives talk
between the hosts' own addresses, not over one machine's loopback as the local test's do.

gloo tells its peers the address the host's own name resolves to. The namespace hosts share this
machine's name and /etc/hosts, where it is 127.0.0.1 (a Debian machine's is 127.0.1.1): as
measured, the workers then time out connecting to their own loopback. `check` says so; then
each host gets an /etc/hosts of its own (`ip netns exec`, which starts its sshd, mounts
/etc/netns/NAMESPACE/hosts there) naming it at its address, as a real machine's does.

In the netns lane, and marked tf for its CPU-bound worker processes. The hosts share this
machine's file system; their Python is the jax-only install (tests/jaxonly.py: JAX and Keras 3,
no TensorFlow), as a JAX user's hosts have it, not the controller's (which has no JAX)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.inventories import DEFAULT_PORT, write_inventory
from tests.cluster.netns import NamespaceCluster
from tests.cluster.pytest_support import SharedCluster
from tests.conftest import Cli, first_run_dir, progress_in, wait_for
from tests.jaxonly import jax_only_python
from tests.scripts import STEPPER

pytestmark = [pytest.mark.netns, pytest.mark.tf]

SCRIPTS = STEPPER.parent
JOB = "fitjax"
STEPS_PER_EPOCH = 8  # 256 examples, half each, 16 a batch
SAVE_EVERY = 4
# Created after the kill: the workers hold after their backup at step 12 until it exists, so a
# busy machine cannot let the run end, or pass its next backup, before the kill lands.
RELEASE = "release-after-the-kill"


@pytest.fixture(scope="module")
def cluster(namespace_hosts: SharedCluster) -> NamespaceCluster:
    return namespace_hosts.hosts(2)


@contextlib.contextmanager
def names_of_their_own(cluster: NamespaceCluster) -> Iterator[None]:
    """Inside, each host's name (this machine's) resolves to the host's own address there."""
    made = [Path("/etc/netns") / host.namespace for host in cluster.hosts]
    try:
        for host, directory in zip(cluster.hosts, made, strict=True):
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text(
                f"127.0.0.1 localhost\n{host.address} {socket.gethostname()}\n"
            )
            cluster.restart_sshd(host)  # its sessions get the file from now on
        yield
    finally:
        for host, directory in zip(cluster.hosts, made, strict=True):
            shutil.rmtree(directory, ignore_errors=True)
            cluster.restart_sshd(host)


def test_keras3_fit_on_jax_across_hosts_survives_a_killed_worker(
    cli: Cli, cluster: NamespaceCluster
) -> None:
    shutil.copyfile(SCRIPTS / "fit_keras3_jax.py", cli.cwd / "train.py")
    shutil.copyfile(SCRIPTS / "common.py", cli.cwd / "common.py")
    job = {"name": JOB, "script": "train.py", "files": ["common.py"], "keras": "jax",
           "max_restarts": 2, "restart_backoff": 0,
           "env": {"EPOCHS": 3, "SAVE_EVERY": SAVE_EVERY, "STEP_DELAY": 0.3,
                   # both hold after their step-12 backup until the kill (_train_and_kill)
                   "HOLD_FROM_STEP": STEPS_PER_EPOCH + SAVE_EVERY,
                   "HOLD_UNTIL": str(cli.cwd / RELEASE)}}  # fmt: skip
    write_inventory(cli.cwd / "inv.yaml", cluster, job, defaults={"python": jax_only_python()})
    first, second = cluster.hosts
    check = cli("check", "--json", "inv.yaml", timeout=120)
    assert check.returncode != 0, check.stdout
    gloo = [f for f in json.loads(check.stdout) if f["check"] == "gloo"]
    assert [(f["host"], f["status"]) for f in gloo] == [(first.name, "fail"), (second.name, "fail")]
    assert f"resolves to 127.0.0.1 on {second.name}" in gloo[1]["detail"], gloo
    with names_of_their_own(cluster):
        _train_and_kill(cli, cluster)


def _train_and_kill(cli: Cli, cluster: NamespaceCluster) -> None:
    first, second = cluster.hosts
    up = cli.popen("up", "inv.yaml")  # its checks pass: gloo's too
    try:
        # A backup inside the second epoch on both hosts: the restart resumes at epoch 2.
        backed_up = STEPS_PER_EPOCH + SAVE_EVERY

        def both_backed_up() -> bool:
            return all((progress_in(first_run_dir(h.workdir / JOB, h.name)).get("checkpoint_step")
                        or 0) >= backed_up for h in cluster.hosts)  # fmt: skip

        wait_for(both_backed_up, timeout=300, what="a backup in the second epoch on both hosts")
        victim = first_run_dir(second.workdir / JOB, second.name)
        assert victim is not None
        os.kill(int((victim / "worker.pid").read_text()), signal.SIGKILL)
        (cli.cwd / RELEASE).touch()
        _, err = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err
    assert f"job {JOB} succeeded" in err
    restarts = cli.record()["restarts"]
    assert [(r["worker"], r["kind"], r["attempt"]) for r in restarts] == [
        (second.name, "killed", 0)
    ], restarts
    done = {}
    for host in cluster.hosts:
        resumed = first_run_dir(host.workdir / JOB, host.name, attempt=1)
        assert resumed is not None
        done[host.name] = json.loads((resumed / "checksum.json").read_text())
        log = (resumed / "worker.log").read_text()
        # Resumed in the epoch of the backup at step 12: the second.
        first_epoch = re.search(r"Epoch (\d)/3", log)
        assert first_epoch is not None and first_epoch.group(1) == "2", log[-2000:]
    assert [d["process"] for d in done.values()] == [0, 1]
    assert len({d["sha256"] for d in done.values()}) == 1, f"the weights differ: {done}"
    assert {d["tf_config"] for d in done.values()} == {None}  # a JAX cluster: no TF_CONFIG
    addresses = f"{first.address}:{DEFAULT_PORT},{second.address}:{DEFAULT_PORT}"
    assert {d["addresses"] for d in done.values()} == {addresses}, done
