"""Before a start: mirror `sync:` to the hosts, then run `setup:` where it has not run yet.

Called by lifecycle.launch_attempt for every attempt (so a spare that joins at a restart is
synced and set up before it starts) and by `orchestrate setup`. At the first attempt the
spares are prepared too, so a restart does not wait for a spare's setup; a spare that fails is
reported and tried again when it joins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.backends.hosts.setup import run_setup
from orchestrator.backends.hosts.sync import sync_hosts
from orchestrator.errors import HostError, HostErrors
from orchestrator.machines.pool import Machines
from orchestrator.model.inventory import Inventory, WorkerSlot
from orchestrator.model.workers import job_dir

Say = Callable[[str], None]


def prepare_hosts(
    inventory: Inventory,
    machines: Machines,
    workdirs: dict[str, str],
    say: Say,
    *,
    force_setup: bool = False,
    spares: bool = False,
) -> None:
    """Sync and set up the inventory's hosts (and its spares, with `spares`); raise HostErrors
    naming every host that failed, with its exit code and the last lines of its output."""
    if inventory.sync is None and not inventory.setup:
        return
    hosts = list(inventory.hosts)
    if spares and inventory.spares:
        found = machines.workdirs(inventory.spares)
        for name, error in found.failed.items():
            say(f"spare {name} not prepared: {error.message}")
        workdirs = {**workdirs, **found.ok}
        hosts += [spare for spare in inventory.spares if spare.name in found.ok]
    required = {host.name for host in inventory.hosts}
    job_dirs = {host.name: job_dir(inventory.job, workdirs[host.name]) for host in hosts}
    failed: dict[str, HostError] = {}
    if inventory.sync is not None:
        report = sync_hosts(inventory.sync, hosts, job_dirs)
        failed.update(report.result.failed)
        if report.result.ok:
            say(f"synced {inventory.sync.source}: {report.summary()}")
        hosts = [host for host in hosts if host.name not in failed]
    if inventory.setup:
        failed.update(_setup(inventory, hosts, job_dirs, machines, say, force=force_setup))
    for name in [name for name in failed if name not in required]:
        say(f"spare {name} not prepared: {failed.pop(name).message}")
    if failed:
        raise HostErrors(list(failed.values()), "preparing the hosts (sync, setup)")


def _setup(
    inventory: Inventory,
    hosts: Sequence[WorkerSlot],
    job_dirs: dict[str, str],
    machines: Machines,
    say: Say,
    *,
    force: bool,
) -> dict[str, HostError]:
    width = max(len(host.name) for host in hosts) if hosts else 0
    outcomes = run_setup(
        inventory.setup,
        hosts,
        job_dirs,
        machines,
        lambda name, line: say(f"{name:<{width}} | {line}"),
        force=force,
    )
    failed = dict(outcomes.failed)
    ran = [name for name, outcome in outcomes.ok.items() if outcome.ran]
    skipped = [name for name, outcome in outcomes.ok.items() if not outcome.ran]
    for name, outcome in outcomes.ok.items():
        if outcome.ran and outcome.exit_code != 0:
            tail = "\n".join(f"      {line}" for line in outcome.tail)
            failed[name] = HostError(
                name, f"setup failed with exit code {outcome.exit_code}; its last lines:\n{tail}",
                hint="fix the command under 'setup:' (or the host), then run "
                "'orchestrate setup INVENTORY'",
            )  # fmt: skip
    done = [name for name in ran if name not in failed]
    if done:
        say(f"setup done on {', '.join(done)}")
    if skipped:
        say(f"setup unchanged on {', '.join(skipped)} (skipped; --force-setup reruns it)")
    return failed
