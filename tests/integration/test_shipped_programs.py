"""The host programs as they are shipped (hostside/bundle.py), in a real local `check`, `up`,
`status` and `jobs` of a script job: the agent's JoinWatch (procwatch.py, carried inside the
agent's text) says each worker joined its cluster. The hosts' interpreter is the system's
python3, where orchestrate is not installed, run through a wrapper that gives every process it
starts a PYTHONPATH and a user site of a neighbour's; those and the controller's working
directory (that of the host programs' `python -c`) hold planted modules named like the standard
library's and the shipped ones (tests/planted.py): no host program may import one (issue 40).
No TensorFlow: a stand-in library named like its framework library is what the watch looks for
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

from orchestrator.hostside.bundle import companions, hostside_source
from tests.conftest import Cli, clean_env, free_ports
from tests.planted import (
    ALL_NAMES,
    all_imports,
    host_program_imports,
    plant,
    python_with,
    user_site,
)

SYSTEM_PYTHON = "/usr/bin/python3"


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
    names = ALL_NAMES + tuple(carried)
    marker = cli.cwd / "planted-imports.txt"
    plant(cli.cwd, marker, names)  # the working directory every local host program starts in
    plant(cli.cwd / "shared-libs", marker, names)  # a neighbour's directory on PYTHONPATH
    plant(user_site(SYSTEM_PYTHON, cli.cwd / "userbase"), marker, names)
    python = python_with(
        cli.cwd / "python3",
        SYSTEM_PYTHON,
        PYTHONPATH=cli.cwd / "shared-libs",
        PYTHONUSERBASE=cli.cwd / "userbase",
    )
    hosts = "\n".join(
        f"  - {{name: worker-{i}, address: localhost, port: {port}, python: {python}}}"
        for i, port in enumerate(free_ports(2))
    )
    inventory = cli.cwd / "inv.yaml"
    inventory.write_text("defaults: {connection: local, workdir: ./work}\nhosts:\n" + hosts
                         + f"\njob: {{name: stand-in, script: {script}}}\n")  # fmt: skip
    checked = cli("check", str(inventory), timeout=120)  # the host probe
    assert "hostprobe" not in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    result = cli("up", "--skip-checks", str(inventory), timeout=120)  # leases, agent, minders
    assert result.returncode == 0, result.stdout + result.stderr
    assert cli("status", timeout=60).returncode == 0
    assert cli("jobs", str(inventory), timeout=60).returncode == 0  # the lease listing
    assert host_program_imports(marker) == [], all_imports(marker)
    runs = sorted((cli.cwd / "work" / "stand-in" / "runs").glob("*/attempt-0/worker-*"))
    assert [run.name for run in runs] == ["worker-0", "worker-1"]
    for run in runs:
        record = json.loads((run / "exit.json").read_text())
        assert (record["returncode"], record.get("joined")) == (0, True), record
        shipped = (run / "agent.py").read_text()  # the minder's copy: the modules inside
        header = shipped.splitlines()[0]
        assert header.startswith("# orchestrate: agent.py shipped with "), header
        assert all(f"{module}.py" in header for module in carried), header
