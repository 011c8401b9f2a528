"""Warm restarts on real processes with real TensorFlow: a standby per worker slot takes the slot's
next attempt; one started with another environment is discarded for a cold start; `down` leaves
none; a standby runs no TensorFlow op before the worker it becomes."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.hostside import rundir
from orchestrator.machines.hostclient import HostAgent
from orchestrator.machines.runner import LocalRunner
from tests.conftest import REPO, Cli, clean_env, free_ports, run_processes, wait_for
from tests.fakes.planning import plan_workers
from tests.planted import all_imports, host_program_imports, plant, python_with
from tests.scripts import STEPPER

pytestmark = pytest.mark.tf


def standby_dirs(cli: Cli) -> list[Path]:
    record = cli.record()
    return [
        Path(w["run_dir"]).parents[3] / "standby" / Path(w["run_dir"]).name  # {job}/standby/
        for w in record["workers"]
    ]


def ready_standbys(cli: Cli, attempt: int) -> list[int] | None:
    """The pids of both slots' standby children once both imported TensorFlow, for `attempt`."""
    record = cli.record()
    if record["attempt"] != attempt:
        return None
    pids = []
    for directory in standby_dirs(cli):
        spec = directory / "spec.json"
        if not (directory / "ready").exists() or not spec.exists():
            return None
        if Path(json.loads(spec.read_text())["backs"]).parent.name != f"attempt-{attempt}":
            return None
        pids.append(int((directory / "worker.pid").read_text()))
    return pids


def test_a_standby_imports_tensorflow_only_and_becomes_the_script(tmp_path: Path) -> None:
    """worker/standby.py by hand: no eager context exists when the script starts, and the script
    sees what `python SCRIPT ARGS` with that cwd and environment would give it."""
    script = tmp_path / "job" / "probe.py"
    script.parent.mkdir()
    script.write_text(
        textwrap.dedent("""\
        import json, os, sys
        from tensorflow.python.eager import context
        print(json.dumps({
            "eager_context": context._context is not None,
            "tensorflow_imported": "tensorflow" in sys.modules,
            "name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
            "tf_config": os.environ.get("TF_CONFIG"), "standby_var": os.environ.get("ONLY_SB"),
            "stdin": sys.stdin.read(),
        }))
        sys.exit(7)
        """)
    )
    ready = tmp_path / "ready"
    standby = subprocess.Popen(
        [sys.executable, "-m", "worker.standby", str(ready)],
        cwd=REPO, env=clean_env(ONLY_SB="1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(ready.exists, timeout=120, what="the standby's TensorFlow import")
    assert json.loads(ready.read_text())["pid"] == standby.pid
    env = clean_env(TF_CONFIG='{"cluster": {}}')
    request = {"argv": [sys.executable, str(script), "--flag"], "cwd": str(tmp_path), "env": env}
    out, err = standby.communicate(json.dumps(request) + "\n", timeout=60)
    assert standby.returncode == 7, err
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {
        "eager_context": False,  # nothing ran in TensorFlow before the script
        "tensorflow_imported": True,
        "name": "__main__",
        "argv": [str(script), "--flag"],
        "cwd": str(tmp_path),
        "path0": str(script.parent),
        "tf_config": '{"cluster": {}}',
        "standby_var": None,  # the worker's environment replaced the standby's
        "stdin": "",
    }


def stepper_inventory(cli: Cli) -> Path:
    (cli.cwd / "train.py").write_bytes(STEPPER.read_bytes())
    ports = free_ports(2)
    # A script job opts in (warm restarts are on by default for task jobs only).
    job = {"name": "demo", "script": "train.py", "restart_backoff": 0, "secret_env": ["TOKEN"],
           "warm_restarts": True, "env": {"STEPS": 100_000, "DELAY": 0.05}}  # fmt: skip
    path = cli.cwd / "inv.yaml"
    path.write_text(
        "defaults: {connection: local, workdir: ./work}\n"
        "hosts:\n"
        f"  - {{name: alpha, address: localhost, port: {ports[0]}}}\n"
        f"  - {{name: beta, address: localhost, port: {ports[1]}}}\n"
        f"job: {json.dumps(job)}\n"
    )
    return path


def test_a_launch_takes_a_matching_standby_and_discards_one_with_another_environment(
    cli: Cli, reaper: list[str]
) -> None:
    """The host agent itself (the real one, through the local runner): standbys started with
    TOKEN=old; attempt 1's alpha has the same environment and is handed to its standby, beta's
    secret was rotated, so beta's standby is discarded and beta starts cold. The host's Python
    has a neighbour's directory on its PYTHONPATH: neither the agent, the standby's minder nor
    the one it execs at the hand-over imports the modules planted there (issue 40)."""
    inventory = load_inventory(stepper_inventory(cli))
    run_id = "20260101-000000-beef"
    reaper.append(run_id)
    workdirs = {h.name: h.workdir for h in inventory.hosts}
    marker = cli.cwd / "planted-imports.txt"
    plant(cli.cwd / "shared-libs", marker)
    python = python_with(cli.cwd / "python3", sys.executable, PYTHONPATH=cli.cwd / "shared-libs")
    agent = HostAgent(LocalRunner("local"), python)
    old = plan_workers(inventory, run_id, workdirs, attempt=0, secrets={"TOKEN": "old"})
    answers = agent.standby([spec.standby_request(linger=120) for spec in old])
    assert set(answers.values()) == {"started"}, answers
    directories = [Path(rundir.standby_dir(spec.run_dir)) for spec in old]
    wait_for(lambda: all((d / "ready").exists() for d in directories), 120, "standbys ready")
    standby = {d.name: int((d / "worker.pid").read_text()) for d in directories}
    alpha, _ = plan_workers(inventory, run_id, workdirs, attempt=1, secrets={"TOKEN": "old"})
    _, beta = plan_workers(inventory, run_id, workdirs, attempt=1, secrets={"TOKEN": "new"})
    try:
        for spec in (alpha, beta):
            agent.launch(spec.launch_request())
        worker_pids = {
            spec.name: int(
                wait_for(functools.partial(_read, spec.run_dir, "worker.pid"), 30, "pid")
            )
            for spec in (alpha, beta)
        }
        assert worker_pids["alpha"] == standby["alpha"]  # the standby became the worker
        assert worker_pids["beta"] != standby["beta"]
        wait_for(lambda: not alive(standby["beta"]), 10, "beta's standby gone")
        beta_log = Path(beta.log_path).read_text()
        assert "cold start: the standby's environment differs from this attempt's" in beta_log
        alpha_log = wait_for(lambda: "start 0 of" in (_read(alpha.run_dir, "worker.log") or ""),
                             30, "alpha's script running")  # fmt: skip
        assert alpha_log
        assert "warm start" in (_read(alpha.run_dir, "worker.log") or "")
    finally:
        agent.stop([alpha.run_dir, beta.run_dir], grace=2)
        agent.discard_standbys([alpha.run_dir, beta.run_dir])
    assert run_processes(run_id) == []
    assert host_program_imports(marker) == [], all_imports(marker)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _read(run_dir: str, name: str) -> str | None:
    try:
        return (Path(run_dir) / name).read_text()
    except FileNotFoundError:
        return None


def test_down_leaves_no_standby_and_status_counts_none(cli: Cli, reaper: list[str]) -> None:
    stepper_inventory(cli)
    up = subprocess.run(
        [sys.executable, "-m", "orchestrator", "up", "--detach", "--skip-checks", "inv.yaml"],
        cwd=cli.cwd, env=clean_env(TOKEN="value"), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    pids = wait_for(lambda: ready_standbys(cli, 0), timeout=120, what="standbys ready")
    status = cli.status()
    assert [w["name"] for w in status["workers"]] == ["alpha", "beta"]
    assert not {w["pid"] for w in status["workers"]} & set(pids)
    cli("down", check=True)
    assert not any(alive(pid) for pid in pids)
    assert run_processes(run_id) == []
