"""`jobs`: every job of any user holding leases (ports, GPUs) on an inventory's hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from orchestrator.backends.registry import load_inventory, open_backend
from orchestrator.cli.app import Context, cli, console, errors, pass_context
from orchestrator.cli.render import jobs_table, queue_table
from orchestrator.engine.supervision.locks import supervised_run
from orchestrator.model.inventory import Inventory
from orchestrator.model.leases import LeaseListing
from orchestrator.model.printable import strict_json


@cli.command()
@click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document: jobs, queued, ignored, runs_here.")  # fmt: skip
@pass_context
def jobs(context: Context, inventory_file: Path, as_json: bool) -> None:
    """Every job holding leases on INVENTORY's hosts, whoever started it: its user, job, run,
    hosts, ports, GPUs and since when (from the lease records in each host's lease_dir; see
    'port: auto' and 'gpus:'). Records that are not what orchestrate writes there are ignored
    and named. Slurm runs hold no leases: the scheduler places them. Then the jobs queued
    for them ('up --queue'), in the order they will start, and this directory's live run on
    those hosts when it uses fixed ports (it holds them without a lease).
    """
    inventory = load_inventory(inventory_file)
    with open_backend(inventory) as backend:
        listing = backend.leasing.leases(inventory) if backend.leasing else LeaseListing()
    here = fixed_port_run(context, inventory, listing)
    if as_json:
        click.echo(strict_json({**listing.to_json(), "runs_here": [here] if here else []},
                               indent=2))  # fmt: skip
        return
    if listing.jobs:
        console.print(jobs_table(listing))
    elif here is None:
        errors.print("no job holds a lease on these hosts", markup=False, highlight=False)
    if here is not None:
        ports = ", ".join(f"{w['worker']} {w['address']}:{w['port']}" for w in here["workers"])
        errors.print(f"run {here['run_id']} of job {here['job']} (this directory) holds fixed "
                     f"ports, without a lease: {ports}", markup=False, highlight=False)  # fmt: skip
    if listing.queued:
        console.print(queue_table(listing))
    for ignored in listing.ignored:
        errors.print(f"warning: {ignored.describe()}", markup=False, highlight=False)
    for host, why in listing.failed.items():
        errors.print(f"warning: {host} did not answer: {why}", markup=False, highlight=False)


def fixed_port_run(
    context: Context, inventory: Inventory, listing: LeaseListing
) -> dict[str, Any] | None:
    """This state directory's live run on the inventory's hosts whose ports no lease holds
    (`port:` numbers of its own): `jobs` would otherwise say no job holds anything there."""
    record = supervised_run(context.store)
    if record is None or any(job.holder.run_id == record.run_id for job in listing.jobs):
        return None
    addresses = {host.address for host in inventory.hosts}
    workers = [w for w in record.workers if w.host.address in addresses]
    if not workers:
        return None
    return {
        "run_id": record.run_id,
        "job": record.job_name,
        "workers": [
            {"worker": w.name, "address": w.host.address, "port": w.host.port} for w in workers
        ],
    }
