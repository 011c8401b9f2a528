"""The CLI starts without importing what other commands need (issue 56): `--version` and a
`check` that refuses its inventory import no engine, no backend's start machinery, no
dashboard. Each command's module is imported when the command is asked for (app.COMMAND_MODULES);
the table is complete. Timings: bench/cli_start.py."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

from orchestrator.cli.app import COMMAND_MODULES, cli

# Runs the CLI as `orchestrate ARGS` and writes the modules it imported to argv[1].
RUN_AND_LIST = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from orchestrator.cli import main
sys.argv[0] = "orchestrate"
main()
"""


def imported(tmp_path: Path, *args: str) -> set[str]:
    out = tmp_path / "modules.json"
    subprocess.run([sys.executable, "-c", RUN_AND_LIST, str(out), *args], cwd=tmp_path,
                   capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    return set(json.loads(out.read_text()))


def test_every_command_is_in_the_table_with_its_module() -> None:
    for module in set(COMMAND_MODULES.values()):
        importlib.import_module(f"orchestrator.cli.{module}")
    assert set(cli.commands) == set(COMMAND_MODULES)
    for name, command in cli.commands.items():
        assert command.callback is not None
        assert command.callback.__module__ == f"orchestrator.cli.{COMMAND_MODULES[name]}", name


def test_version_imports_no_command(tmp_path: Path) -> None:
    modules = imported(tmp_path, "--version")
    ours = {m for m in modules if m.startswith("orchestrator.")}
    allowed = {"orchestrator.cli", "orchestrator.cli.app", "orchestrator.errors",
               "orchestrator.model", "orchestrator.model.printable",
               "orchestrator.paths"}  # fmt: skip
    assert ours <= allowed, ours
    assert "yaml" not in modules


def test_a_refused_inventory_imports_no_engine_and_no_dashboard(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("hosts: [\n")
    modules = imported(tmp_path, "check", "bad.yaml")
    assert "orchestrator.cli.check" in modules  # the command did run
    prefixes = ("orchestrator.engine", "orchestrator.dashboard", "orchestrator.cli.run",
                "fabric", "paramiko")  # fmt: skip
    heavy = {m for m in modules if m.startswith(prefixes)}
    assert heavy == set(), sorted(heavy)
