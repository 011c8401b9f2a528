"""Supervision on real local processes: failures, stalls and restarts, through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    PACED,
    Cli,
    clean_env,
    detached_supervisors,
    first_run_dir,
    free_ports,
    local_tf_inventory,
    progress_in,
    restored_steps,
    run_processes,
    suspend_workers,
    wait_for,
)
from tests.scripts import STEPPER


def make_job(cli: Cli, job: dict[str, Any], **env: Any) -> Path:
    shutil.copyfile(STEPPER, cli.cwd / "train.py")
    ports = free_ports(2)
    full_job = {
        "name": "demo",
        "script": "train.py",
        "restart_backoff": 0,
        # The stand-in script imports no TensorFlow: a standby would only add load (warm
        # restarts: test_warm_restarts.py, and the TensorFlow worker test below).
        "warm_restarts": False,
        "env": {"STEPS": 40, "DELAY": 0.05, **env},
        **job,
    }
    path = cli.cwd / "inv.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: ./work}}
        hosts:
          - {{name: alpha, address: localhost, port: {ports[0]}}}
          - {{name: beta, address: localhost, port: {ports[1]}}}
        job: {json.dumps(full_job)}
        """)
    )
    return path


def worker_pid(cli: Cli, name: str) -> int:
    status = cli.status_when(lambda s: s["state"] == "running", timeout=30)
    return next(w["pid"] for w in status["workers"] if w["name"] == name)


def stepping(cli: Cli, name: str, attempt: int = 0, job: str = "demo") -> Path:
    """The run directory of worker `name` in `attempt`, once its own progress file (read
    directly, no CLI in between) reports a step: it is past its start, and still running."""

    def stepped() -> Path | None:
        run_dir = first_run_dir(cli.cwd / "work" / job, name, attempt)
        return run_dir if progress_in(run_dir).get("step") else None

    found: Path = wait_for(stepped, timeout=60, what=f"{name}'s first step", interval=0.05)
    return found


def test_max_restarts_exceeded_ends_with_a_root_cause(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, {"max_restarts": 2}, FAIL_WORKER="beta", FAIL_HOW="vary")
    result = cli("up", "--skip-checks", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1
    assert "the run failed for good after 2 restart(s) because it used all 2 restarts" in (
        result.stderr
    )
    # The last attempt resumed at step 4 and failed on its first step.
    assert "the worker that failed first: beta before its first step: exit 1: boom at" in (
        result.stderr
    )
    assert "last lines of beta's log:" in result.stderr
    assert result.stdout.count("restarting the cluster") == 2
    status = cli.status()
    assert status["restarts"] == 2 and status["state"] == "failed"


def test_permanent_exit_code_is_not_retried(cli: Cli, reaper: list[str]) -> None:
    # alpha still has 35 steps (7 s) to go when beta fails: the supervisor stops it.
    make_job(cli, {"permanent_exit_codes": [3]}, FAIL_WORKER="beta", FAIL_HOW="permanent",
             DELAY=0.2)  # fmt: skip
    result = cli("up", "--skip-checks", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1
    assert "after 0 restart(s) because exit code 3 is marked permanent" in result.stderr
    # The survivor reads as stopped by its supervisor, not by `orchestrate down`.
    workers = {w["name"]: (w["state"], w["reason"].split(":")[0]) for w in cli.status()["workers"]}
    assert workers == {"alpha": ("stopped", "stopped after beta ended the attempt"),
                       "beta": ("failed", "exit 3")}  # fmt: skip


def test_killed_worker_restarts_the_cluster_which_then_finishes(
    cli: Cli, reaper: list[str]
) -> None:
    make_job(cli, {}, STEPS=60)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        (beta,) = suspend_workers([stepping(cli, "beta")])  # held: its pid cannot be gone
        beta.kill()
        out, err = up.communicate(timeout=120)
    finally:
        up.kill()
    reaper.append(cli.record()["run_id"])
    assert up.returncode == 0, err
    assert "beta" in out and "killed by SIGKILL; restarting the cluster (1/3)" in out
    assert "succeeded at step 60 after 1 restart(s)" in err
    status = cli.status()
    assert status["attempt"] == 1 and status["last_restart"]["worker"] == "beta"
    # The second attempt resumed from the "checkpoint" instead of starting over.
    logs = cli("tail", "beta", "-n", "100", check=True).stdout
    assert "start 0" not in logs


def test_stalled_worker_is_detected_and_restarted(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, {"stall_timeout": 3}, STEPS=80)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        # Frozen mid-training, past its first step: before it, start_timeout is the limit.
        suspend_workers([stepping(cli, "alpha")])  # SIGSTOP
        stopped_at = time.time()
        out, err = up.communicate(timeout=120)
    finally:
        up.kill()
    reaper.append(cli.record()["run_id"])
    assert up.returncode == 0, err
    said = " ".join(out.split())  # one line, however the console wrapped it
    assert "stalled: no progress for 3 s (stall_timeout) at step" in said
    # Its stacks are asked for, and a stopped process is said to be one, at once.
    assert "alpha did not answer (it is stopped (SIGSTOP or a debugger)" in said
    detected_after = cli.status()["last_restart"]["at"] - stopped_at
    assert 3 <= detected_after < 3 + 3
    assert "succeeded at step 80" in err


def test_a_worker_slow_to_start_is_starting_not_stalled(cli: Cli, reaper: list[str]) -> None:
    # Both wait 6 s before anything (a TensorFlow import on a loaded host), three times
    # stall_timeout: within start_timeout that is start-up, and no restart is spent on it.
    make_job(cli, {"stall_timeout": 2, "start_timeout": 60, "max_restarts": 0}, STEPS=20,
             START_DELAY=6)  # fmt: skip
    result = cli("up", "--skip-checks", "inv.yaml", timeout=180)
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "succeeded at step 20" in result.stderr
    status = cli.status()
    assert (status["attempt"], status["restarts"]) == (0, 0), status
    logs = cli("tail", "-n", "100", check=True).stdout
    assert logs.count("start 0 of a 2-worker cluster") == 2  # each started once


def test_a_worker_past_start_timeout_is_named_with_that_limit(cli: Cli, reaper: list[str]) -> None:
    # beta never makes its first step; alpha trains on (its steps keep no clock of beta's).
    make_job(cli, {"stall_timeout": 60, "start_timeout": 3, "max_restarts": 0},
             STEPS=100_000, SLOW_WORKER="beta", START_DELAY=100_000)  # fmt: skip
    result = cli("up", "--skip-checks", "inv.yaml", timeout=180)
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1, result.stdout + result.stderr
    said = " ".join(result.stderr.split())
    assert (
        "the worker that failed first: beta before its first step: no first step within "
        "start_timeout 3 s (it reported no progress)"
    ) in said, result.stderr
    assert "raise start_timeout if starting" in said  # what to do names the same limit
    record = cli.record()
    assert record["outcome"].startswith(
        "gave up: beta: no first step within start_timeout 3 s (it reported no progress); "
    ), record["outcome"]
    assert record["attempts"][0]["end"] == "stalled"


def test_detached_supervisor_restarts_and_attach_follows_to_the_end(
    cli: Cli, reaper: list[str]
) -> None:
    make_job(cli, {}, STEPS=60, DELAY=0.15)
    started = cli("up", "--detach", "--skip-checks", "inv.yaml", check=True)
    assert "a supervisor (pid" in started.stderr
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    (alpha,) = suspend_workers([stepping(cli, "alpha")])
    alpha.kill()
    # The second attempt held once both workers stepped (their own progress files), until
    # `attach` has said how it follows: the run cannot end before `attach` starts, however
    # long `attach` takes to start on a loaded machine.
    held = suspend_workers([stepping(cli, name, attempt=1) for name in ("alpha", "beta")])
    err_path = cli.cwd / "attach.err"
    with open(err_path, "w") as err_file:
        attach = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "attach"], cwd=cli.cwd, env=clean_env(),
            stdout=subprocess.DEVNULL, stderr=err_file, text=True,
        )  # fmt: skip
    try:
        wait_for(lambda: "supervises it" in err_path.read_text(), timeout=120,
                 what="attach's first line")  # fmt: skip
    finally:
        for worker in held:
            worker.resume()
    assert attach.wait(timeout=120) == 0, err_path.read_text()
    assert "another process supervises it" in err_path.read_text()
    status = cli.status()
    assert status["state"] == "succeeded" and status["restarts"] == 1
    log = (cli.cwd / ".orchestrate" / "runs" / f"{run_id}.log").read_text()
    assert "alpha" in log and "restarting the cluster" in log


def test_ctrl_c_on_up_leaves_the_run_supervised(cli: Cli, reaper: list[str]) -> None:
    """Issue 56: Ctrl-C stops watching, not supervising; a worker killed afterwards is
    restarted by the detached supervisor that took over, and the run succeeds."""
    make_job(cli, {}, STEPS=60, DELAY=0.15)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    (alpha,) = suspend_workers([stepping(cli, "alpha")])  # held: the run cannot end first
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    up.send_signal(signal.SIGINT)
    _, err = up.communicate(timeout=60)
    assert up.returncode == 130, err
    assert f"run {run_id} stays supervised: a detached supervisor (pid" in err, err
    assert "'orchestrate attach' re-enters the live view" in err
    (supervisor,) = detached_supervisors(run_id)
    alpha.kill()
    # While its supervisor lives, a failed worker is a restart to come, and status says so.
    status = cli.status_when(lambda s: s["state"] == "failed" or s["restarts"], timeout=60)
    assert status["supervised"] is True, status
    status = cli.status_when(lambda s: not s["supervised"], timeout=180)
    assert status["state"] == "succeeded" and status["restarts"] == 1, status
    log = (cli.cwd / ".orchestrate" / "runs" / f"{run_id}.log").read_text()
    assert "alpha" in log and "restarting the cluster" in log
    supervisor.wait(timeout=60)


def test_attach_takes_over_when_the_controller_died(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, {}, STEPS=80)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    (beta,) = suspend_workers([stepping(cli, "beta")])  # held: its pid cannot be gone
    reaper.append(cli.record()["run_id"])
    up.kill()  # the controller dies; the workers train on, unsupervised
    up.wait()
    beta.kill()
    attached = cli("attach", timeout=120)
    assert attached.returncode == 0, attached.stderr
    assert "nothing supervises it; supervising it here" in attached.stderr
    assert "killed by SIGKILL; restarting the cluster" in attached.stdout
    assert cli.status()["state"] == "succeeded"


def test_down_from_another_shell_ends_a_foreground_up_cleanly(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, {}, STEPS=100_000)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    worker_pid(cli, "alpha")
    reaper.append(cli.record()["run_id"])
    cli("down", check=True)
    _, err = up.communicate(timeout=60)
    assert up.returncode == 1
    assert "the run was stopped by 'orchestrate down'" in err
    assert "restarting" not in err


def test_down_stops_a_supervised_run_for_good(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, {}, STEPS=100_000)
    cli("up", "--detach", "--skip-checks", "inv.yaml", check=True)
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    worker_pid(cli, "alpha")
    down = cli("down", check=True)
    assert "alpha: stopped" in down.stdout
    # Its supervisor ends (one that misread the stop as a failure would restart instead, and
    # live on); once it has, nothing can start a worker of the run again.
    wait_for(lambda: not detached_supervisors(run_id), timeout=60, what="the supervisor's end")
    assert run_processes(run_id) == []
    status = cli.status()
    assert status["state"] == "stopped" and status["attempt"] == 0
    again = cli("up", "--detach", "--skip-checks", "inv.yaml")
    assert again.returncode == 0, again.stderr  # nothing is left to block a new run
    reaper.append(cli.record()["run_id"])
    cli("down", check=True)


@pytest.mark.tf
def test_tensorflow_worker_killed_mid_training_resumes_warm_to_exactly_the_target(
    cli: Cli, reaper: list[str]
) -> None:
    """SIGKILL of a worker: the new attempt's workers are the slots' standbys (TensorFlow
    imported while the first attempt trained), and training resumes from the checkpoint to
    exactly the target step; the run's end leaves no standby behind."""
    local_tf_inventory(cli, steps=600, checkpoint_every=50, restart_backoff=1, warm_restarts=True)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    seen: list[int] = []
    job_root = cli.cwd / "work" / "shapes"
    try:
        # Hold the training (and free the CPU) as soon as the chief's own progress file names
        # its first checkpoint, until both standbys have imported TensorFlow: a `status` poll
        # in between could take longer than the rest of the run (seen in CI runs, with 300 and
        # with 600 steps: the worker's pid was gone by the time the test held it).
        first = wait_for(lambda: progress_in(first_run_dir(job_root, "chief")).get(
            "checkpoint_step"), 120, "the first checkpoint", interval=0.05)  # fmt: skip
        seen.append(first)
        workers = suspend_workers([first_run_dir(job_root, name) for name in ("chief", "other")])
        taken = {worker.pid for worker in workers}
        standbys = wait_for(lambda: ready_standbys(cli, taken), timeout=180,
                            what="ready standbys")  # fmt: skip
        workers[1].kill()
        workers[0].resume()
        while up.poll() is None:
            chief = cli.status()["workers"][0]
            if chief["checkpoint_step"] is not None:
                seen.append(chief["checkpoint_step"])
            time.sleep(0.5)
        out, err = up.communicate()
    finally:
        up.kill()
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    assert up.returncode == 0, err
    assert "other" in out and "killed by SIGKILL" in out
    assert seen == sorted(seen), f"checkpoint steps went back: {seen}"
    final = cli.status()
    assert final["attempt"] == 1
    assert [w["pid"] for w in final["workers"]] == standbys  # the standbys became the workers
    assert [w["step"] for w in final["workers"]] == [600, 600]
    restored = restored_steps(cli)
    assert restored and min(restored) >= seen[0]
    assert run_processes(run_id) == []
    assert_goodput_sums(cli.record(), final["goodput"], err)


def assert_goodput_sums(record: dict[str, Any], goodput: dict[str, Any], err: str) -> None:
    """Goodput after the SIGKILL (engine/observe/goodput.py): every worker's parts sum to its wall
    time, from the first launch to its exit (within 2 %), the cluster's to theirs; training,
    the restart's downtime and the work past the checkpoint are among them; `up` said so."""
    first, last = record["attempts"][0], record["attempts"][-1]
    assert [a["end"] for a in record["attempts"]] == ["crashed", "finished"]
    for span in last["workers"]:
        wall = span["finished_at"] - first["launched_at"]
        account = goodput["workers"][span["name"]]
        assert sum(account["seconds"].values()) == pytest.approx(account["total_seconds"])
        assert account["total_seconds"] == pytest.approx(wall, rel=0.02)
    seconds = goodput["seconds"]
    assert sum(seconds.values()) == pytest.approx(goodput["total_seconds"])
    assert all(seconds[part] > 0 for part in ("productive", "startup", "lost", "restart"))
    assert seconds["checkpoint"] > 0 and seconds["unknown"] == 0
    assert 0 < goodput["goodput"] < 1 and goodput["restarts"] == 1
    assert "lost to 1 restart" in err and "goodput " in err


def ready_standbys(cli: Cli, taken: set[int]) -> list[int] | None:
    """Both slots' standby children (pids, in worker order) once they imported TensorFlow. Not
    the first attempt's own: `up` started its workers as standbys too, and until the supervisor
    starts the next ones their claimed directory may still say `ready` (their pids: `taken`)."""
    pids = []
    for worker in cli.record()["workers"]:
        run_dir = Path(worker["run_dir"])
        standby = run_dir.parents[3] / "standby" / run_dir.name  # {job}/standby/{name}
        if not (standby / "ready").exists() or not (standby / "spec.json").exists():
            return None  # not imported yet, or claimed (claimed.json)
        pid = int((standby / "worker.pid").read_text())
        if pid in taken:
            return None
        pids.append(pid)
    return pids


@pytest.mark.tf
def test_sigterm_to_one_worker_saves_the_cluster_and_up_resumes_there(
    cli: Cli, reaper: list[str]
) -> None:
    local_tf_inventory(cli, steps=100_000, checkpoint_every=1000)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        status = cli.status_when(lambda s: all((w["step"] or 0) >= 30 for w in s["workers"]), 120)
        os.kill(status["workers"][1]["pid"], signal.SIGTERM)  # a cloud VM being preempted
        _, err = up.communicate(timeout=120)
    finally:
        up.kill()
    reaper.append(cli.record()["run_id"])
    assert up.returncode == 1
    assert "the run was preempted and saved a checkpoint at step" in err
    final = cli.status()
    assert final["state"] == "stopped" and final["restarts"] == 0
    saved = {w["checkpoint_step"] for w in final["workers"]}
    assert len(saved) == 1 and saved.pop() >= 30  # every worker saved at the same step
    assert {w["exit_code"] for w in final["workers"]} == {75}
    step = final["workers"][0]["checkpoint_step"]
    local_tf_inventory(cli, steps=step + 20, checkpoint_every=1000, **PACED)
    cli("up", "--skip-checks", "inv.yaml", check=True, timeout=300)
    assert restored_steps(cli) == [step, step]


@pytest.mark.tf
def test_down_save_reports_the_saved_step_and_the_next_up_resumes(
    cli: Cli, reaper: list[str]
) -> None:
    local_tf_inventory(cli, steps=100_000, checkpoint_every=1000, **PACED)
    cli("up", "--detach", "--skip-checks", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    cli.status_when(lambda s: all((w["step"] or 0) >= 30 for w in s["workers"]), 120)
    down = cli("down", "--save", check=True, timeout=120)
    assert "saved a checkpoint at step" in down.stderr
    step = int(down.stderr.split("saved a checkpoint at step ")[1].split()[0])
    # A stop, not a preemption (issue 56): the workers say so, and the account loses nothing.
    logs = cli("tail", "-n", "30", check=True).stdout
    assert f"worker: stopped: saved checkpoint at step {step}" in logs
    assert "preempted" not in logs
    run_id = cli.record()["run_id"]
    wait_for(lambda: not detached_supervisors(run_id), timeout=60, what="the supervisor's end")
    goodput = cli.status()["goodput"]
    assert goodput["seconds"]["lost"] == 0 and goodput["seconds"]["restart"] == 0, goodput
    local_tf_inventory(cli, steps=step + 20, checkpoint_every=1000, **PACED)
    cli("up", "--skip-checks", "inv.yaml", check=True, timeout=300)
    assert restored_steps(cli) == [step, step]
