"""`hosts` (the workers as resolved from either host source) and `setup` (sync and setup only)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from orchestrator.backends.base import Backend
from orchestrator.backends.capabilities import Reach
from orchestrator.backends.registry import load_inventory, open_backend
from orchestrator.cli.app import cli, console, errors
from orchestrator.model.inventory import Inventory, LoginDetails, WorkerSlot
from orchestrator.model.printable import strict_json


def _row(host: WorkerSlot, role: str, reach: Reach) -> dict[str, object]:
    details = reach.login_details(host) or LoginDetails()
    return {
        "name": host.name,
        "role": role,
        "connection": host.connection,
        "address": host.address,
        # port: auto: leased at `up` (see `orchestrate jobs`), from this range
        "port": "auto {}-{}".format(*host.port_range) if host.port_range else host.port,
        "ssh_alias": details.alias,
        "ssh_hostname": details.hostname,
        "ssh_user": details.user,
        "ssh_port": details.port,
        "ssh_key": details.key,
        "jump": details.jump,
        "python": host.python,
        "workdir": host.workdir,
    }


@cli.command()
@click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host instead.")
def hosts(inventory_file: Path, as_json: bool) -> None:
    """Print the workers of INVENTORY as resolved, in inventory order: name, role (its task
    type in TF_CONFIG: chief, worker, ps or evaluator; under MultiWorkerMirroredStrategy all
    are workers and the first is the chief; 'spares:' as spare), address, TensorFlow port, SSH
    user, port, key and jump host, and python, whether they come from 'hosts:' or from an
    Ansible inventory ('ansible:'), after ~/.ssh/config (or 'ssh_config') aliases. Connects to
    nothing."""
    inventory = load_inventory(inventory_file)
    with open_backend(inventory) as backend:  # connects to nothing: login details are resolved here
        rows = [_row(h, h.role, backend) for h in inventory.hosts]
        rows += [_row(h, "spare", backend) for h in inventory.spares]
    if as_json:
        for row in rows:
            console.print(strict_json(row), markup=False, highlight=False, soft_wrap=True)
        return
    table = Table(
        title=f"{len(inventory.hosts)} worker(s) of {inventory_file}", title_justify="left"
    )
    columns = ("name", "role", "address", "port", "ssh", "ssh_key", "jump", "python", "workdir")
    for column in columns:
        table.add_column(column)
    for row in rows:
        ssh = ""
        if row["ssh_port"]:
            alias = f" (alias {row['ssh_alias']})" if row["ssh_alias"] else ""
            where = row["ssh_hostname"] or row["address"]
            ssh = f"{row['ssh_user'] or '(your user)'}@{where}:{row['ssh_port']}{alias}"
        else:
            ssh = str(row["connection"])
        table.add_row(*(str(row[c] or "") if c != "ssh" else ssh for c in columns))
    console.print(table)


def _say(message: str) -> None:
    errors.print(f"  {message}", markup=False, highlight=False)


def prepare_before_checks(inventory: Inventory, backend: Backend, force_setup: bool) -> bool:
    """`up`: sync and set up before the preflight checks; False when there is nothing to do."""
    if not inventory.setup and inventory.sync is None:
        return False
    steps = [
        name for name, wanted in (("sync", inventory.sync), ("setup", inventory.setup)) if wanted
    ]
    errors.print(f"preparing {len(inventory.hosts)} host(s): {' and '.join(steps)}")
    workdirs = backend.workdirs(inventory.hosts).raise_if_failed("reaching the hosts")
    backend.prepare(inventory, workdirs, _say, force_setup=force_setup, spares=True)
    return True


@cli.command()
@click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option("--force", is_flag=True, help="Run the setup commands even where they ran already.")
def setup(inventory_file: Path, force: bool) -> None:
    """Mirror 'sync:' to every host and run the 'setup:' commands where they have not run yet
    (or changed since), on every host and spare at once; starts nothing.

    'orchestrate up' does the same before it starts the workers. Setup output is prefixed with
    the host's name. Exit status 3 when a host could not be reached or a command failed there.
    """
    inventory = load_inventory(inventory_file)
    if not inventory.setup and inventory.sync is None:
        errors.print(f"{inventory_file} has neither 'setup:' nor 'sync:'; nothing to do")
        return
    with open_backend(inventory) as backend:
        prepare_before_checks(inventory, backend, force)
    errors.print("hosts ready")
