"""Faults a long run meets, on real local processes: nothing lost, nothing misreported.

Script jobs stand in for training here (a progress file and a "checkpoint" that survives
restarts); the TensorFlow checkpoint faults live in test_faults_checkpoints.py and the
multi-host ones in test_faults_netns.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import Cli, detached_supervisors, free_ports, run_processes, wait_for
from tests.scripts import STEPPER


def make_job(cli: Cli, job: dict[str, Any] | None = None, python: str | None = None,
             **env: Any) -> Path:  # fmt: skip
    shutil.copyfile(STEPPER, cli.cwd / "train.py")
    ports = free_ports(2)
    # The stand-in script imports no TensorFlow: a standby would only add load (warm restarts
    # are tested in test_warm_restarts.py and on a TensorFlow worker in test_supervision.py).
    full_job = {"name": "demo", "script": "train.py", "restart_backoff": 0, "warm_restarts": False,
                "env": {"STEPS": 40, **env}, **(job or {})}  # fmt: skip
    beta = f", python: {python}" if python else ""
    path = cli.cwd / "inv.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: ./work}}
        hosts:
          - {{name: alpha, address: localhost, port: {ports[0]}}}
          - {{name: beta, address: localhost, port: {ports[1]}{beta}}}
        job: {json.dumps(full_job)}
        """)
    )
    return path


def test_a_binary_inventory_is_an_inventory_error(cli: Cli) -> None:
    (cli.cwd / "inv.yaml").write_bytes(os.urandom(512) + b"\x00\xff")
    result = cli("up", "inv.yaml")
    assert result.returncode == 2, result.stderr
    assert "not UTF-8 text" in result.stderr and "Traceback" not in result.stderr


def test_exit_0_before_the_target_step_is_a_failure(cli: Cli, reaper: list[str]) -> None:
    # Each attempt leaves 5 steps after where it resumed, with exit code 0.
    make_job(cli, {"max_restarts": 1}, EXIT_0_AT=5)
    result = cli("up", "--skip-checks", "--interval", "0.2", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "at step 5: exited 0 at step 5 of 40: it stopped before its target step" in (
        result.stdout
    )
    # The worker that left at step 5 resumed the restart from its own checkpoint, step 5 (its
    # peer from wherever the supervisor stopped it: under load, 0 when it had not stepped yet).
    first = re.search(r"(\w+) at step 5: exited 0 at step 5 of 40", result.stdout)
    assert first, result.stdout
    restart = cli.cwd / "work" / "demo" / "runs" / cli.record()["run_id"] / "attempt-1"
    log = (restart / first.group(1) / "worker.log").read_text()
    assert "start 5 of a 2-worker cluster" in log, log
    # The root cause names the last attempt's first exit, 5 steps after where that worker
    # resumed: step 10 for one that resumed at 5; less for one that resumed lower.
    starts = [int(n) for n in re.findall(r"start (\d+) of a 2-worker cluster", result.stderr)]
    last_attempt = starts[-2:]  # the excerpt's start line: the first worker to fail
    cause = result.stderr.split("the worker that failed first:")[-1]
    named = [n for n in last_attempt if f"exited 0 at step {n + 5} of 40" in cause]
    assert named, (starts, result.stderr)
    assert "after 1 restart(s) because it used all 1 restarts" in result.stderr
    status = cli.status()  # the named worker's last step, 10 unless it was stopped early before
    assert status["state"] == "failed" and named[0] + 5 in {w["step"] for w in status["workers"]}


def test_a_worker_that_reported_its_final_step_is_not_stalled(cli: Cli, reaper: list[str]) -> None:
    # Tearing down after the last step (saving, closing files) takes longer than stall_timeout.
    make_job(cli, {"stall_timeout": 2}, LINGER=5)
    result = cli("up", "--skip-checks", "--interval", "0.2", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restarting" not in result.stdout and cli.status()["restarts"] == 0


def test_two_ups_at_once_start_one_run(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, DELAY=0.1)
    first, second = (cli.popen("up", "--skip-checks", "inv.yaml") for _ in range(2))
    results = [(p, *p.communicate(timeout=120)) for p in (first, second)]
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 4], results
    refused = next(err for p, _, err in results if p.returncode == 4)
    assert f"run {run_id} of job 'demo' is still" in refused
    runs = list((cli.cwd / ".orchestrate" / "runs").glob("*.json"))
    assert len([r for r in runs if not r.name.endswith(".status.json")]) == 1


def slow_python(cli: Cli, seconds: float) -> str:
    """A Python that takes `seconds` to start: beta's launch lags alpha's."""
    path = cli.cwd / "slow-python"
    path.write_text(f'#!/bin/sh\nsleep {seconds}\nexec {sys.executable} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def kill_up_mid_launch(cli: Cli) -> tuple[str, int]:
    """Start `up`, SIGKILL it once alpha started and before beta did; (run id, alpha's pid)."""
    up = cli.popen("up", "--skip-checks", "inv.yaml")

    def alpha_started() -> dict[str, Any] | None:
        try:
            record = cli.record()
        except (FileNotFoundError, ValueError):
            return None
        alive = [p for p in run_processes(record["run_id"]) if "train.py" in " ".join(p.cmdline())]
        return {"run": record["run_id"], "pid": alive[0].pid} if alive else None

    started = wait_for(alpha_started, timeout=60, interval=0.05)
    up.send_signal(signal.SIGKILL)
    up.communicate(timeout=30)
    record = cli.record()
    assert not record["launched"], "beta started before the kill: the test did not cut it"
    return started["run"], started["pid"]


def test_killed_mid_launch_the_next_up_stops_the_partial_attempt(
    cli: Cli, reaper: list[str]
) -> None:
    make_job(cli, python=slow_python(cli, 6), DELAY=0.05)
    first_run, orphan = kill_up_mid_launch(cli)
    reaper.append(first_run)
    # down first, as a user would: it stops alpha, and the run is over, not "pending" for good.
    assert cli("down", "--grace", "2").returncode == 0
    states = {w["name"]: w["state"] for w in cli.status()["workers"]}
    # beta never started; alpha's 2 s script may have finished before down reached it (down
    # keeps an ended worker's verdict).
    assert states["beta"] == "stopped" and states["alpha"] in ("stopped", "succeeded"), states
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie"
    result = cli("up", "--skip-checks", "--interval", "0.2", "inv.yaml", timeout=180)
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert run_processes(first_run) == []


def test_killed_mid_launch_attach_starts_the_attempt_afresh(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, python=slow_python(cli, 6), DELAY=0.05)
    run_id, orphan = kill_up_mid_launch(cli)
    reaper.append(run_id)
    result = cli("attach", "--interval", "0.2", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the launch of attempt 0 was interrupted (1 of 2 workers had started)" in (
        result.stderr + result.stdout
    )
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie"
    status = cli.status()
    assert status["state"] == "succeeded" and status["attempt"] == 1 and status["restarts"] == 0
    # beta's launch of attempt 0 was still on its way (its Python starts slowly): when it
    # arrives it is refused, instead of starting a worker nobody waits for. Its arrival: the
    # slow Python's shell has exec'd, and whatever it started has ended.
    slow = str(cli.cwd / "slow-python")

    def arrived_and_ended() -> bool:
        shells = [p for p in psutil.process_iter(["cmdline"])
                  if slow in " ".join(p.info["cmdline"] or [])]  # fmt: skip
        return not shells and run_processes(run_id) == []

    wait_for(arrived_and_ended, timeout=60, what="beta's late launch to arrive and end")
    first_beta = next((cli.cwd / "work" / "demo" / "runs" / run_id / "attempt-0").glob("beta"))
    assert not (first_beta / "pid").exists()


def test_worker_log_is_capped_and_tail_still_works(cli: Cli, reaper: list[str]) -> None:
    # About 3 MiB of output against a 1 MiB cap.
    make_job(cli, {"log_max_mb": 1}, NOISE="x" * 1023 + "\n", NOISE_REPEAT=80, STEPS=40)
    result = cli("up", "--skip-checks", "--interval", "0.2", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 0, result.stderr
    for worker in cli.record()["workers"]:
        log = Path(worker["log_path"])
        assert log.stat().st_size <= (1 << 20)
        assert 0 < Path(f"{log}.1").stat().st_size <= (1 << 20)
    tail = cli("tail", "-n", "2", "alpha", check=True).stdout
    assert "done" in tail


def test_status_exits_3_while_a_host_does_not_answer(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, DELAY=0.2, STEPS=1000)
    assert cli("up", "--detach", "--skip-checks", "inv.yaml").returncode == 0
    reaper.append(cli.record()["run_id"])
    cli.status_when(lambda s: s["state"] == "running", timeout=60)
    # The controller's supervisor is gone too (alive, it would stop beta over the session it
    # holds and answer `down` itself): status and down have to reach the hosts from here.
    for supervisor in detached_supervisors(cli.record()["run_id"]):
        supervisor.kill()
        supervisor.wait(10)
    # beta's host stops answering: the record now reaches it over SSH at a closed port.
    record_path = next(p for p in (cli.cwd / ".orchestrate" / "runs").glob("*.json")
                       if not p.name.endswith(".status.json"))  # fmt: skip
    record = json.loads(record_path.read_text())
    beta = record["workers"][1]["host"]
    beta.update(connection="ssh", address="127.0.0.1", settings={"ssh_port": free_ports(1)[0]})
    record_path.write_text(json.dumps(record))
    result = cli("status", "--json")
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout)["workers"][1]["state"] == "unknown"
    assert "beta: the host did not answer" in result.stderr
    down = cli("down", "--grace", "2")
    assert down.returncode == 3 and "alpha: stopped" in down.stdout
