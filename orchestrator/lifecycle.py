"""Start and stop the workers of a run on every machine, in parallel."""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.checkpoints import Mirror, spread_latest_checkpoint
from orchestrator.connect import MachineKey, Machines, machine_key
from orchestrator.errors import HostError, HostErrors
from orchestrator.fanout import fan_out, successes
from orchestrator.inventory import Inventory
from orchestrator.plan import WorkerSpec, new_run_id, plan_workers
from orchestrator.runstore import RunRecord, RunStore, WorkerRecord

DEFAULT_GRACE = 10.0


def resolve_workdirs(inventory: Inventory, machines: Machines) -> dict[str, str]:
    """Absolute workdir of every host: a relative one is relative to the login directory."""
    groups = Machines.group(inventory.hosts)
    homes = successes(
        fan_out(groups, lambda key: machines.agent(groups[key][0]).info()["home"]),
        "reaching the hosts",
    )
    workdirs = {}
    for key, hosts in groups.items():
        for host in hosts:
            workdirs[host.name] = _absolute(host.workdir, homes[key])
    return workdirs


def _absolute(path: str, home: str) -> str:
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    return path if path.startswith("/") else f"{home}/{path}"


def start_run(
    inventory: Inventory,
    store: RunStore,
    machines: Machines,
    say: Callable[[str], None] = lambda message: None,
) -> RunRecord:
    """Record a new run and start its first attempt."""
    record = RunRecord(run_id=new_run_id(), inventory=inventory, created_at=time.time())
    return launch_attempt(record, store, machines, say)


def launch_attempt(
    record: RunRecord,
    store: RunStore,
    machines: Machines,
    say: Callable[[str], None] = lambda message: None,
) -> RunRecord:
    """Start every worker of the record's current attempt detached, after making the chief's
    latest checkpoint present on every host; on a partial failure stop what started."""
    inventory = record.inventory
    workdirs = resolve_workdirs(inventory, machines)
    specs = plan_workers(inventory, record.run_id, workdirs, record.attempt)
    mirror = Mirror(store.mirror_path(record.run_id))
    spread = spread_latest_checkpoint(specs, machines, mirror)
    if spread.name:
        copied = f"copied to {', '.join(spread.copied_to)}" if spread.copied_to else "on every host"
        size = f"{spread.size_bytes / 2**20:.1f} MiB"
        origin = " (from this machine's copy)" if spread.source == "mirror" else ""
        say(f"resuming from checkpoint {spread.name}{origin} ({size}), {copied}")
    record = replace(record, workers=tuple(_record(spec) for spec in specs))
    store.save(record)  # before launching: a half-started run can still be found and stopped

    def launch(spec: WorkerSpec) -> int:
        upload(spec, machines)
        pid = int(machines.agent(spec.host).launch(spec.launch_request())["pid"])
        say(f"started {spec.name} ({spec.host.endpoint})")
        return pid

    results = fan_out(range(len(specs)), lambda index: launch(specs[index]))
    record = replace(
        record,
        workers=tuple(
            replace(worker, pid=pid if isinstance(pid, int) else None)
            for worker, pid in zip(record.workers, results.values(), strict=True)
        ),
    )
    store.save(record)
    failures = [r for r in results.values() if isinstance(r, HostError)]
    if failures:
        # The started workers would wait forever for the missing peers.
        stop_run(record, machines, grace=2.0)
        raise HostErrors(failures, "starting the workers")
    return record


def upload(spec: WorkerSpec, machines: Machines) -> None:
    """Copy the job's script and files into the worker's run directory, directories included."""
    if not spec.uploads:
        return
    files: list[tuple[str, str]] = []
    for local, remote in spec.uploads:
        source = Path(local)
        if source.is_dir():
            files.extend(
                (str(path), posixpath.join(remote, path.relative_to(source).as_posix()))
                for path in sorted(source.rglob("*"))
                if path.is_file() and "__pycache__" not in path.parts
            )
        else:
            files.append((local, remote))
    runner = machines.runner(spec.host)
    runner.make_dirs(sorted({posixpath.dirname(remote) for _, remote in files}))
    for local, remote in files:
        runner.put(local, remote)


def _record(spec: WorkerSpec) -> WorkerRecord:
    return WorkerRecord(
        name=spec.name,
        index=spec.index,
        host=spec.host,
        run_dir=spec.run_dir,
        log_path=spec.log_path,
        checkpoint_dir=spec.checkpoint_dir,
    )


@dataclass(frozen=True)
class StopReport:
    outcome: dict[str, str]  # worker name -> stopped | killed | not running | unreachable: ...
    leftovers: dict[str, list[int]]  # worker name -> pids still alive after SIGKILL


def stop_run(record: RunRecord, machines: Machines, grace: float = DEFAULT_GRACE) -> StopReport:
    """SIGTERM every worker's process group, SIGKILL what is left after `grace` seconds."""
    by_machine: dict[MachineKey, list[WorkerRecord]] = {}
    for worker in record.workers:
        by_machine.setdefault(machine_key(worker.host), []).append(worker)

    def stop(key: MachineKey) -> dict[str, dict]:
        workers = by_machine[key]
        return machines.agent(workers[0].host).stop([w.run_dir for w in workers], grace)

    answers = fan_out(by_machine, stop)
    outcome: dict[str, str] = {}
    leftovers: dict[str, list[int]] = {}
    for key, workers in by_machine.items():
        answer = answers[key]
        for worker in workers:
            if isinstance(answer, HostError):
                outcome[worker.name] = f"unreachable: {answer.message}"
                continue
            outcome[worker.name] = answer["outcome"].get(worker.run_dir, "not running")
            if worker.run_dir in answer["left"]:
                leftovers[worker.name] = answer["left"][worker.run_dir]
    return StopReport(outcome, leftovers)
