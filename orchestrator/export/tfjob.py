"""A Kubeflow `kubeflow.org/v1` TFJob from an inventory, and the checks an API server and the
training operator's webhook would make. Pure apart from reading the bundled schema.

Replicas = the inventory's hosts by `role:` (Chief, PS, Worker, Evaluator; all Worker under
MultiWorkerMirroredStrategy and for slurm nodes); the operator injects TF_CONFIG itself (port
`tfjob-port` 2222). Restarts: the operator's ExitCode policy treats exit codes 1-127
as permanent and 128-255 as retryable, which would make the worker's preemption exit (75) and a
peer's "collective aborted" exit (1) permanent. So the container runs the worker under a small
shell wrapper that keeps the job's permanent exit codes as they are and reports every other
failure as 128+code (75 -> 203): under ExitCode the operator retries exactly what a restart can
heal, as the supervisor does on hosts. `runPolicy.backoffLimit` = job.max_restarts.

tfjob-v1.schema.json is spec.versions[v1].schema.openAPIV3Schema of the TFJob CRD of
kubeflow/training-operator release-1.9 (manifests/base/crds/kubeflow.org_tfjobs.yaml).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from orchestrator.contract import EXIT_PREEMPTED
from orchestrator.export import kubernetes as k8s
from orchestrator.model.inventory import (
    ROLE_CHIEF,
    ROLE_EVALUATOR,
    ROLE_PS,
    ROLE_WORKER,
    Inventory,
)
from orchestrator.model.launch import WorkerLaunch

API_VERSION = "kubeflow.org/v1"
CONTAINER = "tensorflow"  # the operator finds the TensorFlow container by this name
PORT_NAME = "tfjob-port"
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")  # the operator's, not the CRD's
REPLICA_TYPES = ("Chief", "Master", "PS", "Worker", "Evaluator")
# A host's `role:` -> its replica type (the operator writes TF_CONFIG with the same task types).
REPLICA_OF_ROLE = {ROLE_CHIEF: "Chief", ROLE_PS: "PS", ROLE_WORKER: "Worker",
                   ROLE_EVALUATOR: "Evaluator"}  # fmt: skip
SCHEMA_PATH = Path(__file__).with_name("tfjob-v1.schema.json")

# PID 1 of the container: forwards SIGTERM (pod deletion, preemption) to the worker so it saves,
# then maps the exit code for the operator's ExitCode rule (see the module docstring).
EXIT_WRAPPER = """\
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
wait "$child"; code=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; code=$?; done
case " $ORCHESTRATE_PERMANENT_EXIT_CODES " in *" $code "*) exit "$code";; esac
if [ "$code" -ge 1 ] && [ "$code" -le 127 ]; then exit $((128 + code)); fi
exit "$code"
"""


def operator_retries(policy: str, exit_code: int) -> bool:
    """Whether the training operator (release-1.9) restarts a replica whose container exited so."""
    if exit_code == 0:
        return False
    if policy == "ExitCode":
        return exit_code >= 128  # 1-127: permanent; 128-255: retryable
    return policy in ("OnFailure", "Always")


def tfjob(
    inventory: Inventory,
    image: str | None,
    *,
    name: str | None = None,
    namespace: str | None = None,
    pvc: str | None = None,
    restart_policy: str = "ExitCode",
    secret: str | None = None,
) -> dict[str, Any]:
    """`secret`: the Kubernetes Secret holding job.secret_env's values, one key per variable
    name; the manifest refers to it (secretKeyRef) and never carries a value."""
    job = inventory.job
    checkpoints = k8s.checkpoint_path(job, pvc)
    volume = k8s.checkpoint_volume(pvc)
    metadata = k8s.metadata(name or job.name, namespace)
    return {
        "apiVersion": API_VERSION,
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {
            "runPolicy": {"backoffLimit": job.max_restarts, "cleanPodPolicy": "Running"},
            "tfReplicaSpecs": {
                REPLICA_OF_ROLE[role]: {
                    "replicas": count,
                    "restartPolicy": restart_policy,
                    "template": {
                        "spec": {
                            "containers": [_container(inventory, image, checkpoints, secret, role)],
                            "volumes": [volume],
                        }
                    },
                }
                for role, count in _role_counts(inventory).items()
            },
        },
    }


def _role_counts(inventory: Inventory) -> dict[str, int]:
    """How many hosts of each role, in the TFJob's order (Chief, PS, Worker, Evaluator)."""
    counts = {role: sum(1 for h in inventory.hosts if h.role == role) for role in REPLICA_OF_ROLE}
    return {role: count for role, count in counts.items() if count}


def _container(
    inventory: Inventory,
    image: str | None,
    checkpoints: str,
    secret: str | None,
    role: str = ROLE_WORKER,
) -> dict[str, Any]:
    """The TensorFlow container: the worker under EXIT_WRAPPER, the checkpoint volume mounted."""
    launch = _launch(inventory, checkpoints, role)
    command = ["/bin/sh", "-c", EXIT_WRAPPER, "orchestrate-worker"]
    return k8s.container(CONTAINER, image, command, launch,
                         env=_container_env(launch, secret), port_name=PORT_NAME)  # fmt: skip


def _launch(inventory: Inventory, checkpoints: str, role: str) -> WorkerLaunch:
    """The first worker of `role`, as each replica of its type runs it: paths relative to the
    image's working directory (the container sets none)."""
    index = next(i for i, host in enumerate(inventory.hosts) if host.role == role)
    return k8s.pod_launch(inventory, index, job_dir="", checkpoints=checkpoints, cwd=".",
                          script_dir=".")  # fmt: skip


def _container_env(launch: WorkerLaunch, secret: str | None) -> list[dict[str, Any]]:
    """The worker's variables and the wrapper's by value; job.secret_env's from the Secret."""
    permanent = " ".join(str(code) for code in launch.permanent_exit_codes)
    env = {**launch.env, "ORCHESTRATE_PERMANENT_EXIT_CODES": permanent}
    return k8s.values(env) + k8s.secret_refs(launch.secret_env, secret)


@cache
def schema() -> dict[str, Any]:
    return dict(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


def problems(manifest: dict[str, Any]) -> list[str]:
    """Why an API server with the TFJob CRD and the operator's webhook would refuse it."""
    import jsonschema

    validator = jsonschema.Draft7Validator(schema())
    found = [
        f"{'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))
    ]
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != "TFJob":
        found.append(f"expected apiVersion {API_VERSION} and kind TFJob")
    metadata = manifest.get("metadata") or {}
    name = str(metadata.get("name", ""))
    if not k8s.DNS_1035.fullmatch(name) or len(name) > 63:
        found.append(f"metadata.name: {name!r} is not a DNS-1035 label (lower-case letters, "
                     "digits and '-', starting with a letter, at most 63 characters)")  # fmt: skip
    found += k8s.namespace_problems(metadata)
    replicas = (manifest.get("spec") or {}).get("tfReplicaSpecs") or {}
    found += _secret_ref_problems(replicas)
    if not replicas:
        found.append("spec.tfReplicaSpecs: at least one replica type is required")
    for kind, spec in replicas.items():
        where = f"spec.tfReplicaSpecs.{kind}"
        if kind not in REPLICA_TYPES:
            found.append(
                f"{where}: unknown replica type; expected one of {', '.join(REPLICA_TYPES)}"
            )
        if spec.get("restartPolicy", "Never") not in RESTART_POLICIES:
            found.append(f"{where}.restartPolicy: {spec.get('restartPolicy')!r} is not one of "
                         f"{', '.join(RESTART_POLICIES)}")  # fmt: skip
        if kind in ("Chief", "Master", "Evaluator") and spec.get("replicas", 1) > 1:
            found.append(f"{where}.replicas: at most one {kind}")
        containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
        if not any(c.get("name") == CONTAINER for c in containers):
            found.append(f"{where}: no container named '{CONTAINER}'")
        for index, container in enumerate(containers):
            if not container.get("image"):
                found.append(f"{where}.template.spec.containers[{index}].image: required")
    if "Chief" in replicas and "Master" in replicas:
        found.append("spec.tfReplicaSpecs: set Chief or Master, not both")
    return found


def _secret_ref_problems(replicas: dict[str, Any]) -> list[str]:
    found = []
    for kind, spec in replicas.items():
        containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
        for index, container in enumerate(containers):
            where = f"spec.tfReplicaSpecs.{kind}.template.spec.containers[{index}]"
            for entry in container.get("env") or []:
                found += k8s.secret_ref_problems(entry, where)
    return found


__all__ = ["EXIT_PREEMPTED", "operator_retries", "problems", "tfjob"]
