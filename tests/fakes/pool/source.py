"""The pool's host source: a top-level `pool:` block, `{slots: N, base_port: P, root: DIR}`.

Slot i is a worker named `slot{i}` on this machine at port P+i; the workers' files live under
`root` (relative to the inventory). What config/sources/slurm.py is to the Slurm backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.report import Report, line_of
from orchestrator.config.sources.base import HostSource, Placed, RoleRule
from orchestrator.model.inventory import WorkerSlot
from orchestrator.model.records import SettingsReader
from orchestrator.paths import controller_path
from orchestrator.values import POSITIVE, Key, checkers, integer, string
from orchestrator.yamlsource import LineMap

POOL_KEY_ENTRIES: tuple[Key, ...] = (
    Key("slots", "integer, at least 1", "required", "how many workers the pool runs", POSITIVE),
    Key("base_port", "integer, 1024 to 65000", "required", "slot i's TensorFlow port is this + i",
        integer(1024, 65000)),
    Key("root", "string (a path on this machine)", "required", "where the workers' files go",
        string),
)  # fmt: skip
POOL_KEYS = checkers(POOL_KEY_ENTRIES)


@dataclass(frozen=True)
class PoolSpec:
    """The pool's settings (model.inventory.SourceSettings), kept in the run record."""

    slots: int
    base_port: int
    root: str

    @property
    def gpus_per_worker(self) -> int | None:
        return None


def pool_source(
    document: LineMap, _defaults: LineMap, report: Report, base: Path
) -> tuple[list[Placed], PoolSpec | None]:
    block = document["pool"]
    if not isinstance(block, LineMap):
        report.add(line_of(document, "pool"), "pool", "expected a mapping with 'slots'")
        return [], None
    report.unknown_keys(block, POOL_KEYS, "pool")
    values = report.checked(block, POOL_KEYS, "pool")
    missing = [key for key in POOL_KEYS if key not in values]
    for key in missing:
        report.add(block.line, f"pool.{key}", "missing")
    if missing:
        return [], None
    spec = PoolSpec(values["slots"], values["base_port"],
                    str(controller_path(values["root"], base)))  # fmt: skip
    hosts = [WorkerSlot(f"slot{i}", "127.0.0.1", spec.base_port + i, connection="local")
             for i in range(spec.slots)]  # fmt: skip
    return [(f"pool.{host.name}", None, host) for host in hosts], spec


def spec_from_json(data: Mapping[str, Any], _settings: SettingsReader) -> PoolSpec:
    return PoolSpec(int(data["slots"]), int(data["base_port"]), str(data["root"]))


SOURCE = HostSource(
    Key("pool", "mapping (`pool:` keys)", "", "a pool of local processes runs the workers"),
    pool_source,
    blocks=(("pool", "a pool of local processes (tests/fakes/pool)", POOL_KEY_ENTRIES),),
    roles=RoleRule("parameter-server needs roles; a pool's slots are all workers"),
    no_setup="applies to hosts; a pool's slots share this machine's environment",
    settings_from_json=spec_from_json,
)
