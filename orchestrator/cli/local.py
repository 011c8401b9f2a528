"""`orchestrate local SCRIPT`: the zero-config local simulation."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.backends.registry import load_inventory, load_inventory_text
from orchestrator.cli.app import Context, cli, errors, pass_context
from orchestrator.cli.run import start_and_supervise
from orchestrator.config.local import free_ports, job_name, local_inventory
from orchestrator.contract import KERAS_DEFAULT, KERAS_SETTINGS
from orchestrator.errors import InventoryError, Problem


@cli.command()
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]...")
@click.option(
    "-n", "--workers", default=2, show_default=True, type=click.IntRange(1, 64),
    help="How many local workers (TF_CONFIG cluster size).",
)  # fmt: skip
@click.option(
    "--keras", type=click.Choice(KERAS_SETTINGS), default=KERAS_DEFAULT, show_default=True,
    help="legacy: tf.keras is Keras 2 (tf_keras), for tf.keras 2 code such as model.fit under "
    "MultiWorkerMirroredStrategy; jax: a Keras 3 script on the JAX backend (keras.distribution), "
    "each worker given the JAX cluster's variables instead of TF_CONFIG.",
)  # fmt: skip
@click.option(
    "--save", "save_to", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
    help="Write the inventory to FILE (and run from it) instead of only showing it.",
)  # fmt: skip
@click.option("--workdir", metavar="DIR", help="The job's directory root [default: ~/orchestrate].")
@click.option("--max-restarts", type=click.IntRange(0), help="Restarts before the run fails.")
@click.option("--detach", "-d", is_flag=True, help="Return once every worker has started.")
@click.option("--skip-checks", is_flag=True, help="Start without the preflight checks.")
@click.option("--interval", default=1.0, show_default=True, metavar="SECONDS")
@pass_context
def local(  # noqa: PLR0917 - click passes every option by position
    context: Context,
    script: Path,
    args: tuple[str, ...],
    workers: int,
    keras: str,
    save_to: Path | None,
    workdir: str | None,
    max_restarts: int | None,
    detach: bool,
    skip_checks: bool,
    interval: float,
) -> None:
    """Run SCRIPT on N workers of this machine, with no inventory to write: like
    `torchrun --standalone --nproc-per-node N`.

    Each worker is a local process with TF_CONFIG (with --keras jax: KERAS_DISTRIBUTION_* and
    JAX_*) for a cluster on free localhost ports. The
    inventory it builds is shown (or written with --save FILE, to rerun with 'orchestrate up
    FILE'), then run exactly as 'up' runs it: preflight, start, supervision with restarts, the
    root cause when it fails. Arguments for the script go after '--':

    \b
    orchestrate local train.py -n 2 -- --epochs 3
    orchestrate local train.py --keras legacy --save two-workers.yaml
    orchestrate local keras3_train.py --keras jax
    """
    script = script.expanduser().resolve()
    if not script.is_file():
        raise InventoryError(
            [Problem(str(script), None, "SCRIPT", "no such file")],
            hint="name the training script to run, e.g. 'orchestrate local train.py'",
        )
    text = local_inventory(script, free_ports(workers), args, keras=keras,
                           max_restarts=max_restarts, workdir=workdir)  # fmt: skip
    if save_to is not None:
        save_to.write_text(text, encoding="utf-8")
        errors.print(f"wrote the inventory to {save_to}", markup=False, highlight=False)
        inventory = load_inventory(save_to)
        source = str(save_to)
    else:
        errors.print(text.rstrip(), markup=False, highlight=False)
        source = f"'orchestrate local {script.name}' (save it with --save FILE)"
        inventory = load_inventory_text(text, "<orchestrate local>", Path.cwd(), job_name(script))
    start_and_supervise(context, inventory, source, detach=detach, skip_checks=skip_checks,
                        probe_timeout=3.0, min_free_gb=1.0, interval=interval)  # fmt: skip
