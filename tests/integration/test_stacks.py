"""Stacks from every worker (issue 26), on real local processes and real TensorFlow: the boot a
script starts behind changes nothing the script sees; a stall's root cause names the worker the
others wait for and where it is, with every worker's stacks kept; `orchestrate stacks` on a live
run. The Slurm run's `orchestrate stacks` is in test_slurm.py (its session-scoped cluster)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.contract import SCRIPT_BOOT
from tests.conftest import REPO, Cli, free_ports, local_tf_inventory, restored_steps, wait_for

SCRIPTS = REPO / "tests" / "scripts"
# Counted from a worker's first step (issue 53): TensorFlow's import and the cluster's forming
# (over 20 s on this 2-core machine shared by several test runs, load 9; a cold CI run's stall
# fired while a worker still imported) have start_timeout, 300 s by default.
STALL = 30


def _started(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, dict, str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    first = done.stdout.splitlines()[0]
    return done.returncode, json.loads(first), done.stderr


@pytest.mark.parametrize("how", ["0", "3", "raise"])
def test_the_boot_changes_nothing_the_script_sees(tmp_path: Path, how: str) -> None:
    # The same relative command line as `python script.py`, from another directory.
    (tmp_path / "job").mkdir()
    shutil.copy(SCRIPTS / "shows_its_start.py", tmp_path / "job" / "start.py")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = dict(os.environ, ORCHESTRATE_RUN_DIR=str(run_dir))
    plain = _started([sys.executable, "job/start.py", how, "--x"], tmp_path, env)
    booted = _started([sys.executable, "-c", SCRIPT_BOOT, "job/start.py", how, "--x"],
                      tmp_path, env)  # fmt: skip
    assert booted[:2] == plain[:2]  # exit code, argv, __name__, __file__, sys.path[0], cwd
    assert plain[1]["argv"] == ["job/start.py", how, "--x"] and plain[1]["name"] == "__main__"
    if how == "raise":
        assert plain[0] == 1 and "RuntimeError: raised on purpose" in booted[2]
    # Only the booted one registered its stack dump.
    assert (run_dir / "stacks.pid").exists()


def test_a_booted_script_writes_its_stacks_on_sigusr2_into_its_own_file(tmp_path: Path) -> None:
    shutil.copy(SCRIPTS / "shows_its_start.py", tmp_path / "start.py")
    env = dict(os.environ, ORCHESTRATE_RUN_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    with open(tmp_path / "out.txt", "w") as out:
        argv = [sys.executable, "-c", SCRIPT_BOOT, "start.py", "wait"]
        process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: "waiting" in (tmp_path / "out.txt").read_text(), 30, "the script")
        assert int((tmp_path / "stacks.pid").read_text()) == process.pid
        os.kill(process.pid, signal.SIGUSR2)
        stacks = wait_for((tmp_path / "stacks.txt").read_text, 10, "the stacks")
        assert "start.py" in stacks and "in <module>" in stacks
        assert process.poll() is None  # it goes on
        assert stat.S_IMODE((tmp_path / "stacks.txt").stat().st_mode) == 0o600
        assert "start.py" not in (tmp_path / "out.txt").read_text().split("waiting")[1]
    finally:
        process.kill()
        process.wait()


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _script_inventory(cli: Cli, script: str, **job: object) -> Path:
    shutil.copy(SCRIPTS / script, cli.cwd / script)
    ports = free_ports(2)
    settings = {"name": "hang", "script": script, "restart_backoff": 0, "max_restarts": 1,
                "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}, **job}  # fmt: skip
    path = cli.cwd / "inv.yaml"
    path.write_text(
        "defaults: {connection: local, workdir: ./work}\n"
        "hosts:\n"
        f"  - {{name: chief, address: localhost, port: {ports[0]}}}\n"
        f"  - {{name: other, address: localhost, port: {ports[1]}}}\n"
        f"job: {json.dumps(settings)}\n"
    )
    return path


@pytest.mark.tf
def test_a_script_stuck_in_one_function_is_named_then_stacks_shows_the_live_run(
    cli: Cli, reaper: list[str]
) -> None:
    # Warm restarts: the second attempt runs in the standbys (the boot's `-c` path through
    # them).
    _script_inventory(cli, "hangs_in_one_worker.py", stall_timeout=STALL, max_restarts=2,
                      warm_restarts=True)  # fmt: skip
    cli("up", "--skip-checks", "--detach", "--interval", "0.5", "inv.yaml", check=True)
    record = cli.record()
    reaper.append(record["run_id"])
    try:

        def stepping_again(status: dict) -> bool:
            return status["attempt"] == 1 and all((w["step"] or 0) > 0 for w in status["workers"])

        cli.status_when(stepping_again, timeout=240)
        (restart,) = cli.record()["restarts"]
        # The watch saw the chief stall first; the stacks say it waits for `other`.
        assert restart["worker"] == "other" and restart["kind"] == "stalled", restart
        line = _line_of(SCRIPTS / "hangs_in_one_worker.py", "threading.Event().wait()")
        assert f"other is in stuck_here (hangs_in_one_worker.py:{line})" in restart["reason"]
        assert "chief waits in the compiled step, from main" in restart["reason"], restart
        assert "the others wait for other" in restart["reason"]
        kept = cli.cwd / ".orchestrate" / "runs" / f"{record['run_id']}.stacks" / "attempt-0"
        assert sorted(p.name for p in kept.iterdir()) == ["chief.txt", "other.txt"]
        assert "in stuck_here" in (kept / "other.txt").read_text()
        assert "quick_execute" in (kept / "chief.txt").read_text()
        assert {stat.S_IMODE(p.stat().st_mode) for p in kept.iterdir()} == {0o600}
        assert stat.S_IMODE(kept.stat().st_mode) == 0o700
        # The second attempt is healthy: `orchestrate stacks` shows both of its workers.
        shown = cli("stacks")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "== chief" in shown.stdout and "other" in shown.stdout
        assert "hangs_in_one_worker.py" in shown.stdout and "most recent call first" in shown.stdout
        one = cli("stacks", "--worker", "other", "--native")
        assert one.returncode == 0, one.stderr
        assert "== other" in one.stdout and "== chief" not in one.stdout
        if shutil.which("py-spy") is None:
            assert "py-spy is not installed on this host" in one.stdout
        unknown = cli("stacks", "--worker", "nobody")
        assert unknown.returncode == 4 and "no worker named nobody" in unknown.stderr
    finally:
        cli("down", timeout=120)


@pytest.mark.tf
def test_a_blocked_input_pipeline_names_its_worker_and_the_next_attempt_resumes(
    cli: Cli, reaper: list[str]
) -> None:
    local_tf_inventory(
        cli, name="pipeline", task="tests.tasks.stuck_pipeline:task", steps=60, batch_size=8,
        checkpoint_every=5, log_every=5, stall_timeout=STALL, restart_backoff=0, max_restarts=1,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    result = cli("up", "--skip-checks", "--interval", "0.5", "inv.yaml", timeout=300)
    record = cli.record()
    reaper.append(record["run_id"])
    assert result.returncode == 0, result.stdout + result.stderr
    (restart,) = record["restarts"]
    assert restart["worker"] == "other", restart
    assert "other is in wait_here (stuck_pipeline.py:" in restart["reason"], restart
    assert "inside TensorFlow (a py_function)" in restart["reason"]
    assert "the others wait for other" in restart["reason"]
    assert min(restored_steps(cli)) >= 5  # the next attempt resumed from a checkpoint


def test_a_missing_script_fails_as_under_plain_python(tmp_path: Path) -> None:
    argv = ["gone.py", "--x"]
    plain = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True,
                           check=False)  # fmt: skip
    booted = subprocess.run([sys.executable, "-c", SCRIPT_BOOT, *argv], cwd=tmp_path,
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert booted.returncode == plain.returncode == 2
    assert booted.stderr == plain.stderr and "can't open file" in plain.stderr
