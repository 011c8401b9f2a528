"""The host agent as it is shipped (machines/bundle.py), in a real local `up` of a script job:
its JoinWatch (hostside/procwatch.py, carried inside the agent's text) says each worker
joined its cluster. The hosts' interpreter is the system's python3, where orchestrate is not
installed, and the controller's working directory (that of the agents' `python -c`) holds
planted copies of every module the agent carries (procwatch.py, rundir.py, contract.py, ...)
that end any process importing them: the agent can only have used the copies it carried. No
TensorFlow: a stand-in library named like its framework library is what the watch looks for
(tests/unit/test_join_watch.py has the same stand-in)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from orchestrator.machines.bundle import companions, hostside_source
from tests.conftest import Cli, clean_env, free_ports

SYSTEM_PYTHON = "/usr/bin/python3"
PLANTED = "import sys\nsys.stderr.write('the planted copy was imported')\nsys.exit(9)\n"


def _libm_path() -> str:
    name = Path(str(ctypes.CDLL(ctypes.util.find_library("m"))._name)).name
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(name) or f"/{name}" in line:
            return line.split()[-1]
    raise AssertionError(f"{name} is not mapped")


def test_the_shipped_agent_watches_a_local_script_job_join(cli: Cli) -> None:
    missing = subprocess.run([SYSTEM_PYTHON, "-c", "import orchestrator"], cwd=cli.cwd,
                             env=clean_env(), capture_output=True, check=False)  # fmt: skip
    if missing.returncode == 0:
        pytest.fail(f"{SYSTEM_PYTHON} imports orchestrator: this test needs one that cannot")
    lib = cli.cwd / "libtensorflow_framework.so.2"
    shutil.copyfile(_libm_path(), lib)
    script = cli.cwd / "stand_in.py"
    script.write_text(
        textwrap.dedent(f"""\
        import ctypes, json, os, socket, time
        ctypes.CDLL({str(lib)!r})  # "TensorFlow" is loaded
        config = json.loads(os.environ["TF_CONFIG"])
        port = int(config["cluster"]["worker"][config["task"]["index"]].rsplit(":", 1)[1])
        server = socket.socket()
        server.bind(("127.0.0.1", port))
        server.listen()
        time.sleep(1.5)  # the watch samples every 0.2 s
        """)
    )
    carried = companions(hostside_source("agent.py"))
    assert {"procwatch", "rundir", "contract"} <= set(carried)
    for module in carried:
        (cli.cwd / f"{module}.py").write_text(PLANTED)
    hosts = "\n".join(
        f"  - {{name: worker-{i}, address: localhost, port: {port}, python: {SYSTEM_PYTHON}}}"
        for i, port in enumerate(free_ports(2))
    )
    inventory = cli.cwd / "inv.yaml"
    inventory.write_text("defaults: {connection: local, workdir: ./work}\nhosts:\n" + hosts
                         + f"\njob: {{name: stand-in, script: {script}}}\n")  # fmt: skip
    result = cli("up", "--skip-checks", str(inventory), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted((cli.cwd / "work" / "stand-in" / "runs").glob("*/attempt-0/worker-*"))
    assert [run.name for run in runs] == ["worker-0", "worker-1"]
    for run in runs:
        record = json.loads((run / "exit.json").read_text())
        assert (record["returncode"], record.get("joined")) == (0, True), record
        shipped = (run / "agent.py").read_text()  # the minder's copy: the modules inside
        header = shipped.splitlines()[0]
        assert header.startswith("# orchestrate: agent.py shipped with "), header
        assert all(f"{module}.py" in header for module in carried), header
