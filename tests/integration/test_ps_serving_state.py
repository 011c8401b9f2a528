"""Under `strategy: parameter-server` the ps and workers report no steps (they serve the chief's
closures): once the chief trains they show `running`, not `starting` for the whole run (issue
54). Plain processes stand in for TensorFlow's tasks: the chief reports steps until the test
lets it finish, the others wait to be stopped."""

from __future__ import annotations

from typing import Any

from tests.conftest import Cli, free_ports, local_inventory

SCRIPT = """\
import json, os, pathlib, time
task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
if task != "chief":
    while True:
        time.sleep(1)  # serves until stopped
progress = os.environ["ORCHESTRATE_PROGRESS_FILE"]
step = 0
while not pathlib.Path("GO_FILE").exists() or step < 3:
    step += 1
    with open(progress + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(progress + ".tmp", progress)
    time.sleep(0.2)
"""


def states(status: dict[str, Any]) -> dict[str, str]:
    return {w["name"]: w["state"] for w in status["workers"]}


def test_ps_and_workers_show_running_while_the_chief_trains(cli: Cli, reaper: list[str]) -> None:
    (cli.cwd / "train.py").write_text(SCRIPT.replace("GO_FILE", str(cli.cwd / "go")))
    roles = {"chief": "chief", "worker-0": "worker", "ps-0": "ps"}
    hosts = [
        f"name: {name}, role: {role}, address: localhost, port: {port}"
        for (name, role), port in zip(roles.items(), free_ports(len(roles)), strict=True)
    ]
    local_inventory(cli, hosts, {"name": "ps", "script": "train.py",
                                 "strategy": "parameter-server", "restart_backoff": 0})  # fmt: skip
    try:
        cli("up", "--detach", "--skip-checks", "inv.yaml", check=True)
        reaper.append(cli.record()["run_id"])
        status = cli.status_when(lambda s: states(s)["chief"] == "running", timeout=60)
        # Before issue 54: {"chief": "running", "worker-0": "starting", "ps-0": "starting"}.
        assert states(status) == {"chief": "running", "worker-0": "running", "ps-0": "running"}
    finally:
        (cli.cwd / "go").touch()
    final = cli.status_when(lambda s: s["state"] in ("succeeded", "failed"), timeout=60)
    assert final["state"] == "succeeded", final
