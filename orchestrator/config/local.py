"""A zero-config inventory for `orchestrate local SCRIPT`: N local workers on free localhost
ports, like `torchrun --standalone --nproc-per-node N`. Pure apart from finding the free ports.

The result is an ordinary inventory file, so `local` runs exactly what `up` runs on it (preflight,
start, supervision) and a user can keep it (--save) and grow it into a real cluster.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from orchestrator.contract import KERAS_DEFAULT

_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]+")


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now, bound the way TensorFlow binds them (0.0.0.0), all held at
    once so no two are the same."""
    with ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("0.0.0.0", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]


def job_name(script: Path) -> str:
    name = _NAME_CHARACTERS.sub("-", script.stem).strip("-.")
    return name or "job"


def local_inventory(
    script: Path,
    ports: Sequence[int],
    args: Sequence[str] = (),
    *,
    keras: str = KERAS_DEFAULT,
    max_restarts: int | None = None,
    workdir: str | None = None,
) -> str:
    """The inventory's YAML text: one local worker per port, worker-0 the chief.

    Values are written as JSON scalars (valid YAML), so any script path or argument survives."""

    def scalar(value: object) -> str:
        return json.dumps(value)

    lines = [
        f"# Written by 'orchestrate local {script.name}': {len(ports)} worker(s) on this machine.",
        "# Run it again with 'orchestrate up THIS_FILE'; change 'connection' and 'address' of",
        "# each host (see inventory/cluster.example.yaml) to run the same job on several machines.",
        "defaults:",
        "  connection: local",
    ]
    if workdir is not None:
        lines.append(f"  workdir: {scalar(workdir)}")
    lines.append("hosts:")
    for index, port in enumerate(ports):
        lines.append(f"  - {{name: worker-{index}, address: localhost, port: {port}}}")
    lines += ["job:", f"  name: {scalar(job_name(script))}", f"  script: {scalar(str(script))}"]
    if args:
        lines.append(f"  args: [{', '.join(scalar(a) for a in args)}]")
    if keras != KERAS_DEFAULT:
        lines.append(f"  keras: {scalar(keras)}")
    if max_restarts is not None:
        lines.append(f"  max_restarts: {max_restarts}")
    return "\n".join(lines) + "\n"
