"""A run whose lease keeper dies is never unleased silently (issue 54): a real local run of a
plain script job (no TensorFlow) that leases a port and a GPU through the real CLI; its keeper
is killed as an OOM kill would (SIGKILL), a neighbour (a second real account) takes the GPU
meanwhile, and the supervisor says so (`status`, the `lease_lost` notification) and leases it
again once the neighbour lets go."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import Cli, free_ports, wait_for
from tests.unit.test_lease_neighbours import NEIGHBOUR, ask, shared_lease_dir

# Holds at step 1 until the test lets it finish (the file `go-on` in its directory).
WAITS = """\
import json, os, time
progress = os.environ["ORCHESTRATE_PROGRESS_FILE"]
with open(progress + ".tmp", "w") as f:
    f.write(json.dumps({"step": 1}))
os.replace(progress + ".tmp", progress)
deadline = time.time() + 300
while not os.path.exists("go-on") and time.time() < deadline:
    time.sleep(0.1)
"""


@pytest.fixture
def lease_dir() -> Iterator[Path]:
    with shared_lease_dir("orch-lease-death-") as leases:
        yield leases


def write_inventory(cli: Cli, leases: Path) -> None:
    (cli.cwd / "train.py").write_text(WAITS)
    (cli.cwd / "hook.py").write_text(
        "import sys\n"
        "with open(sys.argv[1], 'a') as out:\n"
        "    out.write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n"
    )
    (port,) = free_ports(1)
    host = (f"{{name: alpha, address: localhost, port: auto, port_range: [{port}, {port}], "
            f"gpus: 1, visible_gpus: [1], lease_dir: {leases}}}")  # fmt: skip
    job = {"name": "demo", "script": "train.py", "max_restarts": 0}
    notify = [{"command": [sys.executable, "hook.py", "events.jsonl"]}]  # the default events
    (cli.cwd / "inv.yaml").write_text(
        f"defaults: {{connection: local, workdir: ./work}}\nhosts:\n  - {host}\n"
        f"job: {json.dumps(job)}\nnotify: {json.dumps(notify)}\n"
    )


def keepers(leases: Path) -> dict[int, list[int]]:
    """This account's keepers' pids and the GPUs each record names."""
    found = {}
    for path in leases.glob(f"lease-{os.getuid()}-*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[int(record["pid"])] = list(record["gpus"])
    return found


def status(cli: Cli) -> dict[str, Any]:
    done = cli("status", "--json")
    try:
        return json.loads(done.stdout) if done.returncode == 0 else {}
    except ValueError:
        return {}


def told(cli: Cli, event: str) -> dict[str, Any] | None:
    """The first notification of `event` the command target was given."""
    try:
        lines = (cli.cwd / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    found = [json.loads(line) for line in lines if line.strip()]
    return next((e for e in found if e.get("event") == event), None)


def neighbour_takes_gpu_one(leases: Path) -> dict[str, Any]:
    request = {"verb": "acquire", "run_id": "neighbour", "job": "other", "controller": "there",
               "idle": 120, "workers": [{"name": "n", "port": None, "range": [41600, 41699],
                                         "gpus": 1, "pool": [1]}]}  # fmt: skip
    return ask(leases, request, uid=NEIGHBOUR)[0]


@pytest.mark.root  # the neighbour is a second account (setpriv)
def test_a_dead_keeper_is_noticed_said_and_its_lease_taken_again(
    cli: Cli, reaper: list[str], lease_dir: Path
) -> None:
    write_inventory(cli, lease_dir)
    up = cli.popen("up", "inv.yaml")
    try:
        running = wait_for(lambda: status(cli).get("state") == "running" and status(cli), 90,
                           "a running worker")  # fmt: skip
        reaper.append(running["run_id"])
        ((keeper, gpus),) = wait_for(lambda: list(keepers(lease_dir).items()), 30, "a keeper")
        assert gpus == [1]
        supervisor = psutil.Process(up.pid)
        supervisor.suspend()  # the neighbour comes first, whatever the load
        try:
            os.kill(keeper, signal.SIGKILL)  # as an OOM kill ends it
            wait_for(lambda: not psutil.pid_exists(keeper), 10, "the keeper gone")
            taken = neighbour_takes_gpu_one(lease_dir)
            assert taken.get("assigned", {}).get("n", {}).get("gpus") == [1], taken
        finally:
            supervisor.resume()
        lost = wait_for(lambda: status(cli).get("leases_lost"), 60, "the loss said in status")
        assert "alpha: " in lost and "GPU 1" in lost and "could not be leased again" in lost
        table = cli("status").stdout
        assert "running unleased" in table, table
        said = wait_for(lambda: told(cli, "lease_lost"), 30, "the notification")
        assert "GPU 1" in said["root_cause"] and "orchestrate down" in said["hint"], said
        ask(lease_dir, {"verb": "release", "run_id": "neighbour"}, uid=NEIGHBOUR)
        wait_for(lambda: any(1 in g for g in keepers(lease_dir).values()), 60, "GPU 1 leased again")
        wait_for(lambda: status(cli).get("leases_lost") is None, 30, "the loss cleared")
        (cli.cwd / "go-on").touch()
        up.communicate(timeout=120)
    finally:
        (cli.cwd / "go-on").touch()  # whatever failed, the worker ends by itself
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0
