"""JoinWatch: whether a worker listened on its TensorFlow port, sampled from /proc. One module,
hostside/procwatch.py, shipped inside the host agent and the Slurm launcher
(hostside/bundle.py); run here against real processes: one that listens on its port, one that
never does, and one that never loads TensorFlow (a stand-in "TensorFlow": a copy of libm named
like its framework library, which is what the watch looks for in /proc/PID/maps). Then each
shipped program: it carries the module and imports that copy, never one found where it runs."""

from __future__ import annotations

import ctypes
import ctypes.util
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.slurm import script
from orchestrator.export import trainjob
from orchestrator.hostside import (
    agent,
    bundle,
    control,
    hostprobe,
    leases,
    minder,
    pod_launcher,
    procwatch,
    rundir,
    safefiles,
)
from orchestrator.hostside import slurm_launcher as launcher
from orchestrator.machines.hostclient import host_program


def config(port: int, workers: int = 2, index: int = 0) -> str:
    cluster = {"worker": [f"localhost:{port + i}" for i in range(workers)]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def test_the_port_of_a_multi_worker_task_only() -> None:
    assert procwatch.cluster_port(config(20000, index=1)) == 20001
    assert procwatch.cluster_port(json.loads(config(20000))) == 20000  # the launcher's dict
    assert procwatch.cluster_port(config(20000, workers=1)) is None  # one worker: exempt
    assert procwatch.cluster_port("not json") is None
    assert procwatch.cluster_port(json.dumps({"cluster": {}, "task": {}})) is None


def _path_of(library: ctypes.CDLL) -> str:
    """The file a loaded library came from, read from this process's own maps."""
    name = Path(str(library._name)).name
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(name) or f"/{name}" in line:
            return line.split()[-1]
    raise AssertionError(f"{name} is not mapped")


def stand_in(tmp_path: Path, *, tensorflow: bool, listen: bool) -> tuple[list[str], int]:
    """A process that (maybe) maps a library named like TensorFlow's, (maybe) listens on a
    free port, then waits; and that port."""
    lib = tmp_path / "libtensorflow_framework.so.2"
    libm = ctypes.util.find_library("m")
    assert libm is not None
    found = ctypes.CDLL(libm)  # its path, as the dynamic loader resolves it
    shutil.copyfile(_path_of(found), lib)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = textwrap.dedent(f"""\
        import ctypes, socket, sys, time
        if {tensorflow}:
            ctypes.CDLL({str(lib)!r})
        server = socket.socket(socket.AF_INET6)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other = socket.socket()  # a socket that is not the port: still not joined
        if {listen}:
            server.bind(("::", {port}))
            server.listen()
        print("ready", flush=True)
        time.sleep(0.5)
        """)
    return [sys.executable, "-c", code], port


@pytest.mark.parametrize(
    ("tensorflow", "listen", "joined"),
    [(True, True, True), (True, False, False), (False, False, None)],
)
def test_a_real_process_is_seen_joined_or_not(
    tmp_path: Path, tensorflow: bool, listen: bool, joined: bool | None
) -> None:
    argv, port = stand_in(tmp_path, tensorflow=tensorflow, listen=listen)
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        watch = procwatch.JoinWatch(child.pid, config(port), interval=0.05)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.wait(timeout=30)
        assert watch.joined() is joined
    finally:
        child.kill()
        child.wait()


def test_a_one_worker_task_is_not_watched() -> None:
    watch = procwatch.JoinWatch(1, config(20000, workers=1))
    assert watch.port is None and watch.joined() is None


def test_a_long_life_is_sampled_ever_more_rarely() -> None:
    # A script job that never listens is watched all its life: 5 s apart after 5 minutes.
    ages = (0, 29.9, 30, 299.9, 300, 86400)
    assert [procwatch._sample_interval(age, 0.2) for age in ages] == [0.2, 0.2, 1, 1, 5, 5]


# --- shipped: the programs carry the modules they import (procwatch.py, contract.py, ...) -----

# Each program as it leaves the controller, and the modules it must carry.
SHIPPED = {
    "agent.py": (lambda: host_program("agent.py"),
                 ("contract", "protocol", "safefiles", "rundir", "control", "files", "procwatch",
                  "minder", "standbypolicy", "standbys")),
    "hostprobe.py": (lambda: host_program("hostprobe.py"),
                     ("contract", "protocol", "perfprobe", "workerpath")),
    "leases.py": (lambda: host_program("leases.py"),
                  ("claims", "contract", "leasepolicy", "protocol", "safefiles", "leasedir",
                   "leasequeue", "rundir")),
    "launcher.py": (lambda: script.LAUNCHER_SOURCE,
                    ("contract", "procwatch", "protocol", "safefiles", "rundir")),
    "pod_launcher.py": (lambda: trainjob.LAUNCHER_SOURCE, ("contract",)),
}  # fmt: skip
CARRIED = sorted({module for _, needed in SHIPPED.values() for module in needed})
USERS = {"agent.py": agent, "hostprobe.py": hostprobe, "leases.py": leases,
         "launcher.py": launcher, "pod_launcher.py": pod_launcher}  # fmt: skip
# Where the controller imports each carried module from.
PACKAGED = {"contract": "orchestrator.contract"}
# Planted where a host would look for a module of that name (the working directory of
# `python -c`, the directory of a program run as a file): importing it must never happen.
PLANTED = "import sys\nsys.stderr.write('the planted copy was imported')\nsys.exit(9)\n"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_shipped_program_carries_the_modules_it_imports(name: str) -> None:
    source, needed = SHIPPED[name][0](), SHIPPED[name][1]
    assert bundle.companions(inspect.getsource(USERS[name])) == list(needed)
    for module in needed:
        assert repr(bundle.hostside_source(f"{module}.py")) in source, module
    namespace: dict[str, Any] = {"__name__": "shipped"}  # not __main__: nothing is served
    exec(compile(source, name, "exec"), namespace)  # our own source
    for module in needed:  # the carried copy, though orchestrate is importable in this process
        carried = sys.modules[module]  # the bundle put it there, under its plain name
        assert carried.__file__ == f"<shipped {module}.py>"
        assert carried is not sys.modules[PACKAGED.get(module, f"orchestrator.hostside.{module}")]
        assert namespace.get(module, carried) is carried  # what the program imported
    if "procwatch" in needed:  # and the program uses it
        assert sys.modules["procwatch"].cluster_port(config(20000, index=1)) == 20001


def test_a_program_that_imports_nothing_of_its_own_is_sent_unchanged() -> None:
    assert host_program("withenv.py") == bundle.hostside_source("withenv.py")


def test_the_users_share_one_join_watch_and_one_set_of_file_helpers() -> None:
    assert minder.procwatch is procwatch and launcher.procwatch is procwatch
    assert agent.safefiles is safefiles is launcher.safefiles is leases.safefiles
    assert minder.rundir is rundir is launcher.rundir is leases.rundir is control.rundir
    assert not hasattr(minder, "JoinWatch") and not hasattr(launcher, "JoinWatch")


def isolated(tmp_path: Path) -> dict[str, str]:
    """A directory holding a planted copy of every module a program carries, and an
    environment in which Python finds nothing but the standard library (-S below: no
    site-packages, so no orchestrate), as on a host with a bare interpreter."""
    for module in CARRIED:
        (tmp_path / f"{module}.py").write_text(PLANTED)
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}


def test_the_shipped_agent_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    env = isolated(tmp_path)
    private = [str(tmp_path / "r")]
    ask = json.dumps({"verb": "make-dirs", "directories": [], "private_dirs": private})
    done = subprocess.run([sys.executable, "-S", "-c", host_program("agent.py")], cwd=tmp_path,
                          env=env, input=ask + "\n", capture_output=True, text=True, timeout=30,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "error" not in json.loads(done.stdout), done.stdout
    assert oct((tmp_path / "r").stat().st_mode & 0o777) == oct(0o700)  # safefiles did it
    # The minder's form: the agent's source written to a run directory and run as a file,
    # beside a planted procwatch.py: its JoinWatch says whether a stand-in worker joined.
    run = tmp_path / "run"
    run.mkdir()
    (run / "agent.py").write_text(host_program("agent.py"))
    for module in CARRIED:
        (run / f"{module}.py").write_text(PLANTED)
    argv, port = stand_in(tmp_path, tensorflow=True, listen=True)
    (run / "tf_config.json").write_text(config(port))
    spec = {"argv": argv, "cwd": str(tmp_path), "env": {}}
    (run / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "-S", str(run / "agent.py"), "supervise", str(run)],
                          cwd=run, env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads((run / "exit.json").read_text())
    assert (record["returncode"], record.get("joined")) == (0, True), record


def test_the_shipped_launcher_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    env = isolated(tmp_path)
    argv, port = stand_in(tmp_path, tensorflow=True, listen=False)
    run_dir = tmp_path / "runs" / "t0"
    task = {"run_dir": str(run_dir), "private_dirs": [str(tmp_path / "runs"), str(run_dir)],
            "cwd": str(tmp_path), "env": {}, "argv": argv}  # fmt: skip
    plan = {"port": port, "secret_env": [], "tasks": [task, task]}  # two tasks: watched
    env.update({launcher.PLAN_ENV: json.dumps(plan), "SLURM_PROCID": "0", "SLURM_JOB_ID": "9",
                "SLURM_STEP_NODELIST": "localhost,n2"})  # fmt: skip
    done = subprocess.run([sys.executable, "-S", "-c", script.LAUNCHER_SOURCE], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads((run_dir / "exit.json").read_text())
    assert record.get("joined") is False, record  # it loaded "TensorFlow", never listened
    assert oct((tmp_path / "runs").stat().st_mode & 0o777) == oct(0o700)
    assert os.listdir(run_dir)  # the launcher's files, written through safefiles


def test_programs_are_bundled_from_many_threads_at_once() -> None:
    # The preflight and the launch open every host's session from its own thread; CPython 3.11's
    # ast.parse failed there with "AST constructor recursion depth mismatch" (8 times in one CI
    # run; this loop rarely reproduces it on its own, the cache check below always applies).
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.hostside import bundle

    source = bundle.hostside_source("agent.py")
    expected = bundle.imported(source)
    with ThreadPoolExecutor(max_workers=16) as pool:
        found = list(pool.map(lambda _: bundle.imported(source), range(200)))
    assert found == [expected] * 200
    assert bundle.shipped_program("agent.py") is bundle.shipped_program("agent.py")  # once
