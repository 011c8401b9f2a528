"""A worker whose progress gives a step that is no number, then exits 0 (issue 54): the run is
no success "at step 0" but a failure that says why, and is not retried."""

from __future__ import annotations

import textwrap

from tests.conftest import Cli, free_ports

SCRIPT = """\
import json, os
with open(os.environ["ORCHESTRATE_PROGRESS_FILE"], "w") as f:
    f.write(json.dumps({"step": float("nan"), "loss": float("nan")}))
"""


def test_a_step_that_is_no_number_then_exit_0_fails_the_run(cli: Cli, reaper: list[str]) -> None:
    (cli.cwd / "train.py").write_text(SCRIPT)
    (port,) = free_ports(1)
    (cli.cwd / "inv.yaml").write_text(
        textwrap.dedent(f"""\
        hosts: [{{name: alpha, connection: local, address: localhost, port: {port}}}]
        job: {{name: demo, script: train.py, restart_backoff: 0}}
        """)
    )
    result = cli("up", "--skip-checks", "inv.yaml", timeout=120)
    reaper.append(cli.record()["run_id"])
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert "succeeded" not in output, output
    assert result.returncode == 1, output
    assert "exited 0 with a step of 'nan': no step number" in output, output
