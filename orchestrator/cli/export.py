"""`export`: the job for a scheduler to run it without orchestrate driving it."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from orchestrator.backends.registry import BACKEND_FORMATS, export_writer, load_inventory
from orchestrator.cli.app import cli, errors
from orchestrator.contract import KERAS_JAX
from orchestrator.engine.workers.plan import plan_workers
from orchestrator.errors import ExportRefused
from orchestrator.model.inventory import Inventory

FORMATS = (*BACKEND_FORMATS, "tfjob", "trainjob")


@cli.command()
@click.argument(
    "inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    required=True,
    help="sbatch: the batch script 'up' submits; tfjob: a Kubeflow TFJob manifest; trainjob: a "
    "Kubeflow Trainer v2 TrainJob with its TrainingRuntime.",
)
@click.option(
    "--image",
    metavar="IMAGE",
    help="tfjob, trainjob: the container image (TensorFlow and the worker package, or your "
    "script, inside).",
)
@click.option("--namespace", metavar="NS", help="tfjob, trainjob: the Kubernetes namespace.")
@click.option(
    "--pvc",
    metavar="NAME",
    help="tfjob, trainjob: a PersistentVolumeClaim for the checkpoints "
    "(mounted at /checkpoints), so they survive pod restarts.",
)
@click.option(
    "--name",
    metavar="NAME",
    help="tfjob, trainjob: the TFJob's (TrainJob's) name [default: job.name].",
)
@click.option(
    "--secret",
    metavar="NAME",
    help="tfjob, trainjob: the Kubernetes Secret with job.secret_env's values (one key per "
    "variable name), referenced with secretKeyRef; required when the job has secret_env.",
)
@click.option("--restart-policy", type=click.Choice(["ExitCode", "OnFailure"]),
              default="ExitCode", show_default=True,
              help="tfjob: the Worker replicas' policy (see below).")  # fmt: skip
@click.option("--workdir", metavar="DIR", default="/workspace", show_default=True,
              help="trainjob: where job.script is in the image; the pods' working "
              "directory.")  # fmt: skip
def export(  # noqa: PLR0917 - click passes every option by position
    inventory_file: Path, fmt: str, image: str | None, namespace: str | None, pvc: str | None,
           name: str | None, secret: str | None, restart_policy: str,
           workdir: str) -> None:  # fmt: skip
    """Print INVENTORY's job for a scheduler, to submit it yourself.

    \b
    --format sbatch   the self-contained batch script that 'orchestrate up' submits for a
                      slurm: inventory (for a hosts: inventory: one node per host). Run it with
                      plain 'sbatch FILE' from the directory of your task module; each task
                      writes its TF_CONFIG from Slurm's allocation. Nothing supervises it: a
                      failed task ends the job, and resubmitting it resumes from the checkpoint.
    --format tfjob    a kubeflow.org/v1 TFJob: one Worker replica per worker, the container
                      'tensorflow' running the job with the image, port tfjob-port 2222 (the
                      operator writes TF_CONFIG), backoffLimit = job.max_restarts. Under
                      ExitCode the job's permanent exit codes end the job and every other
                      failure (preemption's 75 included) is retried. Validated against the
                      TFJob CRD's schema and the operator's webhook rules; exit 2 if refused.
                      job.secret_env becomes secretKeyRef entries to the Secret --secret
                      names (create it with 'kubectl create secret generic NAME
                      --from-literal=VAR=...'); no value is ever in the manifest.
    --format trainjob two trainer.kubeflow.org/v1alpha1 documents for Kubeflow Trainer v2
                      (kubectl apply -f both): a TrainingRuntime (plain mlPolicy, numNodes =
                      the workers; its 'node' job runs the image under a small launcher that
                      writes each pod's TF_CONFIG from JOB_COMPLETION_INDEX and the pods'
                      names, port 2222) and the TrainJob using it. maxRestarts =
                      job.max_restarts restarts of all the pods; the permanent exit codes
                      fail the job (podFailurePolicy); job.script must be in the image
                      under --workdir; job.files needs --pvc. Validated against Trainer
                      v2.3.0's CRD schemas, CEL rules and webhook rules; exit 2 if refused.

    Secrets: the sbatch script never holds job.secret_env's values; export them in the shell
    that runs sbatch (its default --export=ALL passes them on).
    """
    inventory = load_inventory(inventory_file)
    if inventory.job.keras == KERAS_JAX and fmt == "tfjob":
        # A TFJob's operator writes TF_CONFIG; Kubeflow's JAX runtime is Trainer v2's.
        raise ExportRefused("job.keras: jax cannot be exported as a TFJob: its operator writes "
                            "TensorFlow's TF_CONFIG, not the JAX cluster's variables",
                            hint="export it as trainjob (Trainer v2's jax policy) or "
                            "sbatch")  # fmt: skip
    if fmt in BACKEND_FORMATS:
        click.echo(export_writer(fmt)(inventory, plan_workers), nl=False)
        return
    if fmt == "trainjob":
        _export_trainjob(inventory, image, namespace=namespace, pvc=pvc, name=name,
                         secret=secret, workdir=workdir)  # fmt: skip
        return
    _export_tfjob(inventory, image, namespace=namespace, pvc=pvc, name=name, secret=secret,
                  restart_policy=restart_policy)  # fmt: skip


def _export_tfjob(
    inventory: Inventory,
    image: str | None,
    *,
    namespace: str | None,
    pvc: str | None,
    name: str | None,
    secret: str | None,
    restart_policy: str,
) -> None:
    from orchestrator.export.tfjob import problems, tfjob

    if inventory.job.secret_env and not secret:
        raise ExportRefused(
            f"job.secret_env ({', '.join(inventory.job.secret_env)}) needs a Kubernetes Secret to "
            "refer to: the manifest never carries their values",
            hint="give --secret NAME, a Secret with one key per variable name (kubectl create "
            f"secret generic NAME --from-literal={inventory.job.secret_env[0]}=...)",
        )
    manifest = tfjob(inventory, image, name=name, namespace=namespace, pvc=pvc,
                     restart_policy=restart_policy, secret=secret)  # fmt: skip
    found = problems(manifest)
    if found:
        raise ExportRefused(
            "the TFJob would be rejected:\n" + "\n".join(f"  {line}" for line in found),
            hint="give --image IMAGE, and --name NAME (lower-case letters, digits, '-') when "
            "job.name is not a DNS-1035 label",
        )
    if not pvc:
        _warn_no_pvc()
    click.echo(yaml.safe_dump(manifest, sort_keys=False), nl=False)


def _warn_no_pvc() -> None:
    errors.print("warning: without --pvc the checkpoints live in the pod (emptyDir) and are "
                 "lost when a pod is replaced; a restart then starts from step 0",
                 markup=False, highlight=False)  # fmt: skip


def _export_trainjob(
    inventory: Inventory,
    image: str | None,
    *,
    namespace: str | None,
    pvc: str | None,
    name: str | None,
    secret: str | None,
    workdir: str,
) -> None:
    from orchestrator.export.trainjob import dump, files_dir, refusals, trainjob
    from orchestrator.export.trainjob_admission import problems

    refused = refusals(inventory, pvc, secret)
    if not image:
        refused.insert(0, "--image IMAGE is required: the container image the pods run "
                       "(TensorFlow and the worker package, or your script, inside)")  # fmt: skip
    if refused:
        raise ExportRefused("the job cannot be exported as a TrainJob:\n"
                            + "\n".join(f"  {line}" for line in refused))  # fmt: skip
    documents = trainjob(inventory, image, name=name, namespace=namespace, pvc=pvc,
                         secret=secret, workdir=workdir)  # fmt: skip
    found = problems(documents)
    if found:
        raise ExportRefused(
            "the TrainingRuntime or TrainJob would be rejected:\n"
            + "\n".join(f"  {line}" for line in found),
            hint="give --image IMAGE, and --name NAME (lower-case letters, digits, '-'; short "
            "enough for the pods' names) when job.name does not fit",
        )
    if not pvc:
        _warn_no_pvc()
    elif inventory.job.files:
        errors.print(f"note: copy job.files to {inventory.job.name}/files/ on claim {pvc} "
                     f"(mounted at {files_dir(inventory)}) before applying",
                     markup=False, highlight=False)  # fmt: skip
    click.echo(dump(documents), nl=False)
