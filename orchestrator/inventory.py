"""Load and validate an inventory file into frozen dataclasses. Pure apart from reading the file.

Every problem of a file is collected (not only the first) and reported with the file, the line, the
key path and what was expected.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from orchestrator.backends.hosts.setup import parse_setup
from orchestrator.backends.hosts.sync import parse_sync
from orchestrator.contract import (
    EXPORT_FORMATS,
    KERAS_SETTINGS,
    LEGACY_KERAS_ENV,
    RESERVED_ENV_PREFIXES,
    device_setting_problems,
    task_problem,
)
from orchestrator.errors import InventoryError, Problem
from orchestrator.machines import kinds
from orchestrator.model.inventory import DEFAULT_CONNECTION, DEFAULT_WORKDIR, Host, Inventory, Job
from orchestrator.model.slurm import SlurmSpec
from orchestrator.paths import controller_path, is_loopback
from orchestrator.values import (
    NAME_PATTERN,
    PORT,
    POSITIVE,
    Checked,
    Checker,
    boolean,
    choice,
    describe,
    integer,
    integers,
    name,
    scalar_string,
    string,
)
from orchestrator.yamlsource import LineList, LineMap, YamlSyntaxError, parse

ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

__all__ = ["Host", "Inventory", "Job", "is_loopback", "load_inventory"]


def _task(value: Any) -> Checked:
    problem = task_problem(value)
    return (None, problem) if problem else (value, None)


def _connection(value: Any) -> Checked:
    return choice(*kinds.names())(value)


HOST_KEYS: dict[str, Checker] = {
    "name": name,
    "address": string,
    "port": PORT,
    "connection": _connection,
    "python": string,
    "workdir": string,
    "gpu_memory_growth": boolean,
    "gpu_memory_limit_mb": integer(1),
    "visible_gpus": integers(0),
    "logical_gpus": integer(1),
}
PER_HOST_ONLY = ("name", "address")

JOB_KEYS: dict[str, Checker] = {
    "name": name,
    "task": _task,
    "script": string,
    "args": scalar_string,  # checked per item
    "env": scalar_string,  # checked per value
    "secret_env": string,  # checked per item
    "files": string,  # checked per item
    "steps": POSITIVE,
    "checkpoint_dir": string,
    "checkpoint_every": POSITIVE,
    "max_to_keep": POSITIVE,
    "batch_size": POSITIVE,
    "log_every": POSITIVE,
    "stall_timeout": POSITIVE,
    "max_restarts": integer(0),
    "restart_backoff": integer(0, 3600),
    "partition_timeout": integer(0, 86400),
    "warm_restarts": boolean,
    "log_max_mb": integer(1, 1 << 20),
    "permanent_exit_codes": integer(1, 255),  # checked per item
    "strategy": choice("multi-worker", "mirrored"),
    "profile_steps": integers(1, length=2),
    "eval_every": POSITIVE,
    "export": choice(*EXPORT_FORMATS),
    "keras": choice(*KERAS_SETTINGS),
    "steps_per_call": POSITIVE,
    "seed": integer(0),
}

# Keys parsed by their own functions below (lists and mappings, checked per item).
LIST_JOB_KEYS = ("args", "env", "secret_env", "files", "permanent_exit_codes")

Placed = tuple[str, int | None, "Host"]  # where in the file ("hosts[1]"), its line, the host
# A host source turns its top-level block into the workers, in TF_CONFIG order, and the
# scheduler's settings if a scheduler places them. An inventory takes exactly one; spares (and
# later min_hosts) apply to whatever it produced.
HostSource = Callable[[LineMap, LineMap, "_Report", Path], tuple[list[Placed], Any]]
HOST_SOURCES: dict[str, HostSource] = {}
TOP_KEYS: tuple[str, ...] = ("defaults", "spares", "min_hosts", "setup", "sync", "job")


def _host_keys() -> dict[str, Checker]:
    """The common keys and every registered kind's own keys."""
    return {**HOST_KEYS, **kinds.all_keys()}  # type: ignore[dict-item]


# ---------------------------------------------------------------------------------------------


class _Report:
    """Collects problems of one file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def add(self, line: int | None, key: str, message: str) -> None:
        self.problems.append(Problem(self.path, line, key, message))

    def checked(self, mapping: LineMap, checkers: dict[str, Checker], where: str,
                skip: Collection[str] = ()) -> dict[str, Any]:  # fmt: skip
        """The values of `mapping` that pass their checker; a problem for each that does not."""
        values: dict[str, Any] = {}
        for key, check in checkers.items():
            if key not in mapping or key in skip:
                continue
            value, problem = check(mapping[key])
            if problem:
                self.add(_line(mapping, key), _join(where, key), problem)
            else:
                values[key] = value
        return values

    def unknown_keys(self, mapping: LineMap, known: tuple[str, ...] | dict[str, Any], where: str):
        for key in mapping:
            if key in known:
                continue
            guess = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"did you mean '{guess[0]}'?" if guess else f"known keys: {', '.join(known)}"
            self.add(mapping.key_lines.get(key), _join(where, key), f"unknown key; {hint}")
        for key, line in mapping.duplicate_keys:
            self.add(line, _join(where, key), "repeated key; each key may appear once")


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _line(mapping: Any, key: Any) -> int | None:
    if isinstance(mapping, LineMap):
        return mapping.key_lines.get(key, mapping.line)
    return None


def load_inventory(path: str | Path) -> Inventory:
    """Read, validate and resolve an inventory file; raises InventoryError listing every problem."""
    source = Path(path)
    report = _Report(str(path))
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        report.add(None, "", f"cannot read the file: {exc.strerror or exc}")
        raise InventoryError(report.problems, hint="check the path of the inventory file") from exc
    except UnicodeDecodeError as exc:
        line = source.read_bytes()[: exc.start].count(b"\n") + 1
        report.add(line, "", f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                             f"{exc.start}): is this the inventory, or a binary file?")  # fmt: skip
        raise InventoryError(report.problems, hint="an inventory is a YAML text file") from exc
    return load_inventory_text(text, str(path), source.resolve().parent, source.stem)


def load_inventory_text(text: str, label: str, base_dir: Path, stem: str) -> Inventory:
    """An inventory held in memory (`orchestrate local`'s), read as if it were the file `label`
    in `base_dir`: relative paths resolve there, and local workers start there."""
    report = _Report(label)
    try:
        document = parse(text)
    except YamlSyntaxError as exc:
        report.add(exc.line, "", exc.message)
        raise InventoryError(report.problems) from exc
    inventory = parse_inventory(document, report, base_dir=base_dir, stem=stem)
    if report.problems or inventory is None:
        raise InventoryError(report.problems)
    return inventory


def parse_inventory(document: Any, report: _Report, base_dir: Path, stem: str) -> Inventory | None:
    if not isinstance(document, LineMap):
        report.add(
            None, "", f"expected a mapping with 'hosts:' and 'job:', got {describe(document)}"
        )
        return None
    report.unknown_keys(document, (*HOST_SOURCES, *TOP_KEYS), "")
    defaults = document.get("defaults") or LineMap()  # an empty `defaults:` is None in YAML
    if not isinstance(defaults, LineMap):
        report.add(_line(document, "defaults"), "defaults", "expected a mapping of host keys")
        defaults = LineMap()
    report.unknown_keys(defaults, _host_keys(), "defaults")
    for key in PER_HOST_ONLY:
        if key in defaults:
            report.add(_line(defaults, key), f"defaults.{key}", "must be set on each host")
    placed, scheduler = _workers(document, defaults, report, base_dir)
    spares = _parse_hosts(document, defaults, report, base_dir, key="spares")
    _check_unique_hosts(placed + spares, report)
    hosts = [host for _, _, host in placed]
    job = _parse_job(document, report, stem, base_dir)
    if job is not None:
        _check_job_fits_hosts(job, hosts, document, report)
    min_hosts = _parse_min_hosts(document, len(hosts), report)
    setup = parse_setup(document["setup"], _line(document, "setup"), report) \
        if "setup" in document else ()  # fmt: skip
    sync = parse_sync(document["sync"], _line(document, "sync"), report, base_dir) \
        if "sync" in document else None  # fmt: skip
    for key in ("setup", "sync"):
        if key in document and isinstance(scheduler, SlurmSpec):
            report.add(_line(document, key), key, "applies to hosts reached over SSH (hosts: "
                       "or ansible:); on Slurm, prepare the nodes' shared environment")  # fmt: skip
    if job is None or report.problems:
        return None
    return Inventory(
        path=report.path,
        base_dir=str(base_dir),
        hosts=tuple(hosts),
        job=job,
        spares=tuple(host for _, _, host in spares),
        min_hosts=min_hosts,
        setup=setup,
        sync=sync,
        slurm=scheduler if isinstance(scheduler, SlurmSpec) else None,
    )


def _parse_min_hosts(document: LineMap, count: int, report: _Report) -> int | None:
    if "min_hosts" not in document:
        return None
    value, problem = integer(1, max(count, 1))(document["min_hosts"])
    if problem:
        report.add(_line(document, "min_hosts"), "min_hosts",
                   f"{problem} (the number of workers a restart may go on with)")  # fmt: skip
        return None
    return int(value)


def _check_job_fits_hosts(job: Job, hosts: list[Host], document: LineMap, report: _Report) -> None:
    block = document["job"]
    if job.strategy == "mirrored" and len(hosts) > 1:
        report.add(
            _line(block, "strategy"),
            "job.strategy",
            f"mirrored runs on one host, but {len(hosts)} hosts are listed; "
            "use multi-worker for several hosts",
        )
    if job.profile_steps and job.profile_steps[0] >= job.profile_steps[1]:
        report.add(
            _line(block, "profile_steps"),
            "job.profile_steps",
            f"expected [start, end] with start < end, got {list(job.profile_steps)}",
        )
    _check_steps_per_call(job, block, report)
    if job.script is not None:
        for host in hosts:
            if host.gpu_memory_growth or host.gpu_memory_limit_mb or host.logical_gpus:
                report.add(
                    None,
                    f"hosts.{host.name}",
                    "GPU memory settings apply to the built-in loop (job.task); "
                    "a script sets them itself",
                )
        for key in ("strategy", "profile_steps", "eval_every", "export", "steps_per_call", "seed"):
            if key in block:
                report.add(_line(block, key), f"job.{key}", "applies to job.task only")


def _check_steps_per_call(job: Job, block: LineMap, report: _Report) -> None:
    """The worker refuses the same (worker.config.check_steps_per_call); said here with lines."""
    k = job.steps_per_call
    for key in ("log_every", "checkpoint_every", "eval_every"):
        every = getattr(job, key)
        if k > 1 and every is not None and every % k:
            where = key if key in block else "steps_per_call"
            report.add(
                _line(block, where),
                f"job.{key}",
                f"{every} must be a multiple of steps_per_call ({k}): the worker sees the "
                f"steps only at the end of each call of {k} steps"
                + ("" if key in block else f" (the default {key} is {every})"),
            )


def _workers(
    document: LineMap, defaults: LineMap, report: _Report, base: Path
) -> tuple[list[Placed], Any]:
    present = [key for key in HOST_SOURCES if key in document]
    if len(present) > 1:
        report.add(
            _line(document, present[1]),
            present[1],
            f"set exactly one of {', '.join(HOST_SOURCES)}: each lists the workers",
        )
        return [], None
    if not present:
        sources = ", ".join(HOST_SOURCES)
        report.add(document.line, "hosts", f"missing; list the workers with one of {sources}")
        return [], None
    return HOST_SOURCES[present[0]](document, defaults, report, base)


def _parse_hosts(
    document: LineMap, defaults: LineMap, report: _Report, base: Path, key: str = "hosts"
) -> list[Placed]:
    """The `hosts:` list (required, non-empty) or the `spares:` list (optional)."""
    entries = document.get(key)
    if key not in document:
        return []
    if not isinstance(entries, LineList) or (key == "hosts" and not entries):
        report.add(_line(document, key), key, f"expected a non-empty list of {key}")
        return []
    placed: list[Placed] = []
    for index, entry in enumerate(entries):
        where = f"{key}[{index}]"
        if not isinstance(entry, LineMap):
            report.add(entries.item_lines[index], where, f"expected a mapping, got {entry!r}")
            continue
        report.unknown_keys(entry, _host_keys(), where)
        host = _parse_host(entry, defaults, report, where, base)
        if host is not None:
            placed.append((where, entries.item_lines[index], host))
    return placed


def _parse_host(
    entry: LineMap, defaults: LineMap, report: _Report, where: str, base: Path
) -> Host | None:
    values: dict[str, Any] = {}
    ok = True
    for key, check in _host_keys().items():
        source, prefix = (entry, where) if key in entry else (defaults, "defaults")
        if key not in source:
            continue
        value, problem = check(source[key])
        if problem:
            report.add(_line(source, key), f"{prefix}.{key}", problem)
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
        report.add(_line(entry if key in entry else defaults, key), f"{where}.{key}", message)
        ok = False
    if not ok:
        return None
    kind = kinds.get(values.get("connection", DEFAULT_CONNECTION))
    for key in [k for k in kinds.all_keys() if k not in kind.keys]:
        if key in entry:
            report.add(_line(entry, key), f"{where}.{key}",
                       f"applies to another connection kind, not to {kind.name}")  # fmt: skip
            ok = False
        values.pop(key, None)  # from defaults shared with hosts of another kind
    values.setdefault("workdir", DEFAULT_WORKDIR)

    def report_problem(key: str, message: str) -> None:
        report.add(_line(entry if key in entry else defaults, key), f"{where}.{key}", message)

    before = len(report.problems)
    kind.prepare(values, report_problem, base)
    if len(report.problems) > before or not ok:
        return None
    for key in kind.controller_paths:
        if key in values:
            values[key] = str(controller_path(values[key], base))
    settings = kind.settings(values)
    common = {key: value for key, value in values.items() if key in HOST_KEYS}
    return Host(**common, settings=settings)


def _check_unique_hosts(placed: list[Placed], report: _Report) -> None:
    seen_names: dict[str, str] = {}
    seen_endpoints: dict[tuple[str, int], str] = {}
    for where, line, host in placed:
        if host.name in seen_names:
            report.add(
                line,
                f"{where}.name",
                f"'{host.name}' is already used by {seen_names[host.name]}; "
                "host names must be unique",
            )
        seen_names.setdefault(host.name, where)
        address = "127.0.0.1" if is_loopback(host.address) else host.address
        endpoint = (address, host.port)
        if endpoint in seen_endpoints:
            report.add(
                line,
                f"{where}.port",
                f"{host.endpoint} is already used by {seen_endpoints[endpoint]}; "
                "two workers cannot share a port",
            )
        seen_endpoints.setdefault(endpoint, where)


def _parse_job(document: LineMap, report: _Report, stem: str, base: Path) -> Job | None:
    block = document.get("job")
    if "job" not in document:
        report.add(document.line, "job", "missing; say what to run with job.task or job.script")
        return None
    if not isinstance(block, LineMap):
        report.add(_line(document, "job"), "job", "expected a mapping")
        return None
    report.unknown_keys(block, JOB_KEYS, "job")
    values = report.checked(block, JOB_KEYS, "job", skip=LIST_JOB_KEYS)
    if "script" in values:
        script = controller_path(values["script"], base)
        if not script.is_file():
            report.add(_line(block, "script"), "job.script", f"no such file: {script}")
        values["script"] = str(script)
    values["args"] = _parse_args(block, report)
    values["files"] = _parse_files(block, report, base)
    if "permanent_exit_codes" in block:
        values["permanent_exit_codes"] = _parse_exit_codes(block, report)
    values["env"] = _parse_env(block, report)
    values["secret_env"] = _parse_secret_env(block, report, values["env"])
    values.setdefault("name", stem if NAME_PATTERN.match(stem) else "job")
    if ("task" in block) == ("script" in block):
        report.add(
            block.line,
            "job",
            "set exactly one of 'task' (module:function for the built-in "
            "training loop) or 'script' (your own training script)",
        )
    if "task" in block and "steps" not in block:
        report.add(block.line, "job.steps", "missing; the built-in loop needs a step count")
    return Job(**values)


def _parse_args(block: LineMap, report: _Report) -> tuple[str, ...]:
    raw = block.get("args", LineList())
    if not isinstance(raw, LineList):
        report.add(_line(block, "args"), "job.args", "expected a list of strings")
        return ()
    args = []
    for index, item in enumerate(raw):
        value, problem = scalar_string(item)
        if problem:
            report.add(raw.item_lines[index], f"job.args[{index}]", problem)
        else:
            args.append(value)
    return tuple(args)


def _parse_exit_codes(block: LineMap, report: _Report) -> tuple[int, ...]:
    raw = block["permanent_exit_codes"]
    if not isinstance(raw, LineList):
        report.add(_line(block, "permanent_exit_codes"), "job.permanent_exit_codes",
                   "expected a list of exit codes")  # fmt: skip
        return ()
    codes = []
    for index, item in enumerate(raw):
        value, problem = JOB_KEYS["permanent_exit_codes"](item)
        if problem:
            report.add(raw.item_lines[index], f"job.permanent_exit_codes[{index}]", problem)
        else:
            codes.append(value)
    return tuple(codes)


def _parse_files(block: LineMap, report: _Report, base: Path) -> tuple[str, ...]:
    raw = block.get("files", LineList())
    if not isinstance(raw, LineList):
        report.add(_line(block, "files"), "job.files", "expected a list of paths")
        return ()
    files = []
    for index, item in enumerate(raw):
        value, problem = string(item)
        path = controller_path(value, base) if value else None
        if path is not None and not path.exists():
            problem = f"no such file or directory: {path}"
        if problem:
            report.add(raw.item_lines[index], f"job.files[{index}]", problem)
        else:
            files.append(str(path))
    return tuple(files)


def _parse_env(block: LineMap, report: _Report) -> dict[str, str]:
    raw = block.get("env", LineMap())
    if not isinstance(raw, LineMap):
        report.add(_line(block, "env"), "job.env", "expected a mapping of NAME: value")
        return {}
    env = {}
    for key, item in raw.items():
        where = f"job.env.{key}"
        if not isinstance(key, str) or not ENV_NAME_PATTERN.match(key):
            report.add(_line(raw, key), where, "expected an environment variable name")
            continue
        if key.startswith(RESERVED_ENV_PREFIXES):
            report.add(_line(raw, key), where, "is set by orchestrate for each worker")
            continue
        if key == LEGACY_KERAS_ENV:
            report.add(_line(raw, key), where,
                       "set 'job.keras: legacy' instead: orchestrate then sets it on every "
                       "worker and checks that tf_keras is installed")  # fmt: skip
            continue
        value, problem = scalar_string(item)
        if problem:
            report.add(_line(raw, key), where, problem)
        else:
            env[key] = value
    return env


def _parse_secret_env(block: LineMap, report: _Report, env: Mapping[str, str]) -> tuple[str, ...]:
    raw = block.get("secret_env", LineList())
    if not isinstance(raw, LineList):
        report.add(_line(block, "secret_env"), "job.secret_env",
                   "expected a list of environment variable names")  # fmt: skip
        return ()
    names: list[str] = []
    for index, item in enumerate(raw):
        where, line = f"job.secret_env[{index}]", raw.item_lines[index]
        if not isinstance(item, str) or not ENV_NAME_PATTERN.match(item):
            report.add(line, where, "expected an environment variable name (its value is "
                       "taken from the environment of 'orchestrate up')")  # fmt: skip
        elif item.startswith(RESERVED_ENV_PREFIXES):
            report.add(line, where, "is set by orchestrate for each worker")
        elif item in env:
            report.add(line, where, f"{item} is also in job.env; a secret's value must not be "
                       "written in the inventory")  # fmt: skip
        elif item in names:
            report.add(line, where, f"{item} is listed twice")
        else:
            names.append(item)
    return tuple(names)


def _hosts_source(
    document: LineMap, defaults: LineMap, report: _Report, base: Path
) -> tuple[list[Placed], None]:
    return _parse_hosts(document, defaults, report, base), None


def _slurm_source(
    document: LineMap, _defaults: LineMap, report: _Report, base: Path
) -> tuple[list[Placed], SlurmSpec | None]:
    from orchestrator.config.sources.slurm import parse_slurm, slurm_workers

    spec = parse_slurm(document, report, base)
    return (slurm_workers(spec, base) if spec else []), spec


HOST_SOURCES["hosts"] = _hosts_source
HOST_SOURCES["slurm"] = _slurm_source
# The `ansible:` source reuses this module's host parsing, so it registers after it exists.
from orchestrator import ansiblesource  # noqa: E402

HOST_SOURCES["ansible"] = ansiblesource.parse_ansible
