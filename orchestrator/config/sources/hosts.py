"""The `hosts:` host source: a list of host entries (and `spares:`, read the same way), each
checked against the common host keys and its connection kind's own keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config.report import Report, line_of
from orchestrator.config.sources.base import HostSource, Placed
from orchestrator.contract import device_setting_problems
from orchestrator.machines import kinds
from orchestrator.model.inventory import DEFAULT_CONNECTION, DEFAULT_WORKDIR, ROLES, WorkerSlot
from orchestrator.model.leases import DEFAULT_PORT_RANGE
from orchestrator.paths import controller_path
from orchestrator.values import (
    PORT,
    Checked,
    Checker,
    Key,
    boolean,
    checkers,
    choice,
    describe,
    integer,
    integers,
    name,
    string,
)
from orchestrator.yamlsource import LineList, LineMap


def _connection(value: Any) -> Checked:
    return choice(*kinds.names())(value)


def _port(value: Any) -> Checked:
    if value == "auto":
        return value, None
    port, problem = PORT(value)
    return (None, f"{problem}, or auto") if problem else (port, None)


def _port_range(value: Any) -> Checked:
    """`20000-20099` or `[20000, 20099]`."""
    bounds: Any = value
    if isinstance(value, str) and value.count("-") == 1:
        low, high = (part.strip() for part in value.split("-"))
        bounds = [int(low), int(high)] if low.isdigit() and high.isdigit() else None
    expected = f"expected LOW-HIGH (two ports, LOW <= HIGH), got {describe(value)}"
    if not isinstance(bounds, list) or len(bounds) != 2:
        return None, expected
    checked = [PORT(bound)[0] for bound in bounds]
    if None in checked or checked[0] > checked[1]:
        return None, expected
    return (checked[0], checked[1]), None


def _absolute(value: Any) -> Checked:
    path, problem = string(value)
    if problem or not str(path).startswith("/"):
        return None, problem or f"expected an absolute path, got {describe(value)}"
    return path, None


# The keys every host has, whatever its kind (in `defaults:` or per host); a kind adds its own
# (machines/kinds/). The manual's key reference is written from these entries.
HOST_KEY_ENTRIES: tuple[Key, ...] = (
    Key("name", "name", "required",
        "the worker's name: log prefix, run directory; letters, digits, `.`, `_`, `-`", name),
    Key("address", "string", "required",
        "how the other hosts and the controller reach it; `localhost`/`127.0.0.1` for `local`; "
        "may be a `Host` alias of your ssh config", string),
    Key("port", "integer, 1 to 65535, or `auto`", "required",
        "TensorFlow gRPC port; no two hosts may share `address:port`. `auto`: a free port of "
        "`port_range`, leased on the host at `up` against every other job (see Shared machines)",
        _port),
    Key("port_range", "`LOW-HIGH`", "`20000-20099`",
        "the ports `port: auto` picks from (and `firewall` opens)", _port_range),
    Key("connection", "a connection kind: `ssh`, `local`", "`ssh`",
        "`ssh`, or `local` to run the worker as a local process (the localhost simulation)",
        _connection),
    Key("python", "string", "`python3` (ssh), this Python (local)",
        "the interpreter that runs the worker", string),
    Key("workdir", "string", "`~/orchestrate`", "where the job's directory goes on that host",
        string),
    Key("gpu_memory_growth", "boolean", "`false`",
        "allocate GPU memory as needed instead of all at once", boolean),
    Key("gpu_memory_limit_mb", "integer, at least 1", "",
        "one logical GPU of this many MB per visible GPU", integer(1)),
    Key("visible_gpus", "list of integers, at least 0", "all",
        "GPU indices the worker may use, e.g. `[0, 1]` (`CUDA_VISIBLE_DEVICES` for a script)",
        integers(0)),
    Key("logical_gpus", "integer, at least 1", "",
        "split each visible GPU into K logical GPUs of `gpu_memory_limit_mb` each (multi-GPU "
        "code on one card)", integer(1)),
    Key("gpus", "integer, at least 1", "",
        "lease this many GPUs of the host's pool (`visible_gpus`, else `nvidia-smi -L`) against "
        "every other job; the worker gets exactly those as `CUDA_VISIBLE_DEVICES`", integer(1)),
    Key("share_gpus", "boolean", "`false`",
        "`gpus:` may share a GPU with another job that says `share_gpus: true` too", boolean),
    Key("lease_dir", "string (an absolute path on the host)", "`/var/tmp/orchestrate-leases`",
        "where the host's leases live, shared by every user of the machine (created sticky "
        "1777)", _absolute),
    Key("role", " or ".join(f"`{r}`" for r in ROLES), "`worker`",
        "its task type in TF_CONFIG: `chief`, `ps` and `worker` under `job.strategy: "
        "parameter-server` (one chief, at least one ps and one worker); `evaluator` (at most "
        "one) evaluates the chief's checkpoints beside the training and is not in the cluster",
        choice(*ROLES)),
)  # fmt: skip
HOST_KEYS: dict[str, Checker] = checkers(HOST_KEY_ENTRIES)
PER_HOST_ONLY = ("name", "address")


def host_keys() -> dict[str, Checker]:
    """The common keys and every registered kind's own keys."""
    return {**HOST_KEYS, **kinds.all_keys()}  # type: ignore[dict-item]


def parse_hosts(
    document: LineMap, defaults: LineMap, report: Report, base: Path, key: str = "hosts"
) -> list[Placed]:
    """The `hosts:` list (required, non-empty) or the `spares:` list (optional)."""
    entries = document.get(key)
    if key not in document:
        return []
    if not isinstance(entries, LineList) or (key == "hosts" and not entries):
        report.add(line_of(document, key), key, f"expected a non-empty list of {key}")
        return []
    placed: list[Placed] = []
    for index, entry in enumerate(entries):
        where = f"{key}[{index}]"
        if not isinstance(entry, LineMap):
            report.add(
                entries.item_lines[index], where, f"expected a mapping, got {describe(entry)}"
            )
            continue
        report.unknown_keys(entry, host_keys(), where)
        host = parse_host(entry, defaults, report, where, base)
        if host is not None:
            placed.append((where, entries.item_lines[index], host))
    return placed


def parse_host(
    entry: LineMap, defaults: LineMap, report: Report, where: str, base: Path
) -> WorkerSlot | None:
    values: dict[str, Any] = {}
    ok = True
    for key, check in host_keys().items():
        source, prefix = (entry, where) if key in entry else (defaults, "defaults")
        if key not in source:
            continue
        value, problem = check(source[key])
        if problem:
            report.add(line_of(source, key), f"{prefix}.{key}", problem)
            ok = False
        else:
            values[key] = value
    for key in ("name", "address", "port"):
        if key not in values and key not in entry and key not in defaults:
            report.add(
                entry.line, f"{where}.{key}", "missing; every host needs name, address, port"
            )
            ok = False
    problems = device_setting_problems(
        bool(values.get("gpu_memory_growth")),
        values.get("gpu_memory_limit_mb"),
        values.get("logical_gpus"),
    )
    for key, message in problems:
        report.add(line_of(entry if key in entry else defaults, key), f"{where}.{key}", message)
        ok = False
    if not ok:
        return None
    kind = kinds.get(values.get("connection", DEFAULT_CONNECTION))
    for key in [k for k in kinds.all_keys() if k not in kind.keys]:
        if key in entry:
            report.add(line_of(entry, key), f"{where}.{key}",
                       f"applies to another connection kind, not to {kind.name}")  # fmt: skip
            ok = False
        values.pop(key, None)  # from defaults shared with hosts of another kind
    values.setdefault("workdir", DEFAULT_WORKDIR)
    if values.get("port") == "auto":
        values["port"] = 0  # leased at `up`; the run's record keeps the port it got
        values.setdefault("port_range", DEFAULT_PORT_RANGE)
    else:
        values.pop("port_range", None)

    def report_problem(key: str, message: str) -> None:
        report.add(line_of(entry if key in entry else defaults, key), f"{where}.{key}", message)

    before = len(report.problems)
    kind.prepare(values, report_problem, base)
    if len(report.problems) > before or not ok:
        return None
    for key in kind.controller_paths:
        if key in values:
            values[key] = str(controller_path(values[key], base))
    settings = kind.settings(values)
    common = {key: value for key, value in values.items() if key in HOST_KEYS}
    return WorkerSlot(**common, settings=settings)


def hosts_source(
    document: LineMap, defaults: LineMap, report: Report, base: Path
) -> tuple[list[Placed], None]:
    return parse_hosts(document, defaults, report, base), None


SOURCE = HostSource(
    Key("hosts", "list of hosts", "",
        "the workers, in order: `hosts[0]` is the chief (task index 0), unless a host says "
        "`role: chief`"),
    hosts_source,
)  # fmt: skip
