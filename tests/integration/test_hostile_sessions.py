"""A host whose answers come too slowly or once too often (issue 54): a foreground `up` neither
freezes on an answer that dribbles in nor reads every later answer as the next request's. The
host's `python` is a man in the middle (a wrapper around the real interpreter) that does one
thing to the third `probe` answer of the agent's sessions, counted over every session in a file;
every request it forwards is counted in another, so the test sees how often the host was asked.
"""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from tests.cluster.inventories import write_inventory
from tests.cluster.pytest_support import SharedCluster
from tests.conftest import Cli, free_ports, stepping_script

# What the middle does to the CORRUPT-th probe answer:
#   dribble: sends it one byte a second (it would take minutes), then nothing more;
#   twice:   sends it, and then once more (one answer too many: the session is out of step).
MIDDLE = """\
#!{python}
import json, os, subprocess, sys, threading, time
REAL, COUNT, ASKED, MODE, CORRUPT = {python!r}, {count!r}, {asked!r}, {mode!r}, 3
if "-c" not in sys.argv[1:3]:
    os.execv(REAL, [REAL, *sys.argv[1:]])
child = subprocess.Popen([REAL, *sys.argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
verbs = []

def forward():
    for line in sys.stdin.buffer:
        verb = json.loads(line).get("verb")
        if verb != "wake":
            verbs.append(verb)
            with open(ASKED, "a") as asked:
                asked.write("r")
        child.stdin.write(line)
        child.stdin.flush()
    child.stdin.close()

def corrupt():
    with open(COUNT, "a+") as counter:
        counter.write("p")
        counter.seek(0)
        return len(counter.read()) == CORRUPT

threading.Thread(target=forward, daemon=True).start()
for line in child.stdout:
    if verbs and verbs.pop(0) == "probe" and corrupt():
        if MODE == "dribble":
            for byte in line:
                sys.stdout.buffer.write(bytes([byte]))
                sys.stdout.buffer.flush()
                time.sleep(1)
        else:
            sys.stdout.buffer.write(line)
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
sys.exit(child.wait())
"""

# After its last step the script stays until the host has been probed a fourth time (60 s at
# most): the third, hostile, answer then comes while the run is live. On a loaded machine the
# third probe was once the one after both workers' exits, which the run's end read without a
# word, and the test saw no hostile answer although one was sent.
SCRIPT = stepping_script(60) + textwrap.dedent("""\
    deadline = time.time() + 60
    while time.time() < deadline and not (
        os.path.exists(PROBES_FILE) and len(open(PROBES_FILE).read()) >= 4
    ):
        time.sleep(0.1)
    """)

# What `up` says of the host meanwhile. One answer too many is read by the next request (a
# watch, which says nothing when it fails): its session is dropped, the next probe opens another.
SAID = {"dribble": "no whole answer (", "twice": ""}


def _middle(cli: Cli, mode: str) -> str:
    python = cli.cwd / "python-in-the-middle"
    python.write_text(
        MIDDLE.format(
            python=sys.executable,
            count=str(cli.cwd / "probes"),
            asked=str(cli.cwd / "asked"),
            mode=mode,
        )
    )
    python.chmod(0o755)
    (cli.cwd / "train.py").write_text(SCRIPT.replace("PROBES_FILE", repr(str(cli.cwd / "probes"))))
    return str(python)


@pytest.mark.parametrize("mode", list(SAID))
def test_a_slow_or_extra_answer_is_a_lost_poll_not_a_frozen_or_spinning_session(
    cli: Cli, reaper: list[str], mode: str
) -> None:
    python = _middle(cli, mode)
    port_a, port_b = free_ports(2)
    (cli.cwd / "inv.yaml").write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: ./work, python: {python}}}
        hosts:
          - {{name: alpha, address: localhost, port: {port_a}}}
          - {{name: beta, address: 127.0.0.1, port: {port_b}}}
        job: {{name: demo, script: train.py, restart_backoff: 0}}
        """)
    )
    _up_survives(cli, reaper, mode)


@pytest.mark.netns
def test_an_answer_that_dribbles_in_over_ssh_is_a_lost_poll(
    cli: Cli, reaper: list[str], namespace_hosts: SharedCluster
) -> None:
    """The same over real SSH (paramiko's channel: the timeout was per recv there)."""
    cluster = namespace_hosts.hosts(2)
    python = _middle(cli, "dribble")
    job = {"name": "demo", "script": "train.py", "restart_backoff": 0}
    write_inventory(cli.cwd / "inv.yaml", cluster, job, defaults={"python": python})
    _up_survives(cli, reaper, "dribble")


def _up_survives(cli: Cli, reaper: list[str], mode: str) -> None:
    started = time.monotonic()
    # Before issue 54 this `up` never ended (an answer a byte a second held it; one answer
    # too many left every later one out of step): the bound turns that into a failure.
    popen = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        stdout, stderr = popen.communicate(timeout=120)
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.communicate()
        reaper.append(cli.record()["run_id"])
    took = time.monotonic() - started
    output = stdout + stderr
    assert "Traceback" not in output, output
    assert popen.returncode == 0, output
    assert "job demo succeeded" in stderr, output
    assert len((cli.cwd / "probes").read_text()) > 3, "the run ended before the hostile answer"
    assert SAID[mode] in output, output
    # A session out of step was asked ~170 times a second: a few a second is a poll.
    asked = len((cli.cwd / "asked").read_text())
    assert asked < 10 * took, f"{asked} requests in {took:.0f} s"
