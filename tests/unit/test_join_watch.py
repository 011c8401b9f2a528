"""JoinWatch: whether a worker listened on its TensorFlow port, sampled from /proc. The host
agent and the Slurm launcher each carry a copy (both are sent alone, stdlib only); both copies
are run here against real processes: one that listens on its port, one that never does, and one
that never loads TensorFlow (a stand-in "TensorFlow": a copy of libm named like its framework
library, which is what the watch looks for in /proc/PID/maps)."""

from __future__ import annotations

import ctypes
import ctypes.util
import inspect
import json
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator.backends.slurm import launcher
from orchestrator.machines.remote import agent

COPIES = [agent, launcher]
SHARED = ("_cluster_port", "_process_tree", "_socket_inodes", "_listens", "_loads_tensorflow",
          "JoinWatch")  # fmt: skip


def config(port: int, workers: int = 2, index: int = 0) -> str:
    cluster = {"worker": [f"localhost:{port + i}" for i in range(workers)]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def test_both_copies_are_the_same_code() -> None:
    for name in SHARED:
        assert inspect.getsource(getattr(agent, name)) == inspect.getsource(
            getattr(launcher, name)
        ), name


@pytest.mark.parametrize("copy", COPIES)
def test_the_port_of_a_multi_worker_task_only(copy: ModuleType) -> None:
    assert copy._cluster_port(config(20000, index=1)) == 20001
    assert copy._cluster_port(json.loads(config(20000))) == 20000  # the launcher's dict
    assert copy._cluster_port(config(20000, workers=1)) is None  # one worker: exempt
    assert copy._cluster_port("not json") is None
    assert copy._cluster_port(json.dumps({"cluster": {}, "task": {}})) is None


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


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize(
    ("tensorflow", "listen", "joined"),
    [(True, True, True), (True, False, False), (False, False, None)],
)
def test_a_real_process_is_seen_joined_or_not(
    tmp_path: Path, copy: ModuleType, tensorflow: bool, listen: bool, joined: bool | None
) -> None:
    argv, port = stand_in(tmp_path, tensorflow=tensorflow, listen=listen)
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        watch = copy.JoinWatch(child.pid, config(port), interval=0.05)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.wait(timeout=30)
        assert watch.joined() is joined
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("copy", COPIES)
def test_a_one_worker_task_is_not_watched(copy: ModuleType) -> None:
    watch = copy.JoinWatch(1, config(20000, workers=1))
    assert watch.port is None and watch.joined() is None
