"""job.secret_env, redaction, private run files, the firewall's drop rule and the exposure check.

Pure rules against their functions; the host agent and the Slurm launcher as the real stdlib
programs in a subprocess on this machine (fast, no root, no TensorFlow).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.hosts.checks import ExposureProbe, run_preflight
from orchestrator.backends.hosts.firewall import FORMATS, host_rules
from orchestrator.backends.registry import load_inventory
from orchestrator.backends.slurm.script import LAUNCHER_SOURCE, batch_script
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.workers.secretenv import (
    REDACTED,
    looks_secret,
    scrub,
    secret_values,
    shown_env,
)
from orchestrator.errors import InventoryError, SecretMissing
from orchestrator.export.tfjob import problems, tfjob
from orchestrator.machines.hostclient import HostAgent
from orchestrator.machines.runner import LocalRunner
from orchestrator.model.findings import Status
from orchestrator.model.slurm import SlurmSpec
from orchestrator.model.workers import private_dirs
from tests.fakes.planning import plan_workers
from tests.unit.test_preflight_findings import all_ok_peers, backend_with, cluster, findings

HOSTS = "defaults: {port: 20000}\nhosts:\n  - {name: a, address: 10.9.0.1}\n"


def inventory_file(tmp_path: Path, job: str, head: str = HOSTS) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(head + "job:\n  task: worker.examples.shapes:task\n  steps: 5\n" + job)
    return path


def test_secret_env_names_variables_and_never_values(tmp_path: Path) -> None:
    job = "  env: {A: '1'}\n  secret_env: [WANDB_API_KEY, HF_TOKEN]\n"
    inventory = load_inventory(inventory_file(tmp_path, job))
    assert inventory.job.secret_env == ("WANDB_API_KEY", "HF_TOKEN")
    assert "WANDB_API_KEY" not in inventory.job.env


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[1bad]", "job.secret_env[0]: expected an environment variable name"),
        ("[TF_CONFIG]", "job.secret_env[0]: is set by orchestrate"),
        ("[A]", "job.secret_env[0]: A is also in job.env"),
        ("[K, K]", "job.secret_env[1]: K is listed twice"),
        ("K", "job.secret_env: expected a list of environment variable names"),
    ],
)
def test_bad_secret_env_is_an_inventory_error(tmp_path: Path, value: str, message: str) -> None:
    path = inventory_file(tmp_path, f"  env: {{A: '1'}}\n  secret_env: {value}\n")
    with pytest.raises(InventoryError) as error:
        load_inventory(path)
    assert message in error.value.message and error.value.exit_code == 2


def test_missing_secrets_are_named_together_and_exit_2() -> None:
    assert secret_values(["A", "B"], {"A": "x", "B": "y"}, doing="up") == {"A": "x", "B": "y"}
    with pytest.raises(SecretMissing) as error:
        secret_values(["A", "B", "C"], {"B": "y"}, doing="'up'")
    assert error.value.exit_code == 2
    assert error.value.message.startswith("job.secret_env: A, C are not set")
    assert "export A C" in (error.value.hint or "")


def test_printed_environments_hide_secrets_and_secret_looking_keys() -> None:
    env = {"PLAIN": "1", "S3_ACCESS_KEY": "k", "GH_TOKEN": "t", "db_password": "p",
           "MY_SECRET": "s", "MINE": "m"}  # fmt: skip
    assert shown_env(env, ["MINE"]) == {"PLAIN": "1", "S3_ACCESS_KEY": REDACTED,
        "GH_TOKEN": REDACTED, "db_password": REDACTED, "MY_SECRET": REDACTED,
        "MINE": REDACTED}  # fmt: skip
    assert looks_secret("api_key") and not looks_secret("MONKEY_PATCH".replace("KEY", "K"))
    assert (
        scrub("token=abcd1234 and abcd1234", ["abcd1234", ""]) == f"token={REDACTED} and {REDACTED}"
    )


def test_up_refuses_a_missing_secret_before_anything(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("ORCH_UNIT_SECRET", raising=False)
    path = inventory_file(tmp_path, "  secret_env: [ORCH_UNIT_SECRET]\n")
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--state-dir", str(tmp_path / "state"), "up",
         str(path)], capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "job.secret_env: ORCH_UNIT_SECRET is not set" in result.stderr
    assert not (tmp_path / "state").exists()


def test_the_launch_request_carries_secrets_and_the_spec_does_not(tmp_path: Path) -> None:
    inventory = load_inventory(inventory_file(tmp_path, "  secret_env: [TOKEN_X]\n"))
    spec = plan_workers(inventory, "r1", {"a": "/w"}, secrets={"TOKEN_X": "v4lue"})[0]
    request = spec.launch_request()
    assert request["secret_env"] == {"TOKEN_X": "v4lue"} and "TOKEN_X" not in request["env"]
    assert "v4lue" not in repr(spec)
    assert request["private_dirs"] == [
        "/w/inv/runs", "/w/inv/runs/r1", "/w/inv/runs/r1/attempt-0",
        "/w/inv/runs/r1/attempt-0/a",
    ]  # fmt: skip
    assert private_dirs(spec.run_dir) == tuple(request["private_dirs"])


def test_the_agent_keeps_secrets_out_of_files_and_makes_the_run_private(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    run_dir = workdir / "job" / "runs" / "r" / "attempt-0" / "w"
    # The script prints the secret (as a careless one might); its text never contains it.
    script = ("import os; print('got', len(os.environ['TOKEN_X']), os.environ['PLAIN']); "
              "print('leak', os.environ['TOKEN_X']); raise SystemExit(3)")  # fmt: skip
    spec = {"run_dir": str(run_dir), "private_dirs": list(private_dirs(str(run_dir))),
            "cwd": str(tmp_path), "argv": [sys.executable, "-c", script],
            "env": {"PLAIN": "p"}, "secret_env": {"TOKEN_X": "s3cr3t-v"},
            "tf_config": {"cluster": {}}}  # fmt: skip
    HostAgent(LocalRunner("w"), sys.executable).launch(spec)
    deadline = time.monotonic() + 20
    while not (run_dir / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = (run_dir / "worker.log").read_text()
    # The worker had it (8 characters) and printed it; the log the agent writes redacts it.
    assert "got 8 p" in log and f"leak {REDACTED}" in log and "s3cr3t-v" not in log
    exit_record = json.loads((run_dir / "exit.json").read_text())
    assert "s3cr3t-v" not in json.dumps(exit_record) and f"leak {REDACTED}" in exit_record["error"]
    for name in ("spec.json", "tf_config.json", "agent.py", "pid", "worker.pid", "exit.json",
                 "worker.log"):  # fmt: skip
        path = run_dir / name
        assert b"s3cr3t-v" not in path.read_bytes(), name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
    assert stat.S_IMODE((run_dir / "worker.log").stat().st_mode) == 0o600
    assert json.loads((run_dir / "spec.json").read_text())["secret_names"] == ["TOKEN_X"]
    for directory in private_dirs(str(run_dir)):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
    assert stat.S_IMODE((workdir / "job").stat().st_mode) == 0o777 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_the_state_directory_keeps_runs_private(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    store.write_file(store.snapshot_path("r1"), "{}")
    store.write_file(store.preflight_path(), "{}")
    with store.open_private(store.log_path("r1"), append=True) as log:
        log.write(b"x")
    assert stat.S_IMODE((tmp_path / "state" / "runs").stat().st_mode) == 0o700
    for path in (store.snapshot_path("r1"), store.preflight_path(), store.log_path("r1")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_the_launcher_refuses_a_task_without_its_secrets(tmp_path: Path) -> None:
    plan = {"port": 2222, "secret_env": ["TOKEN_X"], "tasks": [{"run_dir": str(tmp_path / "t0"),
            "private_dirs": [str(tmp_path / "t0")], "cwd": str(tmp_path), "env": {},
            "argv": [sys.executable, "-c", "print('ran')"]}]}  # fmt: skip
    env = {"ORCHESTRATE_SLURM_PLAN": json.dumps(plan), "SLURM_PROCID": "0",
           "SLURM_STEP_NODELIST": "n1", "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", LAUNCHER_SOURCE], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 2 and "job.secret_env: TOKEN_X" in done.stdout
    assert stat.S_IMODE((tmp_path / "t0").stat().st_mode) == 0o700
    ran = subprocess.run([sys.executable, "-c", LAUNCHER_SOURCE], env={**env, "TOKEN_X": "v"},
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert ran.returncode == 0 and "ran" in (tmp_path / "t0" / "worker.log").read_text()


def test_the_batch_script_names_secrets_and_holds_no_value(tmp_path: Path) -> None:
    head = "slurm:\n  nodes: 2\n"
    inventory = load_inventory(inventory_file(tmp_path, "  secret_env: [TOKEN_X]\n", head))
    assert isinstance(inventory.source_settings, SlurmSpec)
    specs = plan_workers(inventory, "r", {h.name: "/s" for h in inventory.hosts},
                         secrets={"TOKEN_X": "v4lue"})  # fmt: skip
    script = batch_script(inventory.source_settings, inventory.job, specs)
    assert "v4lue" not in script and '"secret_env": [\n  "TOKEN_X"\n ]' in script
    assert "# Secrets (job.secret_env) are never written here: export TOKEN_X" in script


def test_tfjob_refers_to_a_secret_and_validates(tmp_path: Path) -> None:
    inventory = load_inventory(inventory_file(tmp_path, "  secret_env: [TOKEN_X]\n"))
    manifest = tfjob(inventory, "img", secret="tracker")
    env = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    reference = {"secretKeyRef": {"name": "tracker", "key": "TOKEN_X"}}
    assert {"name": "TOKEN_X", "valueFrom": reference} in env
    assert problems(manifest) == []
    assert any("secretKeyRef needs the name of a Secret" in p
               for p in problems(tfjob(inventory, "img")))  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_drops_the_port_after_its_accepts(tmp_path: Path, fmt: str) -> None:
    commands = list(host_rules(cluster(tmp_path), fmt, controller="10.9.0.100")[0].commands)
    accepts = [
        i
        for i, c in enumerate(commands)
        if "20000" in c and ("accept" in c.lower() or " allow " in c)
    ]
    drops = [i for i, c in enumerate(commands) if "20000" in c and ("DROP" in c or "drop" in c
             or "deny" in c)]  # fmt: skip
    assert len(accepts) == 3 and len(drops) == 1 and drops[0] > max(accepts)
    if fmt == "iptables":
        assert commands[drops[0]] == "iptables -I INPUT 4 -p tcp --dport 20000 -j DROP"


def test_check_warns_when_this_machine_reaches_a_tf_port(tmp_path: Path) -> None:
    tried: list[tuple[str, int]] = []

    def reaches(address: str, port: int, _timeout: float) -> bool:
        tried.append((address, port))
        return address != "10.9.0.3"  # c drops this machine

    outsider = ExposureProbe(lambda _address: "10.9.0.100", reaches)
    report = run_preflight(cluster(tmp_path), backend_with({}, all_ok_peers()), exposure=outsider)
    found = findings(report)
    assert (
        found[("a", "exposed")][0] is Status.WARN and "(10.9.0.100)" in found[("a", "exposed")][1]
    )
    assert found[("c", "exposed")][0] is Status.OK and not report.blocking
    member = ExposureProbe(lambda _address: "10.9.0.1", reaches)  # this machine is host a
    tried.clear()
    report = run_preflight(cluster(tmp_path), backend_with({}, all_ok_peers()), exposure=member)
    assert tried == [] and not [f for f in report.findings if f.check == "exposed"]
