"""A Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) with its own namespaced
TrainingRuntime, from an inventory; what of a job it cannot carry (`refusals`). Pure apart
from reading the launcher's source. The checks an API server would make before accepting them
are trainjob_admission.py's.

Trainer v2 has no TensorFlow runtime, so the runtime is a plain one (`mlPolicy` with only
`numNodes`, no framework policy) whose `node` replicated job runs the image under
hostside/pod_launcher.py: the launcher writes each pod's TF_CONFIG from the worker list computed
here (JobSet's pod host names `{name}-node-0-{i}.{name}:2222`) and the pod's JOB_COMPLETION_INDEX.

A `keras: jax` job targets the Trainer's own JAX policy instead (`mlPolicy.jax`, as its
`jax-distributed` runtime declares it): for a TrainJob with a `trainer`, the Trainer's jax plugin
(pkg/runtime/framework/plugins/jax, v2.3.0) gives the `node` container JAX_NUM_PROCESSES,
JAX_PROCESS_ID (the completion index) and JAX_COORDINATOR_ADDRESS (pod 0 at port 29500); the
launcher checks them against the export's pod list and adds the KERAS_DISTRIBUTION_* variables
Keras reads, which the Trainer does not write. No TF_CONFIG.

Semantics, as close to the TFJob export as Trainer v2 (JobSet over Indexed Jobs) allows:
- restarts: the Job has backoffLimit 0, so any failed pod fails its Job and JobSet recreates the
  whole set (every worker, as one MultiWorkerMirroredStrategy cluster must), at most
  `failurePolicy.maxRestarts` = job.max_restarts times; a preemption (exit 75) spends one;
- permanent exit codes: a podFailurePolicy FailJob rule on the `node` container's codes, and a
  JobSet rule that fails the set (FailJobSet) when a Job failed by that policy: no restart;
- GPU limits (Inventory.gpus_per_worker), the checkpoint PVC at /checkpoints/{job}, job.env,
  job.secret_env as secretKeyRef to --secret (never a value), the job's args.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from orchestrator.contract import ISOLATED, JAX_PLACE_ENV, KERAS_JAX
from orchestrator.export import kubernetes as k8s
from orchestrator.hostside import pod_launcher
from orchestrator.hostside.bundle import shipped_program
from orchestrator.model.inventory import Inventory, Job
from orchestrator.model.launch import WorkerLaunch

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
NODE = "node"  # the trainer's replicated job and container (constants.Node)
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
PORT = k8s.PORT
PORT_NAME = "tf-worker"
# The Trainer's ContainerTrainerPort, where its jax policy puts JAX's coordinator (pod 0).
JAX_PORT = 29500
JAX_PORT_NAME = "jax-coordinator"
CHECKPOINT_MOUNT = k8s.CHECKPOINT_MOUNT
DEFAULT_WORKDIR = "/workspace"
PERMANENT_RULE = "permanent_exit_code"
# The pod's command runs it as `python -c SOURCE ARGV...`: with the modules it imports (contract).
LAUNCHER_SOURCE = shipped_program("pod_launcher.py")


def worker_hosts(name: str, count: int, port: int = PORT) -> list[str]:
    """The pods' stable names under JobSet: `{jobset}-{replicatedJob}-{jobIndex}-{podIndex}` in
    the subdomain named after the JobSet, which the Trainer names after the TrainJob."""
    return [f"{name}-{NODE}-0-{index}.{name}:{port}" for index in range(count)]


def refusals(inventory: Inventory, pvc: str | None, secret: str | None) -> list[str]:
    """What of the job a TrainJob cannot carry as asked (each: the reason and what to give)."""
    job = inventory.job
    found = []
    if job.secret_env and not secret:
        found.append(
            f"job.secret_env ({', '.join(job.secret_env)}) needs a Kubernetes Secret to refer "
            "to: the manifest never carries their values; give --secret NAME, a Secret with "
            f"one key per variable name (kubectl create secret generic NAME "
            f"--from-literal={job.secret_env[0]}=...)"
        )
    if job.files and not pvc:
        found.append(
            "job.files are uploaded next to the worker on hosts, and a pod has nowhere to "
            "receive them: give --pvc NAME and copy them to the claim's "
            f"{job.name}/files/ (the pods' working directory), or build them into the image "
            "and drop files:"
        )
    roles = sorted({host.role for host in inventory.hosts} - {"worker"})
    if roles:
        found.append(
            f"hosts with role {', '.join(roles)}: a TrainJob's pods are all workers (Trainer "
            "v2 has no TensorFlow runtime with chief, ps or evaluator replicas); use --format "
            "tfjob, which writes Chief, PS, Worker and Evaluator replica specs"
        )
    return found


def files_dir(inventory: Inventory) -> str:
    return posixpath.join(CHECKPOINT_MOUNT, inventory.job.name, "files")


def trainjob(
    inventory: Inventory,
    image: str | None,
    *,
    name: str | None = None,
    namespace: str | None = None,
    pvc: str | None = None,
    secret: str | None = None,
    workdir: str = DEFAULT_WORKDIR,
) -> list[dict[str, Any]]:
    """[the TrainingRuntime, the TrainJob], both named `name` (default job.name).

    `workdir`: where a job.script is in the image (and the pods' working directory); with
    job.files (which needs `pvc`) the working directory is their directory on the claim."""
    job = inventory.job
    name = name or job.name
    jax, nodes = job.keras == KERAS_JAX, len(inventory.hosts)
    checkpoints = k8s.checkpoint_path(job, pvc)
    workers = worker_hosts(name, nodes, JAX_PORT if jax else PORT)
    container = _container(inventory, image, checkpoints, secret=secret, workdir=workdir,
                           workers=workers)  # fmt: skip
    job_spec = _job_spec(job, container, k8s.checkpoint_volume(pvc))
    framework = "jax" if jax else "tensorflow"
    metadata = k8s.metadata(name, namespace, {"trainer.kubeflow.org/framework": framework})
    policy: dict[str, Any] = {"numNodes": nodes, **({"jax": {}} if jax else {})}
    runtime = _runtime(metadata, policy, job.max_restarts, job_spec)
    spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": API_GROUP, "kind": "TrainingRuntime", "name": name}
    }
    if jax:  # the jax plugin writes its variables only for a TrainJob with a trainer
        spec["trainer"] = {"numNodes": nodes}
    train_job = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": dict(metadata, labels=dict(k8s.APP_LABELS)),
        "spec": spec,
    }
    return [runtime, train_job]


def _job_spec(job: Job, container: dict[str, Any], volume: dict[str, Any]) -> dict[str, Any]:
    """The Indexed Job of the `node` replicated job: one pod per worker, never retried alone."""
    pod_spec = {
        "restartPolicy": "Never",  # a failed worker fails its Job; JobSet restarts them all
        "containers": [container],
        "volumes": [volume],
    }
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",  # JOB_COMPLETION_INDEX: the worker's index
        "backoffLimit": 0,
        "template": {"spec": pod_spec},
    }
    if job.permanent_exit_codes:
        job_spec["podFailurePolicy"] = {"rules": [{
            "action": "FailJob",
            "onExitCodes": {"containerName": NODE, "operator": "In",
                            "values": sorted(set(job.permanent_exit_codes))},
        }]}  # fmt: skip
    return job_spec


def _runtime(
    metadata: dict[str, Any], policy: dict[str, Any], max_restarts: int, job_spec: dict[str, Any]
) -> dict[str, Any]:
    """The TrainingRuntime: its policy (numNodes, and jax for a keras: jax job) over one `node`
    replicated job."""
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": metadata,
        "spec": {
            "mlPolicy": policy,
            "template": {"spec": {
                "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                "failurePolicy": {
                    "maxRestarts": max_restarts,
                    "rules": [{"name": PERMANENT_RULE, "action": "FailJobSet",
                               "onJobFailureReasons": ["PodFailurePolicy"]}],
                },
                "replicatedJobs": [{
                    "name": NODE,
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}},
                        "spec": job_spec,
                    },
                }],
            }},
        },
    }  # fmt: skip


def _container(inventory: Inventory, image: str | None, checkpoints: str, *, secret: str | None,
               workdir: str, workers: list[str]) -> dict[str, Any]:  # fmt: skip
    launch = _launch(inventory, checkpoints, workdir, workers)
    jobset_name = {"name": pod_launcher.JOBSET_NAME_ENV, "valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}}}  # fmt: skip
    env = [*k8s.values(launch.env), jobset_name, *k8s.secret_refs(launch.secret_env, secret)]
    command = [k8s.IMAGE_PYTHON, *ISOLATED, "-c", LAUNCHER_SOURCE]  # spawn point: pod launcher
    if inventory.job.keras == KERAS_JAX:
        return k8s.container(NODE, image, command, launch, env=env, port_name=JAX_PORT_NAME,
                             working_dir=launch.cwd, port=JAX_PORT)  # fmt: skip
    return k8s.container(NODE, image, command, launch, env=env, port_name=PORT_NAME,
                         working_dir=launch.cwd)  # fmt: skip


def _launch(
    inventory: Inventory, checkpoints: str, workdir: str, workers: list[str]
) -> WorkerLaunch:
    """Every pod's worker (the first host's, as all are workers), its script in the image under
    `workdir`, the model export in the job's directory beside the checkpoints (on the claim with
    --pvc); with job.files, working where they are on the claim."""
    cwd = files_dir(inventory) if inventory.job.files else workdir
    place_env = {pod_launcher.WORKERS_ENV: json.dumps(workers)}
    if inventory.job.files:
        place_env["PYTHONPATH"] = cwd  # a task module or a script's import among the files
    jax = inventory.job.keras == KERAS_JAX
    if jax:
        place_env[pod_launcher.CLUSTER_ENV] = KERAS_JAX
    launch = k8s.pod_launch(inventory, 0, job_dir=posixpath.dirname(checkpoints),
                            checkpoints=checkpoints, cwd=cwd, script_dir=workdir,
                            place_env=place_env)  # fmt: skip
    if not jax:
        return launch
    # The hosts' addresses and the first host's place are no pod's: the launcher writes each
    # pod's from the Trainer's variables and the pod list.
    return replace(launch, env={k: v for k, v in launch.env.items() if k not in JAX_PLACE_ENV})


def dump(documents: Sequence[dict[str, Any]]) -> str:
    """The documents as YAML, the launcher's source (any text of several lines) as a block."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        block = "\n" in value and not any(line != line.rstrip() for line in value.splitlines())
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)

    Dumper.add_representer(str, text)
    return yaml.dump_all(documents, Dumper=Dumper, sort_keys=False, width=100)


__all__ = ["dump", "refusals", "trainjob", "worker_hosts"]
