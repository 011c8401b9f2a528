"""~/.ssh/config aliases with ProxyJump: training hosts behind a bastion, on a bridge inside
the bastion's own namespace, which the controller cannot reach but through the bastion
(tests/cluster/bastion.py). Real sshd on all three, Fabric's jump for commands, rsync's
OpenSSH with the translated ProxyCommand for sync."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.bastion import BastionCluster, remove_leftovers
from tests.cluster.pytest_support import NETNS_UNAVAILABLE
from tests.conftest import Cli, clean_env

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def bastion(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BastionCluster]:
    if NETNS_UNAVAILABLE is not None:
        pytest.skip(NETNS_UNAVAILABLE)
    remove_leftovers()
    cluster = BastionCluster(2, base_dir=tmp_path_factory.mktemp("bastion"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def inventory(cli: Cli, cluster: BastionCluster, addresses: list[str], **top: Any) -> Path:
    """Hosts named by their ssh config alias only: HostName, User, IdentityFile, known hosts
    and ProxyJump all come from the ssh config file the inventory points to."""
    (cli.cwd / "code").mkdir(exist_ok=True)
    (cli.cwd / "code" / "train.py").write_text(
        "import os\nprint('tf_config', os.environ['TF_CONFIG'], flush=True)\n"
    )
    defaults = {"ssh_config": str(cluster.ssh_config_path), "python": sys.executable,
                "port": 20000, "ssh_connect_timeout": 3}  # fmt: skip
    hosts = [{"name": f"w{i}", "address": address,
              "workdir": str(cluster.base_dir / f"w{i}-work")}
             for i, address in enumerate(addresses)]  # fmt: skip
    document = {"defaults": defaults, "hosts": hosts, **top,
                "job": {"name": "behind", "script": "code/train.py"}}  # fmt: skip
    path = cli.cwd / "inv.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML
    return path


def test_check_and_up_work_through_the_bastion(cli: Cli, bastion: BastionCluster):
    with pytest.raises(OSError):  # the controller has no way to the training hosts itself
        socket.create_connection((bastion.trainers[0].address, 22), timeout=2)
    inventory(
        cli, bastion, ["train1", "train2"], sync="code", setup=["echo set up on $(hostname -I)"]
    )
    shown = [
        json.loads(line)
        for line in cli("hosts", "--json", "inv.yaml", check=True).stdout.splitlines()
    ]
    assert [(r["address"], r["ssh_alias"], r["ssh_user"], r["jump"]) for r in shown] == [
        ("10.233.2.11", "train1", "root", "bastion"),
        ("10.233.2.12", "train2", "root", "bastion"),
    ]

    check = cli("check", "inv.yaml")
    assert check.returncode == 0, check.stdout + check.stderr
    up = cli("up", "inv.yaml")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "w0 | set up on 10.233.2.11" in up.stderr and "w1 | set up on 10.233.2.12" in up.stderr
    assert "file(s) changed" in up.stderr  # rsync went through the jump host too
    logs = cli("tail", "-n", "5", check=True).stdout
    assert '"worker": ["10.233.2.11:20000", "10.233.2.12:20000"]' in logs  # HostNames, not aliases
    assert (bastion.base_dir / "w1-work" / "behind" / "code" / "train.py").exists()
    status = cli.status()
    assert [w["state"] for w in status["workers"]] == ["succeeded", "succeeded"]


def without_dns(cli: Cli, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with /etc/resolv.conf replaced (in a mount namespace of its own) by one that
    names only 127.0.0.1: a name that is no ssh config alias must not become a DNS query to
    this machine's real resolver."""
    resolv = cli.cwd / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:1\n")
    wrapper = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", wrapper, str(resolv),
         sys.executable, "-m", "orchestrator", *args],
        cwd=cli.cwd, env=clean_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_wrong_alias_is_reported_for_its_host(cli: Cli, bastion: BastionCluster):
    inventory(cli, bastion, ["train1", "trian2"])
    check = without_dns(cli, "check", "--json", "inv.yaml")
    assert check.returncode == 5, check.stderr
    ssh = {f["host"]: f for f in json.loads(check.stdout) if f["check"] == "ssh"}
    assert ssh["w0"]["status"] == "ok"
    assert ssh["w1"]["status"] == "fail" and "cannot resolve 'trian2'" in ssh["w1"]["detail"]
    up = without_dns(cli, "up", "--skip-checks", "inv.yaml")
    assert up.returncode == 3 and "w1: cannot resolve 'trian2'" in up.stderr
    assert "w0:" not in up.stderr.split("failed on", 1)[1]
