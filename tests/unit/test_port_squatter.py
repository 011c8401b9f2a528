"""A process that binds a worker's port and never listens (a squatter) is named by the host
probe, as a listener is (issue 54): before, only listening sockets were looked up, and such a
port was "in use" by nobody."""

from __future__ import annotations

import subprocess
import sys

from orchestrator.hostside import hostprobe
from tests.conftest import free_ports

SQUATTER = """\
import socket, sys
squat = socket.socket()
squat.bind(("0.0.0.0", int(sys.argv[1])))  # bound, never listening
print("bound", flush=True)
sys.stdin.read()
"""


def test_a_squatter_bound_without_listening_is_named() -> None:
    (port,) = free_ports(1)
    squatter = subprocess.Popen(
        [sys.executable, "-c", SQUATTER, str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert squatter.stdout is not None
        assert squatter.stdout.readline().strip() == "bound"
        holder = hostprobe._holder(port)
        assert holder is not None, "the port's holder was not found"
        assert holder["pid"] == squatter.pid
        assert "socket.socket()" in holder["command"]
    finally:
        squatter.communicate("")
