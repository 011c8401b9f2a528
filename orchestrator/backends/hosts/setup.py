"""`setup:`: shell commands that prepare every host (a virtualenv, pip installs) before a start.

The one place where the inventory asks for a shell. The commands run as one bash script per
machine and job directory, in the job directory, on every machine at once, each output line
prefixed with the host's name. The first failing command ends the script. On success the
commands' hash is written on the host (`{workdir}/{job}/.orchestrate-setup`), so the next start
skips setup while the commands are unchanged, whichever controller starts it; a changed
command, a new host (a spare that joins) or `--force-setup` runs it again.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.errors import HostError
from orchestrator.fanout import GroupResult, fan_out
from orchestrator.machines.kinds import kind_of

if TYPE_CHECKING:
    from orchestrator.machines.pool import Machines
    from orchestrator.model.inventory import WorkerSlot

MARKER = ".orchestrate-setup"
TAIL_LINES = 10

# $1 job directory, $2 the user's script, $3 marker path, $4 hash, $5 end-of-output sentinel.
# The sentinel line carries the exit status through a plain output stream (a pty, for SSH).
_WRAPPER = """\
mkdir -p -- "$1" && cd -- "$1" || { echo "$5 1"; exit 1; }
bash -c "$2" </dev/null 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then printf '%s\\n' "$4" > "$3" || rc=1; fi
echo "$5 $rc"
"""

LineSink = Callable[[str, str], None]  # (host name, line)


@dataclass(frozen=True)
class SetupOutcome:
    ran: bool  # False: the recorded hash matched, nothing ran
    exit_code: int = 0
    tail: tuple[str, ...] = ()


def setup_hash(commands: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(commands)).encode()).hexdigest()


def setup_script(commands: Sequence[str]) -> str:
    """One bash script: the commands in order, in one shell (a `cd` or `export` carries over),
    stopping at the first that fails with its exit code. Pure."""
    parts = []
    for number, command in enumerate(commands, 1):
        first = command.strip().splitlines()[0]
        parts.append(
            f"{{ {command}\n}} || {{ rc=$?; echo {_quote(f'setup: command {number} failed')}"
            f'" with exit code $rc: "{_quote(first)}; exit $rc; }}'
        )
    return "\n".join(parts) + "\n"


def setup_argv(commands: Sequence[str], job_directory: str, sentinel: str) -> list[str]:
    marker = posixpath.join(job_directory, MARKER)
    script = setup_script(commands)
    digest = setup_hash(commands)
    return ["bash", "-c", _WRAPPER, "orchestrate-setup", job_directory, script, marker, digest,
            sentinel]  # fmt: skip


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def run_setup(
    commands: Sequence[str],
    hosts: Sequence[WorkerSlot],
    job_dirs: dict[str, str],
    machines: Machines,
    on_line: LineSink,
    *,
    force: bool = False,
) -> GroupResult[str, SetupOutcome]:
    """Run the setup on every machine that lacks this hash (all with `force`), in parallel.
    Hosts sharing a machine and a job directory run it once. A failure is a result, by host."""
    firsts: dict[tuple[Any, ...], WorkerSlot] = {}
    for host in hosts:
        firsts.setdefault((*kind_of(host).machine_key(host), job_dirs[host.name]), host)
    by_name = {host.name: host for host in firsts.values()}
    digest = setup_hash(commands)

    def one(name: str) -> SetupOutcome:
        host = by_name[name]
        job_directory = job_dirs[name]
        if not force:
            recorded = machines.read_text(host, posixpath.join(job_directory, MARKER))
            if recorded is not None and recorded.strip() == digest:
                return SetupOutcome(ran=False)
        return _run_one(commands, host, job_directory, machines, on_line)

    return fan_out(by_name, one)


def _run_one(
    commands: Sequence[str],
    host: WorkerSlot,
    job_directory: str,
    machines: Machines,
    on_line: LineSink,
) -> SetupOutcome:
    sentinel = f"@@orchestrate-setup-{secrets.token_hex(8)}"
    tail: list[str] = []
    code: int | None = None
    for line in machines.stream(host, setup_argv(commands, job_directory, sentinel)):
        if line.startswith(sentinel):
            code = int(line.split()[-1])
            break
        on_line(host.name, line)
        tail = [*tail[-(TAIL_LINES - 1) :], line]
    if code is None:
        raise HostError(host.name, "setup ended without an exit status (connection lost?)",
                        hint="run 'orchestrate setup INVENTORY' again")  # fmt: skip
    return SetupOutcome(ran=True, exit_code=code, tail=tuple(tail))
