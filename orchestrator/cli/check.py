"""`check` and `firewall`."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import click

from orchestrator.backends.base import Backend
from orchestrator.backends.registry import load_inventory, open_backend
from orchestrator.cli.app import Context, cli, errors
from orchestrator.cli.checkview import finding_hints, findings_table, firewall_script
from orchestrator.errors import InventoryError, PreflightFailed, Problem
from orchestrator.model.findings import (
    DEFAULT_MIN_FREE_BYTES,
    DEFAULT_PROBE_TIMEOUT,
    PreflightOptions,
    PreflightReport,
    Status,
)
from orchestrator.model.firewall import FORMATS
from orchestrator.model.inventory import Inventory
from orchestrator.model.printable import strict_json

CHECK_RUN_ID = "check"  # no run of that id exists: a dry lease keeps nothing of any run


def _warn(message: str) -> None:
    errors.print(message, markup=False, highlight=False)


probe_timeout_option = click.option(
    "--probe-timeout",
    default=DEFAULT_PROBE_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="How long each port probe between two hosts may take.",
)
min_free_option = click.option(
    "--min-free-gb",
    default=DEFAULT_MIN_FREE_BYTES / 2**30,
    show_default=True,
    metavar="GIB",
    help="Free space wanted under the workdir and checkpoint directory.",
)


def run_checks(
    inventory: Inventory,
    backend: Backend,
    probe_timeout: float,
    min_free_gb: float,
    *,
    perf: bool = False,
) -> PreflightReport:
    doing = "every host and every port between them" + (", and their speed" if perf else "")
    with errors.status(f"preflight: checking {doing}"):
        options = PreflightOptions(
            probe_timeout, int(min_free_gb * 2**30), exposure=True, perf=perf
        )
        report = backend.preflight(inventory, options)
        # The tracker (job.tracking) from this machine: a warning at most, never a block.
        # Imported here: the engine is not loaded for an inventory that is refused.
        from orchestrator.engine.trackers.tracking import tracking_findings

        report = PreflightReport((*report.findings, *tracking_findings(inventory)))
    _record(report, inventory)
    return report


def _record(report: PreflightReport, inventory: Inventory) -> None:
    """The last findings, for the dashboard; a state directory that cannot be written to
    must not stop a check."""
    context = click.get_current_context().find_object(Context)
    if context is None:
        return
    document = {"checked_at": time.time(), "inventory": inventory.path,
                "findings": [f.to_json() for f in report.findings]}  # fmt: skip
    with contextlib.suppress(OSError):
        context.store.write_file(context.store.preflight_path(), json.dumps(document))


def show_findings(report: PreflightReport, only_problems: bool) -> None:
    if only_problems:
        report = PreflightReport(tuple(f for f in report.findings if f.status is not Status.OK))
        if not report.findings:
            return
    errors.print(findings_table(report))
    for hint in finding_hints(report):
        errors.print(f"hint: {hint}", markup=False, highlight=False)


def blocking_error(report: PreflightReport) -> PreflightFailed:
    hosts = sorted({f.host for f in report.blocking})
    return PreflightFailed(
        f"preflight found {len(report.blocking)} problem(s) on {', '.join(hosts)}",
        hint="fix them and run 'orchestrate check INVENTORY' again "
        "('orchestrate up --skip-checks' starts anyway)",
    )


@cli.command()
@click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per finding.")
@click.option(
    "--perf",
    is_flag=True,
    help="Also measure each host's compute (a 1 s matmul) and each ring link's throughput, and "
    "warn about the slow ones (a few seconds more; see 'preflight: {perf: true}' for 'up').",
)
@probe_timeout_option
@min_free_option
def check(
    inventory_file: Path, as_json: bool, perf: bool, probe_timeout: float, min_free_gb: float
) -> None:
    """Find every reason the cluster would fail or hang, on every host at once, before starting.

    \b
    SSH login; Python, TensorFlow and worker versions (the same everywhere); each TensorFlow port
    free on its host (and who holds it if not); each port reachable from every other host
    (timed out: a firewall drops packets; refused: nothing listens or a REJECT rule); loopback
    addresses mixed with remote hosts; writable directories with free space; proxy variables that
    would capture the workers' gRPC traffic; a warning when this machine, not in the cluster, can
    connect to a host's TensorFlow port (see 'orchestrate firewall'). Leaves no listener or
    process behind. With --perf, a warning names a host below 0.7x the others' compute and a
    ring link below 0.5x the others' throughput (hosts of one machine are measured in turn).
    Exit status 5 when something blocks the run (slow hosts and links are warnings).
    """
    inventory = load_inventory(inventory_file)
    with open_backend(inventory) as backend:
        # port: auto and gpus: N: what `up` would lease now (nothing is held); a clash exits 4.
        # Imported here: the lifecycle pulls in the engine, which a refused inventory never needs.
        from orchestrator.engine.workers.lifecycle import take_leases

        inventory = take_leases(inventory, CHECK_RUN_ID, backend.leasing, _warn, dry_run=True)
        report = run_checks(inventory, backend, probe_timeout, min_free_gb, perf=perf)
    if as_json:
        click.echo(strict_json([f.to_json() for f in report.findings], indent=2))
    else:
        show_findings(report, only_problems=False)
    if report.blocking:
        raise blocking_error(report)
    errors.print(f"[green]preflight passed[/] on {len(inventory.hosts)} host(s)")


@cli.command()
@click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="iptables",
    show_default=True,
    help="The firewall tool the hosts use.",
)
@click.option(
    "--controller",
    metavar="ADDRESS",
    help="This machine's address as the hosts see it, for the SSH rule "
    "(default: the source address of the route to the first SSH host).",
)
def firewall(inventory_file: Path, fmt: str, controller: str | None) -> None:
    """Print, per host, the commands that open its TensorFlow port to the other cluster hosts only.

    The TensorFlow gRPC port is unauthenticated: anyone who can reach it can join or disturb the
    job. These rules admit the cluster's own addresses, then drop the port for everyone else (on
    a host whose INPUT policy is ACCEPT the accepts alone would close nothing), plus SSH from
    this machine. Nothing is applied: review them and run each block on its host.
    """
    inventory = load_inventory(inventory_file)
    with open_backend(inventory) as backend:
        if backend.firewall is None:
            raise _no_firewall(inventory)
        rules = backend.firewall.firewall_rules(inventory, fmt, controller)
    click.echo(firewall_script(rules, fmt))


def _no_firewall(inventory: Inventory) -> InventoryError:
    """A backend without firewall rules: its machines are not the hosts the inventory lists."""
    where = f"`{inventory.host_source}:`" if inventory.host_source else "its host source"
    problem = Problem(inventory.path, None, "", f"the workers are placed by {where}, whose "
                      "machines orchestrate writes no firewall rules for")  # fmt: skip
    return InventoryError([problem], hint="ask the cluster's administrators which ports its "
                          "nodes may use between each other")  # fmt: skip
