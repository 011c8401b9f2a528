"""What a worker writes cannot drive the user's terminal or crash the controller (issue 41), on
real local runs of a plain script job (no TensorFlow), through the real CLI:

- a log line with ESC]0;...BEL ESC[2J shows escaped in `up`'s output, `status` and `tail`
  (`tail --raw` keeps it as written), and so does a lease file of that name in `jobs`, `check`;
- a progress file reporting steps_per_sec=1e-320, a NaN loss and an infinite accuracy: a
  foreground `up` supervises the run to success, `status` shows the numbers as unknown, and
  every command with --json prints strict JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import Cli, free_ports, local_inventory, wait_for

HOSTILE = "\x1b]0;pwned\x07\x1b[2J"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J"

# Prints the hostile line last and fails with it: it is the worker's reason and the root cause.
PRINTS_ESCAPES = f"""\
import sys
print("step 1 \\x1b[32mgreen\\x1b[0m", flush=True)
raise SystemExit({HOSTILE!r} + "boom")
"""

# Reports absurd numbers at every step, then succeeds: it holds at step 1 until the test has
# looked at it running (the file `go-on` in its directory), however loaded the machine is.
REPORTS_ABSURD_NUMBERS = """\
import json, os, time
progress = os.environ["ORCHESTRATE_PROGRESS_FILE"]
def report(step):
    numbers = {"step": step, "target_steps": 10**400, "loss": float("nan"),
               "accuracy": float("inf"), "steps_per_sec": 1e-320, "val_loss": -1e999,
               "checkpoint_step": -3}
    with open(progress + ".tmp", "w") as f:
        f.write(json.dumps(numbers))  # NaN, Infinity, -Infinity: Python's json writes them
    os.replace(progress + ".tmp", progress)
    print("step", step, flush=True)
report(1)
deadline = time.time() + 300
while not os.path.exists("go-on") and time.time() < deadline:
    time.sleep(0.1)
for step in range(2, 9):
    report(step)
    time.sleep(0.05)
"""


def script_job(cli: Cli, script: str, **job: Any) -> Path:
    (cli.cwd / "train.py").write_text(script)
    (port,) = free_ports(1)
    settings = {"name": "demo", "script": "train.py", "max_restarts": 0, **job}
    return local_inventory(cli, [f"name: alpha, address: localhost, port: {port}"], settings)


def assert_escaped(output: str) -> None:
    assert "\x1b" not in output and "\x07" not in output, repr(output)
    assert SHOWN in output, output


def test_a_workers_escape_sequences_are_shown_never_obeyed(cli: Cli, reaper: list[str]) -> None:
    script_job(cli, PRINTS_ESCAPES)
    up = cli("up", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert up.returncode == 1, up.stderr
    assert_escaped(up.stdout + up.stderr)  # the live lines, the supervisor's, the root cause
    assert "Traceback" not in up.stderr
    status = cli("status")
    assert_escaped(status.stdout + status.stderr)
    assert f"alpha: failed: exit 1: {SHOWN}boom" in status.stdout
    tail = cli("tail", "--no-group", check=True)
    assert_escaped(tail.stdout)
    assert "step 1 \\x1b[32mgreen\\x1b[0m" in tail.stdout
    grouped = cli("tail", "--group", check=True)
    assert_escaped(grouped.stdout)
    raw = cli("tail", "--raw", check=True).stdout  # as written: colours and all
    assert f"alpha | {HOSTILE}boom" in raw and "step 1 \x1b[32mgreen\x1b[0m" in raw
    # JSON carries the text as it was (a JSON string escapes it), for programs to read.
    assert json.loads(cli("status", "--json").stdout)["workers"][0]["reason"].endswith(
        f"{HOSTILE}boom"
    )


def test_a_lease_file_named_with_escapes_is_shown_escaped_by_jobs_and_check(cli: Cli) -> None:
    # The neighbour: a file in the shared lease directory that retitled and cleared the
    # terminal of whoever listed it.
    leases = cli.cwd / "leases"
    leases.mkdir(mode=0o1777)
    leases.chmod(0o1777)
    (leases / f"lease-{HOSTILE}.json").write_text("not json")
    (port,) = free_ports(1)
    (cli.cwd / "train.py").write_text("print(1)\n")
    local_inventory(cli, [f"name: alpha, address: localhost, port: auto, "
                          f"port_range: [{port}, {port}], lease_dir: {leases}"],
                    {"name": "demo", "script": "train.py"})  # fmt: skip
    jobs = cli("jobs", "inv.yaml", check=True)
    assert_escaped(jobs.stdout + jobs.stderr)
    assert f"ignored {leases}/lease-{SHOWN}.json" in jobs.stderr
    check = cli("check", "inv.yaml", check=True)  # port: auto: it asks the lease directory
    assert_escaped(check.stdout + check.stderr)


def strict(text: str) -> Any:
    """JSON as every parser reads it: NaN, Infinity and -Infinity are errors."""

    def refuse(name: str) -> None:
        raise AssertionError(f"not JSON: {name} in {text}")

    return json.loads(text, parse_constant=refuse)


def test_absurd_numbers_show_as_unknown_and_every_json_output_is_strict(
    cli: Cli, reaper: list[str]
) -> None:
    script_job(cli, REPORTS_ABSURD_NUMBERS, steps=8)
    up = cli.popen("up", "inv.yaml")
    try:
        running = wait_for(lambda: _running(cli), timeout=60, what="a running worker")
        reaper.append(running["run_id"])
        (alpha,) = running["workers"]
        assert running["eta_seconds"] is None and alpha["steps_per_sec"] is None
        assert alpha["loss"] is None and alpha["accuracy"] is None and alpha["val_loss"] is None
        assert alpha["checkpoint_step"] is None and alpha["target_steps"] == 8
        table = cli("status")
        assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr
        assert "alpha" in table.stdout and "ETA" not in table.stdout
        (cli.cwd / "go-on").touch()
        out, err = up.communicate(timeout=300)
    finally:
        (cli.cwd / "go-on").touch()  # whatever failed, the worker ends by itself
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 0, err
    assert "job demo succeeded at step 8" in err and "Traceback" not in out + err
    assert strict(cli("status", "--json", check=True).stdout)["state"] == "succeeded"
    for command in (("jobs", "inv.yaml", "--json"), ("check", "inv.yaml", "--json"),
                    ("hosts", "inv.yaml", "--json")):  # fmt: skip
        done = cli(*command)
        assert done.returncode == 0, (command, done.stderr)
        lines = done.stdout.splitlines() if command[0] == "hosts" else [done.stdout]
        for line in lines:  # hosts: one object per line
            strict(line)


def _running(cli: Cli) -> dict[str, Any] | None:
    """status --json, strictly parsed, once the worker has reported a step."""
    done = cli("status", "--json")
    if done.returncode != 0:
        return None
    status = strict(done.stdout)
    workers = status.get("workers") or [{}]
    return status if workers[0].get("state") == "running" and workers[0].get("step") else None


def test_every_json_option_is_covered_here() -> None:
    """A command that gains --json is added to the strict test above."""
    cli_dir = Path(__file__).resolve().parents[2] / "orchestrator" / "cli"
    with_json = {p.name for p in cli_dir.glob("*.py") if '"--json"' in p.read_text()}
    assert with_json == {"jobs.py", "check.py", "hosts.py", "views.py"}
