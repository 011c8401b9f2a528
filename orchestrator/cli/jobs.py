"""`jobs`: every job of any user holding leases (ports, GPUs) on an inventory's hosts."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.backends.registry import load_inventory, open_backend
from orchestrator.cli.app import cli, console, errors
from orchestrator.cli.render import jobs_table, queue_table
from orchestrator.model.leases import LeaseListing
from orchestrator.model.printable import strict_json


@cli.command()
@click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document: jobs, queued, ignored.")
def jobs(inventory_file: Path, as_json: bool) -> None:
    """Every job holding leases on INVENTORY's hosts, whoever started it: its user, job, run,
    hosts, ports, GPUs and since when (from the lease records in each host's lease_dir; see
    'port: auto' and 'gpus:'). Records that are not what orchestrate writes there are ignored
    and named. Slurm runs hold no leases: the scheduler places them. Then the jobs queued
    for them ('up --queue'), in the order they will start.
    """
    inventory = load_inventory(inventory_file)
    with open_backend(inventory) as backend:
        listing = backend.leasing.leases(inventory) if backend.leasing else LeaseListing()
    if as_json:
        click.echo(strict_json(listing.to_json(), indent=2))
        return
    if listing.jobs:
        console.print(jobs_table(listing))
    else:
        errors.print("no job holds a lease on these hosts", markup=False, highlight=False)
    if listing.queued:
        console.print(queue_table(listing))
    for ignored in listing.ignored:
        errors.print(f"warning: {ignored.describe()}", markup=False, highlight=False)
    for host, why in listing.failed.items():
        errors.print(f"warning: {host} did not answer: {why}", markup=False, highlight=False)
