"""The manual's references are generated from the code (docs/hooks/reference.py): the inventory
keys from the loader's one key registry, the failure kinds from the classifier's table. These
tests hold the loader to the registry: it accepts exactly the keys the reference describes, in
every block, and the generated pages name every key and every kind."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from orchestrator.backends.registry import host_sources, key_reference
from orchestrator.config.job import JOB_KEYS
from orchestrator.config.loader import TOP_KEYS, parse_inventory
from orchestrator.config.report import Report
from orchestrator.config.sources.ansible import ANSIBLE_KEYS
from orchestrator.config.sources.hosts import HOST_KEYS, host_keys
from orchestrator.config.sources.slurm import SLURM_KEYS
from orchestrator.config.sync import SYNC_KEYS
from orchestrator.machines import kinds
from orchestrator.model.vocabulary import FailureKind
from orchestrator.yamlsource import parse

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "reference.py"


def documented(where: str) -> set[str]:
    return {key.name for block, _, entries in key_reference() if block == where for key in entries}


def kind_blocks() -> set[str]:
    return {block for block, _, _ in key_reference() if block.startswith("connection: ")}


def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_hook", HOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_known_key_table_is_the_registry() -> None:
    assert {s.name for s in host_sources()} | set(TOP_KEYS) == documented("top level")
    assert set(HOST_KEYS) == documented("hosts")
    for name in kinds.names():
        kind = kinds.get(name)
        assert {key.name for key in kind.key_entries} == set(kind.keys), name
    assert set(host_keys()) == documented("hosts").union(*map(documented, kind_blocks()))
    assert set(JOB_KEYS) == documented("job")
    assert set(SYNC_KEYS) == documented("sync")
    assert set(ANSIBLE_KEYS) == documented("ansible")
    assert set(SLURM_KEYS) == documented("slurm")
    for _, about, entries in key_reference():
        assert about
        for key in entries:
            assert key.type and key.meaning, key.name


# Every name any block knows, plus the ones that must be known nowhere: `ssh_host` is derived
# from the ssh config by the SSH kind, never read from the file.
CANDIDATES = (
    {key.name for _, _, entries in key_reference() for key in entries}
    | {
        *(s.name for s in host_sources()),
        *TOP_KEYS,
        *host_keys(),
        *JOB_KEYS,
        *SYNC_KEYS,
        *ANSIBLE_KEYS,
        *SLURM_KEYS,
    }
    | {"ssh_host", "not_a_key"}
)


def unknown_keys(document: dict[str, Any], tmp_path: Path) -> set[str]:
    report = Report("inv.yaml")
    parse_inventory(parse(yaml.safe_dump(document)), report, tmp_path, "inv", host_sources())
    return {p.key for p in report.problems if p.message.startswith("unknown key")}


def every(names: set[str]) -> dict[str, Any]:
    return {name: 1 for name in sorted(names)}


HOST = {"name": "a", "address": "localhost", "port": 20000, "connection": "local"}
JOB = {"task": "worker.examples.shapes:task", "steps": 1}


@pytest.mark.parametrize(
    ("block", "document", "prefix"),
    [
        ("top level", lambda keys: {**every(keys), "job": JOB}, ""),
        ("hosts", lambda keys: {"hosts": [every(keys)], "job": JOB}, "hosts[0]."),
        ("job", lambda keys: {"hosts": [HOST], "job": every(keys)}, "job."),
        ("sync", lambda keys: {"hosts": [HOST], "job": JOB, "sync": every(keys)}, "sync."),
        ("ansible", lambda keys: {"ansible": every(keys), "job": JOB}, "ansible."),
        ("slurm", lambda keys: {"slurm": every(keys), "job": JOB}, "slurm."),
        ("slurm.login", lambda keys: {"slurm": {"nodes": 1, "login": every(keys)}, "job": JOB},
         "slurm.login."),
    ],
)  # fmt: skip
def test_the_loader_accepts_exactly_what_the_reference_describes(
    block: str, document: Any, prefix: str, tmp_path: Path
) -> None:
    known = documented(block)
    if block == "hosts":  # a host entry takes every kind's keys (then says which kind they fit)
        known = known.union(*map(documented, kind_blocks()))
    refused = unknown_keys(document(CANDIDATES), tmp_path)
    mine = {key.removeprefix(prefix) for key in refused if key.startswith(prefix)}
    if prefix == "":
        mine = {key for key in refused if "." not in key and "[" not in key}
    # A candidate the loader does not call unknown here is one the reference describes here.
    assert CANDIDATES - mine == known


def test_the_generated_pages_name_every_key_and_every_failure_kind() -> None:
    reference = hook()
    inventory = reference.inventory_page()
    for where, _, entries in key_reference():
        assert where in inventory.lower()
        for key in entries:
            assert f"| `{key.name}` |" in inventory
    failures = reference.failures_page()
    for kind in FailureKind:
        assert f"| `{kind.value}` |" in failures
