"""Load and validate an inventory file into frozen dataclasses. Pure apart from reading the file.

Every problem of a file is collected (not only the first) and reported with the file, the line, the
key path and what was expected. The host sources an inventory may use (`hosts:`, `slurm:`, ...)
are a parameter: the backends' registry names them (backends/registry.py, `load_inventory`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.boundedread import INVENTORY_CAP, read_bytes
from orchestrator.config.job import JOB_KEY_ENTRIES, parse_job
from orchestrator.config.notify import NOTIFY_KEY_ENTRIES, parse_notify
from orchestrator.config.preflight import PREFLIGHT_KEY_ENTRIES, parse_preflight
from orchestrator.config.report import Report, line_of
from orchestrator.config.roles import check_roles, chief_first
from orchestrator.config.setup import parse_setup
from orchestrator.config.sources.base import HostSource
from orchestrator.config.sources.hosts import (
    HOST_KEY_ENTRIES,
    PER_HOST_ONLY,
    Placed,
    host_keys,
    parse_hosts,
)
from orchestrator.config.sync import SYNC_KEY_ENTRIES, parse_sync
from orchestrator.config.tracking import TRACKING_KEY_ENTRIES
from orchestrator.contract import (
    EXPORT_FORMATS,
    KERAS_JAX,
    STRATEGY_MIRRORED,
    STRATEGY_MULTI_WORKER,
    STRATEGY_PS,
)
from orchestrator.errors import InventoryError
from orchestrator.machines import kinds
from orchestrator.model.inventory import (
    ROLE_EVALUATOR,
    Inventory,
    Job,
    WorkerSlot,
)
from orchestrator.paths import is_loopback
from orchestrator.values import (
    Key,
    describe,
    integer,
    key_names,
)
from orchestrator.yamlsource import LineMap, YamlSyntaxError, parse

__all__ = ["HostSource", "Inventory", "Job", "WorkerSlot", "is_loopback", "load_inventory"]


# The top level's keys besides the host sources. A host source (config/sources/base.HostSource,
# passed in by the caller) turns its top-level block into the workers, in TF_CONFIG order, and
# its own settings if it places them itself. An inventory takes exactly one; spares (and later
# min_hosts) apply to whatever it produced.
TOP_KEY_ENTRIES: tuple[Key, ...] = (
    Key("defaults", "mapping of host keys", "`{}`",
        "every key here applies to every host (and spare) unless the host sets it"),
    Key("spares", "list of hosts", "`[]`",
        "hosts in the same form as `hosts:`: when the supervisor restarts the cluster and a "
        "host does not answer, the next spare takes its place"),
    Key("min_hosts", "integer, at least 1", "every host",
        "lets a restart go on without hosts that do not answer once no spare is left, down to "
        "that many workers"),
    Key("setup", "list of shell commands", "",
        "run on every host and spare before the preflight checks, as one bash script per host; "
        "skipped while unchanged"),
    Key("sync", "a directory, or a mapping (`sync:` keys)", "",
        "a directory of this machine mirrored to `{workdir}/{job}/code/` on every host before "
        "every start"),
    Key("job", "mapping (`job:` keys)", "required", "what every worker runs"),
    Key("preflight", "mapping (`preflight:` keys)", "",
        "what `up`'s preflight check does besides its usual checks"),
    Key("notify", "list of targets (`notify:` keys)", "`[]`",
        "webhooks and commands told when the run starts, restarts, stalls, is preempted, "
        "succeeds, fails or is stopped (see Notifications)"),
)  # fmt: skip
TOP_KEYS: tuple[str, ...] = key_names(TOP_KEY_ENTRIES)


def key_reference(
    sources: Sequence[HostSource],
) -> tuple[tuple[str, str, tuple[Key, ...]], ...]:
    """The one registry of inventory keys: every block as (where, what it is, its entries).

    Each block's known-key check is derived from the same entries (HOST_KEYS, JOB_KEYS, TOP_KEYS,
    a source's keys, SYNC_KEYS, a kind's keys), and the manual's key reference is written from
    this (docs/hooks/reference.py), so the loader accepts exactly what it describes.
    """
    names = ", ".join(f"`{source.name}:`" for source in sources)
    blocks: list[tuple[str, str, tuple[Key, ...]]] = [
        (
            "top level",
            f"the inventory file's own keys: exactly one of {names} lists the workers",
            (*(source.key for source in sources), *TOP_KEY_ENTRIES),
        ),
        (
            "hosts",
            "every entry of `hosts:` and `spares:`, or `defaults:` for all of them, "
            "whatever its connection kind",
            HOST_KEY_ENTRIES,
        ),
    ]
    for kind_name in kinds.names():
        kind = kinds.get(kind_name)
        if kind.keys or kind.key_entries:  # a kind's keys without entries fail the tests
            blocks.append(
                (
                    f"connection: {kind.name}",
                    f"host keys of `connection: {kind.name}` only",
                    kind.key_entries,
                )
            )
    blocks += [
        ("job", "what every worker runs", JOB_KEY_ENTRIES),
        (
            "job.tracking",
            "the experiment tracker of every run (see Experiment tracking)",
            TRACKING_KEY_ENTRIES,
        ),
        ("sync", "`sync: DIR` is `sync: {source: DIR}`", SYNC_KEY_ENTRIES),
        ("preflight", "what `up`'s preflight check adds", PREFLIGHT_KEY_ENTRIES),
        ("notify", "each entry of `notify:`: a webhook or a command", NOTIFY_KEY_ENTRIES),
    ]
    for source in sources:
        blocks += source.blocks
    return tuple(blocks)


def load_inventory(path: str | Path, sources: Sequence[HostSource]) -> Inventory:
    """Read, validate and resolve an inventory file whose workers come from one of `sources`;
    raises InventoryError listing every problem."""
    source = Path(path)
    report = Report(str(path))
    try:
        raw = read_bytes(source, INVENTORY_CAP)
        text = raw.decode("utf-8")
    except OSError as exc:
        report.add(None, "", f"cannot read the file: {exc.strerror or exc}")
        raise InventoryError(report.problems, hint="check the path of the inventory file") from exc
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        report.add(line, "", f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                             f"{exc.start}): is this the inventory, or a binary file?")  # fmt: skip
        raise InventoryError(report.problems, hint="an inventory is a YAML text file") from exc
    return load_inventory_text(text, str(path), source.resolve().parent, source.stem, sources)


def load_inventory_text(
    text: str, label: str, base_dir: Path, stem: str, sources: Sequence[HostSource]
) -> Inventory:
    """An inventory held in memory (`orchestrate local`'s), read as if it were the file `label`
    in `base_dir`: relative paths resolve there, and local workers start there."""
    report = Report(label)
    try:
        document = parse(text)
    except YamlSyntaxError as exc:
        report.add(exc.line, "", exc.message)
        raise InventoryError(report.problems) from exc
    inventory = parse_inventory(document, report, base_dir, stem, sources)
    if report.problems or inventory is None:
        raise InventoryError(report.problems)
    return inventory


def parse_inventory(
    document: Any, report: Report, base_dir: Path, stem: str, sources: Sequence[HostSource]
) -> Inventory | None:
    if not isinstance(document, LineMap):
        report.add(
            None, "", f"expected a mapping with 'hosts:' and 'job:', got {describe(document)}"
        )
        return None
    report.unknown_keys(document, (*(source.name for source in sources), *TOP_KEYS), "")
    defaults = document.get("defaults") or LineMap()  # an empty `defaults:` is None in YAML
    if not isinstance(defaults, LineMap):
        report.add(line_of(document, "defaults"), "defaults", "expected a mapping of host keys")
        defaults = LineMap()
    report.unknown_keys(defaults, host_keys(), "defaults")
    for key in PER_HOST_ONLY:
        if key in defaults:
            report.add(line_of(defaults, key), f"defaults.{key}", "must be set on each host")
    source, placed, source_settings = _workers(document, defaults, report, base_dir, sources)
    spares = parse_hosts(document, defaults, report, base_dir, key="spares")
    _check_unique_hosts(placed + spares, report)
    hosts = [host for _, _, host in placed]
    job = parse_job(document, report, stem, base_dir)
    if job is not None:
        _check_job_fits_hosts(job, hosts, document, report)
        refused = source.roles if source is not None else None
        own = source.check_roles if source is not None else None
        check_roles(placed, spares, job, document, report, refused=refused, own=own)
        if source is not None and source.check_job is not None:
            source.check_job(job, document, report)
    min_hosts = _parse_min_hosts(document, len(hosts), report)
    setup = parse_setup(document["setup"], line_of(document, "setup"), report) \
        if "setup" in document else ()  # fmt: skip
    sync = parse_sync(document["sync"], line_of(document, "sync"), report, base_dir) \
        if "sync" in document else None  # fmt: skip
    notify = parse_notify(document["notify"], line_of(document, "notify"), report, base_dir) \
        if "notify" in document else ()  # fmt: skip
    for key in ("setup", "sync"):
        if key in document and source is not None and source.no_setup:
            report.add(line_of(document, key), key, source.no_setup)
    perf = parse_preflight(document.get("preflight"), line_of(document, "preflight"), report)
    if job is None or report.problems:
        return None
    return Inventory(
        path=report.path,
        base_dir=str(base_dir),
        hosts=chief_first(hosts),
        job=job,
        spares=tuple(host for _, _, host in spares),
        min_hosts=min_hosts,
        setup=setup,
        sync=sync,
        host_source=source.name if source is not None else None,
        source_settings=source_settings,
        perf_check=perf,
        notify=notify,
    )


def _parse_min_hosts(document: LineMap, count: int, report: Report) -> int | None:
    if "min_hosts" not in document:
        return None
    value, problem = integer(1, max(count, 1))(document["min_hosts"])
    if problem:
        report.add(line_of(document, "min_hosts"), "min_hosts",
                   f"{problem} (the number of workers a restart may go on with)")  # fmt: skip
        return None
    return int(value)


def _check_job_fits_hosts(
    job: Job, hosts: list[WorkerSlot], document: LineMap, report: Report
) -> None:
    block = document["job"]
    if job.keras == KERAS_JAX:
        _check_jax_job(job, hosts, block, report)
    hosts = [host for host in hosts if host.role != ROLE_EVALUATOR]  # the training hosts
    if job.strategy == STRATEGY_MIRRORED and len(hosts) > 1:
        report.add(
            line_of(block, "strategy"),
            "job.strategy",
            f"mirrored runs on one host, but {len(hosts)} hosts are listed; "
            "use multi-worker for several hosts",
        )
    if job.profile_steps and job.profile_steps[0] >= job.profile_steps[1]:
        report.add(
            line_of(block, "profile_steps"),
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
        for key in (
            "strategy",
            "profile_steps",
            "eval_every",
            "export",
            "steps_per_call",
            "seed",
            "async_checkpoints",
        ):
            if key in block and not (key == "strategy" and job.strategy == STRATEGY_PS):
                report.add(line_of(block, key), f"job.{key}", "applies to job.task only")


def _check_jax_job(job: Job, hosts: list[WorkerSlot], block: LineMap, report: Report) -> None:
    """What `keras: jax` runs: a script, or the built-in loop (worker/jaxloop.py); one process
    per host, no evaluator (JAX's processes are one cluster of equals, the first its
    coordinator), none of TensorFlow's own tools."""
    if job.strategy != STRATEGY_MULTI_WORKER:
        report.add(line_of(block, "strategy"), "job.strategy",
                   f"{job.strategy} is TensorFlow's; under keras: jax leave it unset")  # fmt: skip
    for host in hosts:
        if host.role == ROLE_EVALUATOR:
            report.add(None, f"hosts.{host.name}.role", "an evaluator reads TensorFlow "
                       "checkpoints; a keras: jax job has none: leave role unset")  # fmt: skip
    if job.warm_restarts:
        report.add(line_of(block, "warm_restarts"), "job.warm_restarts",
                   "a standby imports TensorFlow, which a keras: jax host does not have: "
                   "leave it unset")  # fmt: skip
    if job.task is None:
        return
    if job.profile_steps:
        report.add(line_of(block, "profile_steps"), "job.profile_steps",
                   "TensorFlow's profiler; under keras: jax leave it unset")  # fmt: skip
    if job.export is not None and job.export != EXPORT_FORMATS[0]:
        report.add(line_of(block, "export"), "job.export",
                   f"{job.export} is a TensorFlow SavedModel; under keras: jax the loop exports "
                   f"{EXPORT_FORMATS[0]} (model.keras)")  # fmt: skip


def _check_steps_per_call(job: Job, block: LineMap, report: Report) -> None:
    """The worker refuses the same (worker.config.check_steps_per_call); said here with lines."""
    k = job.steps_per_call
    for key in ("log_every", "checkpoint_every", "eval_every"):
        every = getattr(job, key)
        if k > 1 and every is not None and every % k:
            where = key if key in block else "steps_per_call"
            report.add(
                line_of(block, where),
                f"job.{key}",
                f"{every} must be a multiple of steps_per_call ({k}): the worker sees the "
                f"steps only at the end of each call of {k} steps"
                + ("" if key in block else f" (the default {key} is {every})"),
            )


def _workers(
    document: LineMap, defaults: LineMap, report: Report, base: Path,
    sources: Sequence[HostSource],
) -> tuple[HostSource | None, list[Placed], Any]:  # fmt: skip
    """The one source the document uses, its workers and its settings."""
    present = [source for source in sources if source.name in document]
    names = ", ".join(source.name for source in sources)
    if len(present) > 1:
        report.add(
            line_of(document, present[1].name),
            present[1].name,
            f"set exactly one of {names}: each lists the workers",
        )
        return None, [], None
    if not present:
        report.add(document.line, sources[0].name, f"missing; list the workers with one of {names}")
        return None, [], None
    placed, source_settings = present[0].parse(document, defaults, report, base)
    return present[0], placed, source_settings


def _check_unique_hosts(placed: list[Placed], report: Report) -> None:
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
        if host.port_range is not None:
            continue  # port: auto: the host's lease gives every worker its own
        if endpoint in seen_endpoints:
            report.add(
                line,
                f"{where}.port",
                f"{host.endpoint} is already used by {seen_endpoints[endpoint]}; "
                "two workers cannot share a port",
            )
        seen_endpoints.setdefault(endpoint, where)
