"""Every YAML example of the manual (docs/*.md, and the READMEs it includes) is loaded and
validated by the inventory loader, so an example cannot teach a key or a value the loader refuses;
the shell completion the commands page shows is run.

An example says what it is on its first line:
    # orchestrate: inventory                      a whole inventory
    # orchestrate: fragment                       blocks of one: the test adds a local host
                                                  and a job where they are missing
    ...; needs train.py ../ansible/hosts.ini src/   files (dir/ a directory) it names, which the
                                                  test creates as stubs beside the inventory
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.registry import load_inventory

ROOT = Path(__file__).resolve().parents[2]
MANUAL = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "docker" / "README.md"]
BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"^# orchestrate: (inventory|fragment)(?:; needs ((?:\S+ ?)+))?\s*$")

# What a stub holds where an empty file would not load (the Ansible example's group, `gpus`).
STUBS = {"hosts.ini": "[gpus]\ngpu-a ansible_host=192.0.2.10 tf_port=20000\n"}
LOCAL_HOST = {"name": "a", "address": "localhost", "port": 20000, "connection": "local"}
JOB = {"task": "worker.examples.shapes:task", "steps": 10}


def examples() -> list[tuple[str, str]]:
    found = []
    for page in MANUAL:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return found


EXAMPLES = examples()


def test_the_manual_has_yaml_examples_and_each_carries_a_marker() -> None:
    assert len(EXAMPLES) >= 6
    unmarked = [where for where, text in EXAMPLES if not MARKER.match(text.split("\n", 1)[0])]
    assert unmarked == [], "a YAML example of the manual without '# orchestrate: ...'"


@pytest.mark.parametrize(("where", "text"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_each_yaml_example_loads(
    where: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = MARKER.match(text.split("\n", 1)[0])
    assert marker, where
    kind, needs = marker.group(1), (marker.group(2) or "").split()
    if "ansible:" in text:
        pytest.importorskip("ansible", reason="the ansible extra reads ansible: inventories")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ssh config of this machine applies
    base = tmp_path / "project" / "inventories"
    base.mkdir(parents=True)
    for need in needs:
        path = base / need
        if need.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(STUBS.get(path.name, ""))
    document = yaml.safe_load(text)
    if kind == "fragment":
        if not {"hosts", "slurm", "ansible"} & set(document):
            document["hosts"] = [LOCAL_HOST]
        document.setdefault("job", JOB)
        text = yaml.safe_dump(document)
    inventory = base / "example.yaml"
    inventory.write_text(text)
    load_inventory(inventory)  # raises InventoryError listing every problem


def test_shell_completion_works_as_the_commands_page_says() -> None:
    page = (ROOT / "docs" / "commands.md").read_text()
    assert "_ORCHESTRATE_COMPLETE=bash_source orchestrate" in page
    env = {**os.environ, "_ORCHESTRATE_COMPLETE": "bash_source"}
    run = [sys.executable, "-m", "orchestrator"]
    source = subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout
    assert "_orchestrate_completion" in source and "complete " in source
    env.update(
        _ORCHESTRATE_COMPLETE="bash_complete", COMP_WORDS="orchestrate down --", COMP_CWORD="2"
    )
    words = subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout
    assert "plain,--grace" in words.splitlines()
