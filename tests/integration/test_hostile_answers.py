"""A host that answers with something orchestrate will not read (issue 40): a foreground `up`
neither dies with a traceback nor leaves its workers unsupervised. The host's `python` is a
man in the middle (a wrapper around the real interpreter) that replaces one `probe` answer of the
agent's session with a hostile line; the run goes on to its end and says what the host did.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.conftest import Cli, free_ports, stepping_script

HOSTILE_LINES = {
    "deep JSON": ("'[' * 100000", "JSON nested deeper than 32"),
    "a bare number": ("'5'", "JSON int, not an object"),
    "invalid UTF-8": ("b'{\"workers\": \"\\xff\"}'.decode('latin-1')", "a line that is not UTF-8"),
}

# The session programs' answers pass through; the `probe` answer numbered CORRUPT (counted over
# every session, in a file) is replaced. Anything else the host runs (workers, minders) is exec'd.
MIDDLE = """\
#!{python}
import json, os, subprocess, sys, threading
REAL, COUNT, CORRUPT = {python!r}, {count!r}, 3
if "-c" not in sys.argv[1:3]:
    os.execv(REAL, [REAL, *sys.argv[1:]])
child = subprocess.Popen([REAL, *sys.argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
verbs = []

def forward():
    for line in sys.stdin.buffer:
        verb = json.loads(line).get("verb")
        if verb != "wake":
            verbs.append(verb)
        child.stdin.write(line)
        child.stdin.flush()
    child.stdin.close()

threading.Thread(target=forward, daemon=True).start()
for line in child.stdout:
    if verbs and verbs.pop(0) == "probe":
        with open(COUNT, "a+") as counter:
            counter.write("p")
            counter.seek(0)
            if len(counter.read()) == CORRUPT:
                line = ({hostile}).encode("latin-1") + b"\\n"
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
sys.exit(child.wait())
"""

SCRIPT = stepping_script(40)


@pytest.mark.parametrize("name", list(HOSTILE_LINES))
def test_a_hostile_probe_answer_is_a_lost_poll_not_a_traceback(
    cli: Cli, reaper: list[str], name: str
) -> None:
    hostile, said = HOSTILE_LINES[name]
    python = cli.cwd / "python-in-the-middle"
    python.write_text(
        MIDDLE.format(python=sys.executable, count=str(cli.cwd / "probes"), hostile=hostile)
    )
    python.chmod(0o755)
    (cli.cwd / "train.py").write_text(SCRIPT)
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
    result = cli("up", "--skip-checks", "inv.yaml", timeout=120)
    reaper.append(cli.record()["run_id"])
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == 0, output
    assert "job demo succeeded" in result.stderr, output
    assert len((cli.cwd / "probes").read_text()) > 3, "the run ended before the hostile answer"
    assert f"answered `probe` with {said}" in output, output
