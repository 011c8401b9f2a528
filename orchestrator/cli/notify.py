"""`notify`: the inventory's notify targets, and a test event sent to each (`--test`)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from orchestrator.backends.registry import load_inventory
from orchestrator.cli.app import cli, console, errors, inventory_argument
from orchestrator.engine.observe.events import target_label
from orchestrator.engine.observe.notify import send_test
from orchestrator.errors import InventoryError, PartialFailure, Problem


@cli.command()
@inventory_argument
@click.option(
    "--test",
    "send",
    is_flag=True,
    help="Send every target a test event now and report each one's answer.",
)
def notify(inventory_file: Path, send: bool) -> None:
    """List the 'notify:' targets of INVENTORY and the events each is told of; with --test,
    send each a test event (event "test") from this machine, as the supervisor would, and say
    what it answered.

    Exit status: 0 when every target took the test event, 3 when one did not, 2 for an invalid
    inventory or one without 'notify:'.
    """
    inventory = load_inventory(inventory_file)
    targets = inventory.notify
    if not targets:
        raise InventoryError(
            [Problem(str(inventory_file), None, "notify", "no targets: nothing to tell")],
            hint="add a 'notify:' list of webhook: or command: targets (see Notifications)",
        )
    if not send:
        for index, target in enumerate(targets):
            signed = f", signed with {target.secret_env}" if target.secret_env else ""
            shape = f" ({target.format}{signed})" if target.url else ""
            console.print(
                f"{target_label(index, target)}{shape}: {', '.join(target.events)}",
                markup=False,
                highlight=False,
            )
        return
    answers = send_test(targets, inventory.base_dir, inventory.job.name, os.environ)
    for answer in answers:
        console.print(
            f"{answer.label}: {'ok' if answer.ok else 'FAILED'}: {answer.answer}",
            markup=False,
            highlight=False,
        )
    failed = [a.label for a in answers if not a.ok]
    if failed:
        raise PartialFailure(
            f"{len(failed)} of {len(answers)} notify target(s) did not take the test event: "
            + ", ".join(failed),
            hint="the line of each says why; a run's notifications fail the same way",
        )
    errors.print(f"every notify target ({len(answers)}) took the test event")
