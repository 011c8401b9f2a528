"""Inventories and run records made to hurt the controller (issue 54): a fifo, a link to
/dev/zero, a "billion laughs" of YAML aliases, a document nested 100 000 deep, a huge file; an
Ansible inventory that is a fifo or a device; a run record nested too deep; a state directory
that cannot be written. Each ends in seconds with a message and its exit code, in a process
whose memory and time are capped here (so that a failure does not hang or swap the machine).
Everything is made inside the test's own temporary directory.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import Cli, clean_env, detached_supervisors, free_ports, run_processes

MEMORY_CAP = 1 << 30  # bytes of address space of the capped `orchestrate`
TIME_CAP = 60  # seconds; each case takes about one

HOST = "hosts: [{name: alpha, address: localhost, port: 30000}]\njob: {name: demo, script: t.py}\n"


def _laughs() -> str:
    lines = ["l0: &l0 [a, b, c, d, e, f, g, h, i]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    # visible_gpus is checked as a list of integers, and was printed whole when it was not one:
    # 9 ** 10 letters.
    host = "{name: a, address: localhost, port: 30000, visible_gpus: *l9}"
    return "\n".join(lines) + f"\nhosts: [{host}]\njob: {{name: demo, script: t.py}}\n"


def _capped(args: list[str], cwd: Path, file_size: int | None = None) -> tuple[int, str]:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
        if file_size is not None:  # a full disk, as far as this process can tell
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    try:
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=clean_env(),
            capture_output=True, text=True, timeout=TIME_CAP, preexec_fn=limits, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"orchestrate {' '.join(args)} ran over {TIME_CAP} s: {exc.stderr!r}")
    # The console folds a message at 160 columns, here often inside a long temporary path's
    # message: compare its words, with single spaces.
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _make(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "laughs":
        path.write_text(_laughs())
    elif kind == "deep":
        path.write_text("hosts: " + "[" * 100_000 + "]" * 100_000 + "\n")
    elif kind == "huge":  # four times the cap, every line a host
        lines = (f"  - {{name: h{i}, address: 10.0.{i // 250 % 250}.{i % 250 + 1}, port: 30000}}"
                 for i in range(80_000))  # fmt: skip
        path.write_text("hosts:\n" + "\n".join(lines) + "\njob: {name: demo, script: t.py}\n")


INVENTORIES = {
    "fifo": "a fifo (named pipe), not a regular file",
    "zero": "a character device, not a regular file",
    "laughs": "holds more than 200000 values once its aliases",
    "deep": "nested deeper than 32 levels",
    "huge": "over the limit of 256.0 KiB",
}


@pytest.mark.parametrize("kind", list(INVENTORIES))
def test_a_hostile_inventory_is_refused_in_seconds_with_bounded_memory(
    tmp_path: Path, kind: str
) -> None:
    _make(kind, tmp_path / "inv.yaml")
    code, output = _capped(["hosts", "inv.yaml"], tmp_path)
    assert "Traceback" not in output, output
    assert code == 2, output
    assert INVENTORIES[kind] in output, output
    assert len(output) < 5000, f"{len(output)} characters of output"


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_hostile_ansible_inventory_is_refused_before_ansible_reads_it(
    tmp_path: Path, kind: str
) -> None:
    _make(kind, tmp_path / "hosts.ini")
    (tmp_path / "inv.yaml").write_text("ansible: {inventory: hosts.ini}\n" + HOST.split("\n")[1])
    code, output = _capped(["hosts", "inv.yaml"], tmp_path)
    assert "Traceback" not in output, output
    assert code == 2, output
    assert INVENTORIES[kind] in output, output


def test_a_run_record_nested_too_deep_is_a_message(tmp_path: Path) -> None:
    runs = tmp_path / ".orchestrate" / "runs"
    runs.mkdir(parents=True, mode=0o700)
    (tmp_path / ".orchestrate").chmod(0o700)
    (runs / "20260101-000000-dead.json").write_text("[" * 60_000)
    (tmp_path / ".orchestrate" / "current").write_text("20260101-000000-dead\n")
    code, output = _capped(["status"], tmp_path)
    assert "Traceback" not in output, output
    assert code == 4, output
    assert "JSON nested too deep for a run record" in output, output


def test_a_state_directory_that_cannot_be_written_is_exit_3_naming_it(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print('never started')\n")
    (tmp_path / "inv.yaml").write_text(HOST)
    code, output = _capped(["up", "--skip-checks", "inv.yaml"], tmp_path, file_size=0)
    assert "Traceback" not in output, output
    assert code == 3, output
    assert f"cannot write {tmp_path}/.orchestrate/" in output, output


def _held_within(lock: Path, run_id: str, seconds: float) -> bool:
    """Whether the run's detached supervisor holds its lock (it writes its pid there once it
    holds the flock), within `seconds`. Read, never locked: a test's flock could turn it away."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        said = lock.read_text().strip() if lock.exists() else ""
        if said and int(said) in {p.pid for p in detached_supervisors(run_id)}:
            return True
        time.sleep(0.05)
    return False


def test_down_stops_live_workers_when_the_run_record_is_damaged(
    cli: Cli, reaper: list[str]
) -> None:
    (cli.cwd / "train.py").write_text(
        "import os, time\nopen(os.environ['ORCHESTRATE_PROGRESS_FILE'], 'w').write('{\"step\": 1}')"
        "\ntime.sleep(600)\n"
    )
    (port,) = free_ports(1)
    (cli.cwd / "inv.yaml").write_text(
        textwrap.dedent(f"""\
        hosts: [{{name: alpha, connection: local, address: localhost, port: {port}}}]
        job: {{name: demo, script: train.py}}
        """)
    )
    cli("up", "--detach", "--skip-checks", "inv.yaml", check=True)
    record = cli.record()
    reaper.append(record["run_id"])
    runs = cli.cwd / ".orchestrate" / "runs"
    lock = runs / f"{record['run_id']}.lock"
    assert _held_within(lock, record["run_id"], 30), "no supervisor took the run"
    path = runs / f"{record['run_id']}.json"
    path.write_text(path.read_text()[:100])  # truncated, as a full disk would leave it
    result = cli("down", "--grace", "5", timeout=60)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == 0, output
    assert "its supervisor stopped it" in output, output
    assert run_processes(record["run_id"]) == [], "workers outlived 'down'"


def test_an_ssh_key_that_is_a_fifo_is_refused_before_paramiko_reads_it(tmp_path: Path) -> None:
    # paramiko reads a key file whole when it logs in: a fifo blocked the login for good.
    os.mkfifo(tmp_path / "id_key")
    (tmp_path / "inv.yaml").write_text(
        "hosts: [{name: a, address: 10.9.9.9, port: 30000, ssh_key: id_key}]\n"
        + HOST.split("\n")[1]
    )
    code, output = _capped(["hosts", "inv.yaml"], tmp_path)
    assert "Traceback" not in output, output
    assert code == 2, output
    assert f"ssh_key: cannot read {tmp_path}/id_key: a fifo (named pipe)" in output, output
