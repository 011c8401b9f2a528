"""A Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) with its own namespaced
TrainingRuntime, from an inventory, and the checks an API server would make before accepting
them. Pure apart from reading the vendored schemas and the launcher's source.

Trainer v2 has no TensorFlow runtime, so the runtime is a plain one (`mlPolicy` with only
`numNodes`, no framework policy) whose `node` replicated job runs the image under
hostside/pod_launcher.py: the launcher writes each pod's TF_CONFIG from the worker list computed
here (JobSet's pod host names `{name}-node-0-{i}.{name}:2222`) and the pod's JOB_COMPLETION_INDEX.

Semantics, as close to the TFJob export as Trainer v2 (JobSet over Indexed Jobs) allows:
- restarts: the Job has backoffLimit 0, so any failed pod fails its Job and JobSet recreates the
  whole set (every worker, as one MultiWorkerMirroredStrategy cluster must), at most
  `failurePolicy.maxRestarts` = job.max_restarts times; a preemption (exit 75) spends one;
- permanent exit codes: a podFailurePolicy FailJob rule on the `node` container's codes, and a
  JobSet rule that fails the set (FailJobSet) when a Job failed by that policy: no restart;
- GPU limits (Inventory.gpus_per_worker), the checkpoint PVC at /checkpoints/{job}, job.env,
  job.secret_env as secretKeyRef to --secret (never a value), the job's args.

The vendored schemas are spec.versions[v1alpha1].schema.openAPIV3Schema of the CRDs of
kubeflow/trainer v2.3.0 (commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab), descriptions stripped;
each file's "source" header says so. `problems` also runs what a schema validator does not: the
CRDs' CEL rules (x-kubernetes-validations) on create, the Trainer webhooks
(pkg/webhooks/trainingruntime_webhook.go, pkg/runtime/core/trainingruntime.go), the JobSet
webhook (sigs.k8s.io/jobset v0.12.0 pkg/webhooks/jobset_webhook.go, the JobSet the Trainer makes
from these) and the Job validation of podFailurePolicy the API server applies to its Jobs.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from orchestrator.contract import ISOLATED
from orchestrator.engine.launch import in_image, worker_launch
from orchestrator.hostside import pod_launcher
from orchestrator.hostside.bundle import shipped_program
from orchestrator.model.inventory import Inventory, Job
from orchestrator.model.launch import Placement, WorkerLaunch

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
NODE = "node"  # the trainer's replicated job and container (constants.Node)
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
ANCESTOR_CONTAINERS = {"trainer": NODE, "model-initializer": "model-initializer",
                       "dataset-initializer": "dataset-initializer"}  # fmt: skip
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
PORT = 2222
PORT_NAME = "tf-worker"
CHECKPOINT_MOUNT = "/checkpoints"
DEFAULT_WORKDIR = "/workspace"
PERMANENT_RULE = "permanent_exit_code"
MANAGED_BY = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                       "MaxFailedIndexesExceeded", "PodFailurePolicy")  # fmt: skip
JOBSET_ACTIONS_BEHIND_GATES = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
POD_FAILURE_ACTIONS = ("FailJob", "FailIndex", "Ignore", "Count")
ML_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
STORAGE_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
HERE = Path(__file__).parent
SCHEMA_PATHS = {
    "TrainingRuntime": HERE / "trainer-trainingruntime-v1alpha1.schema.json",
    "TrainJob": HERE / "trainer-trainjob-v1alpha1.schema.json",
}
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
    leaf = posixpath.basename(job.checkpoint_dir.rstrip("/"))
    checkpoints = posixpath.join(CHECKPOINT_MOUNT, *([job.name] if pvc else []), leaf)
    volume: dict[str, Any] = (
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": pvc}}
        if pvc
        else {"name": "checkpoints", "emptyDir": {}}
    )
    workers = worker_hosts(name, len(inventory.hosts))
    container = _container(inventory, image, checkpoints, secret=secret, workdir=workdir,
                           workers=workers)  # fmt: skip
    job_spec = _job_spec(job, container, volume)
    labels = {"app": "orchestrate", "trainer.kubeflow.org/framework": "tensorflow"}
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    runtime = _runtime(metadata, len(inventory.hosts), job.max_restarts, job_spec)
    train_job = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": dict(metadata, labels={"app": "orchestrate"}),
        "spec": {"runtimeRef": {"apiGroup": API_GROUP, "kind": "TrainingRuntime", "name": name}},
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
    metadata: dict[str, Any], nodes: int, max_restarts: int, job_spec: dict[str, Any]
) -> dict[str, Any]:
    """The TrainingRuntime: the plain policy (numNodes only) over one `node` replicated job."""
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": metadata,
        "spec": {
            "mlPolicy": {"numNodes": nodes},
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
    container: dict[str, Any] = {
        "name": NODE,
        "image": image or "",
        "command": ["python", *ISOLATED, "-c", LAUNCHER_SOURCE],  # spawn point: the pod's launcher
        "args": list(launch.argv),
        "workingDir": launch.cwd,
        "env": [{"name": key, "value": value} for key, value in launch.env.items()]
        + [{"name": pod_launcher.JOBSET_NAME_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{JOBSET_NAME_LABEL}']"}}}]
        + [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret or "", "key": key}}}
           for key in launch.secret_env],
        "ports": [{"name": PORT_NAME, "containerPort": PORT}],
        "volumeMounts": [{"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}],
    }  # fmt: skip
    if launch.gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": launch.gpus}}
    return container


def _launch(
    inventory: Inventory, checkpoints: str, workdir: str, workers: list[str]
) -> WorkerLaunch:
    """Every pod's worker (the first host's, as all are workers): the image's python, the pod's
    own GPUs (numbered from 0), the script in the image under `workdir`, the model export in
    the job's directory beside the checkpoints (on the claim with --pvc)."""
    cwd = files_dir(inventory) if inventory.job.files else workdir
    place_env = {pod_launcher.WORKERS_ENV: json.dumps(workers)}
    if inventory.job.files:
        place_env["PYTHONPATH"] = cwd  # a task module or a script's import among the files
    place = Placement(python="python", job_dir=posixpath.dirname(checkpoints),
                      checkpoint_dir=checkpoints, cwd=cwd,
                      script=in_image(inventory.job.script, workdir), place_env=place_env,
                      host_gpus=False, booted=False)  # fmt: skip
    return worker_launch(inventory, 0, place)


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


@cache
def schema(kind: str) -> dict[str, Any]:
    document = json.loads(SCHEMA_PATHS[kind].read_text(encoding="utf-8"))
    return dict(document["openAPIV3Schema"])


@cache
def schema_source(kind: str) -> dict[str, str]:
    return dict(json.loads(SCHEMA_PATHS[kind].read_text(encoding="utf-8"))["source"])


def problems(documents: Sequence[dict[str, Any]]) -> list[str]:
    """Why an API server with the Trainer v2.3.0 CRDs and webhooks (and JobSet's, and the Job
    validation the Trainer's JobSet meets) would refuse [runtime, trainjob], or fail them."""
    kinds = [d.get("kind") for d in documents]
    if kinds != ["TrainingRuntime", "TrainJob"]:
        return [f"expected a TrainingRuntime and a TrainJob, got {kinds}"]
    runtime, train_job = documents
    found = []
    for document in documents:
        kind = document["kind"]
        found += [f"{kind} {error}" for error in _schema_errors(document, schema(kind))]
        found += [f"{kind} {error}" for error in _list_type_errors(document, schema(kind), "")]
        if document.get("apiVersion") != API_VERSION:
            found.append(f"{kind}: apiVersion must be {API_VERSION}")
    if found:  # the rules below read the documents as typed by the schemas
        return found
    for document in documents:
        metadata = document.get("metadata") or {}
        found += [f"{document['kind']} {error}" for error in _metadata_errors(metadata)]
    found += [f"TrainJob {error}" for error in _trainjob_rules(train_job, runtime)]
    found += [f"TrainingRuntime {error}" for error in _runtime_rules(runtime)]
    name = str((train_job.get("metadata") or {}).get("name", ""))
    found += [f"TrainingRuntime {error}" for error in _jobset_rules(runtime, name)]
    found += [f"TrainingRuntime {error}" for error in _job_rules(runtime)]
    found += _launcher_rules(runtime, name)
    return found


def _schema_errors(document: dict[str, Any], crd_schema: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(crd_schema)
    return [
        f"{'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    ]


def _list_type_errors(value: Any, node: dict[str, Any], where: str) -> Iterator[str]:
    """x-kubernetes-list-type set and map: the API server refuses duplicate items or keys. And
    fields the schema does not know, which kubectl's strict field validation refuses (the API
    server would otherwise drop them: a misspelt key would silently do nothing)."""
    if isinstance(value, dict) and isinstance(node.get("properties"), dict):
        for key, item in value.items():
            if key in node["properties"]:
                yield from _list_type_errors(item, node["properties"][key], f"{where}.{key}")
            elif not node.get("x-kubernetes-preserve-unknown-fields"):
                yield f"{where.lstrip('.')}: unknown field {key!r}"
    elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        for key, item in value.items():
            yield from _list_type_errors(item, node["additionalProperties"], f"{where}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        items = node["items"]
        list_type = node.get("x-kubernetes-list-type")
        if list_type == "set":
            seen = [json.dumps(item, sort_keys=True) for item in value]
            if len(set(seen)) != len(seen):
                yield f"{where.lstrip('.')}: duplicate items in a set"
        elif list_type == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            defaults = {k: (items.get("properties") or {}).get(k, {}).get("default") for k in keys}
            keyed: list[tuple[str, ...]] = [
                tuple(json.dumps(item.get(k, defaults[k])) for k in keys)
                for item in value
                if isinstance(item, dict)
            ]
            for duplicate in sorted({k for k in keyed if keyed.count(k) > 1}):
                yield (f"{where.lstrip('.')}: two items with the same "
                       f"{', '.join(keys)} {', '.join(duplicate)}")  # fmt: skip
        for index, item in enumerate(value):
            yield from _list_type_errors(item, items, f"{where}[{index}]")


def _metadata_errors(metadata: dict[str, Any]) -> list[str]:
    found = []
    name = str(metadata.get("name", ""))
    if not DNS_1123_SUBDOMAIN.fullmatch(name) or len(name) > 253:
        found.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain")
    namespace = metadata.get("namespace")
    if namespace is not None and (
        not DNS_1123_LABEL.fullmatch(str(namespace)) or len(namespace) > 63
    ):
        found.append(f"metadata.namespace: {namespace!r} is not a DNS-1123 label")
    return found


def _trainjob_rules(train_job: dict[str, Any], runtime: dict[str, Any]) -> list[str]:
    """The TrainJob CRD's CEL rules on create, and its webhook's: the runtime it refers to."""
    found = []
    name = str((train_job.get("metadata") or {}).get("name", ""))
    if not DNS_1035.fullmatch(name):
        found.append(f"metadata.name: {name!r} must match RFC 1035 DNS label format "
                     "(lower-case letters, digits and '-', starting with a letter)")  # fmt: skip
    if len(name) > 63:
        found.append(f"metadata.name: {name!r} must be no more than 63 characters")
    spec = train_job.get("spec") or {}
    if "managedBy" in spec and spec["managedBy"] not in MANAGED_BY:
        found.append(f"spec.managedBy: must be {' or '.join(MANAGED_BY)} if set")
    for source in ("dataset", "model"):
        uri = ((spec.get("initializer") or {}).get(source) or {}).get("storageUri")
        if uri and not STORAGE_URI.fullmatch(str(uri)):
            found.append(f"spec.initializer.{source}.storageUri: must be a URI (scheme://...)")
    ref = spec.get("runtimeRef") or {}
    group, kind = ref.get("apiGroup", API_GROUP), ref.get("kind", "ClusterTrainingRuntime")
    if group != API_GROUP or kind not in ("TrainingRuntime", "ClusterTrainingRuntime"):
        found.append(f"spec.runtimeRef: unsupported runtime: {kind}.{group}")
    runtime_meta, job_meta = runtime.get("metadata") or {}, train_job.get("metadata") or {}
    if kind != "TrainingRuntime" or ref.get("name") != runtime_meta.get("name") or \
            runtime_meta.get("namespace") != job_meta.get("namespace"):  # fmt: skip
        found.append("spec.runtimeRef: must name the TrainingRuntime beside it (its name, kind "
                     "TrainingRuntime, the same namespace): specified trainingRuntime must be "
                     "created before the TrainJob is created")  # fmt: skip
    return found


def _replicated_jobs(runtime: dict[str, Any]) -> list[dict[str, Any]]:
    jobs = ((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}
    return list(jobs.get("replicatedJobs") or [])


def _pod_spec(replicated_job: dict[str, Any]) -> dict[str, Any]:
    job_template = (replicated_job.get("template") or {}).get("spec") or {}
    return dict((job_template.get("template") or {}).get("spec") or {})


def _runtime_rules(runtime: dict[str, Any]) -> list[str]:
    """The TrainingRuntime CRD's CEL rules on create and its validating webhook's rules."""
    found = []
    spec = runtime.get("spec") or {}
    policy = spec.get("mlPolicy") or {}
    if sum(key in policy for key in ML_POLICIES) > 1:
        found.append("spec.mlPolicy: Only one of the policy can be configured")
    if "numProcPerNode" in (policy.get("flux") or {}) and policy["flux"]["numProcPerNode"] < 1:
        found.append("spec.mlPolicy.flux.numProcPerNode: NumProcPerNode in fluxPolicy must be >= 1")
    if policy.get("numNodes", 1) < 1:
        found.append("spec.mlPolicy.numNodes: at least 1 node")
    jobset = (spec.get("template") or {}).get("spec") or {}
    rjobs = _replicated_jobs(runtime)
    if (jobset.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder" and any(
        "dependsOn" in rjob for rjob in rjobs
    ):
        found.append("spec.template.spec: StartupPolicy and DependsOn APIs are mutually exclusive")
    for policy_index, claims in enumerate(jobset.get("volumeClaimPolicies") or []):
        if any((t.get("metadata") or {}).get("namespace") for t in claims.get("templates") or []):
            found.append(f"spec.template.spec.volumeClaimPolicies[{policy_index}]: namespace "
                         "cannot be set for VolumeClaimPolicies templates")  # fmt: skip
    ancestors = []
    for index, rjob in enumerate(rjobs):
        where = f"spec.template.spec.replicatedJobs[{index}]"
        labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
        ancestor = labels.get(ANCESTOR_LABEL)
        if ancestor not in ANCESTOR_CONTAINERS:
            continue
        ancestors.append(ancestor)
        if rjob.get("replicas", 1) != 1:
            found.append(f"{where}.replicas: always must be 1")
        names = [c.get("name") for c in _pod_spec(rjob).get("containers") or []]
        if ANCESTOR_CONTAINERS[ancestor] not in names:
            found.append(f"{where}.template.spec.template.spec.containers: must contain the "
                         f"required container for the ancestor: {ancestor}")  # fmt: skip
    if ANCESTOR_TRAINER not in ancestors:
        found.append(f"spec.template.spec.replicatedJobs: none is labelled {ANCESTOR_LABEL}: "
                     f"{ANCESTOR_TRAINER}, so the Trainer has no nodes to run")  # fmt: skip
    return found


def _jobset_rules(runtime: dict[str, Any], jobset_name: str) -> list[str]:
    """JobSet's webhook on the JobSet the Trainer makes from the runtime (named after the
    TrainJob, the trainer job's parallelism = mlPolicy.numNodes; feature gates at defaults)."""
    found = []
    spec = runtime.get("spec") or {}
    jobset = (spec.get("template") or {}).get("spec") or {}
    rjobs = _replicated_jobs(runtime)
    where = "spec.template.spec"
    if rjobs and "dependsOn" in rjobs[0]:
        found.append(f"{where}.replicatedJobs[0]: DependsOn can't be set for the first one")
    subdomain = (jobset.get("network") or {}).get("subdomain")
    if subdomain and (not DNS_1035.fullmatch(subdomain) or len(subdomain) > 63):
        found.append(f"{where}.network.subdomain: {subdomain!r} is not a DNS-1035 label")
    nodes = (spec.get("mlPolicy") or {}).get("numNodes", 1)
    names = [str(rjob.get("name", "")) for rjob in rjobs]
    for index, rjob in enumerate(rjobs):
        replicas = rjob.get("replicas", 1)
        job_name = f"{jobset_name}-{rjob.get('name')}-{replicas - 1}"
        if not DNS_1035.fullmatch(job_name) or len(job_name) > 63:
            found.append(f"{where}.replicatedJobs[{index}].name: {job_name!r}: JobSet name is "
                         "too long, job names generated for this JobSet will exceed 63 "
                         "characters (or are not a DNS-1035 label)")  # fmt: skip
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        if job_spec.get("completionMode", "Indexed") == "Indexed":
            is_trainer = ((rjob.get("template") or {}).get("metadata") or {}).get(
                "labels", {}).get(ANCESTOR_LABEL) == ANCESTOR_TRAINER  # fmt: skip
            completions = nodes if is_trainer else job_spec.get("completions", 1)
            pod = f"{job_name}-{completions - 1}-abcde"
            if len(pod) > 63:
                found.append(f"{where}.replicatedJobs[{index}].name: JobSet name is too long, "
                             f"pod names generated for this JobSet will exceed 63 characters "
                             f"({pod!r}): give a shorter --name")  # fmt: skip
        for dependency in rjob.get("dependsOn") or []:
            if dependency.get("name") not in names[:index]:
                found.append(f"{where}.replicatedJobs[{index}].dependsOn: "
                             f"{dependency.get('name')!r} is not an earlier one")  # fmt: skip
    for target in (jobset.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in names:
            found.append(f"{where}.successPolicy: no replicated job {target!r}")
    found += _failure_policy_rules(jobset.get("failurePolicy"), names)
    return found


def _failure_policy_rules(policy: dict[str, Any] | None, names: list[str]) -> list[str]:
    if not policy:
        return []
    where = "spec.template.spec.failurePolicy"
    found = []
    if policy.get("restartStrategy") == "InPlaceRestart":
        found.append(f"{where}.restartStrategy: InPlaceRestart needs JobSet's InPlaceRestart "
                     "feature gate (off by default)")  # fmt: skip
    if policy.get("maxRestarts", 0) < 0:
        found.append(f"{where}.maxRestarts: must not be negative")
    rule_names = []
    for index, rule in enumerate(policy.get("rules") or []):
        rule_name = str(rule.get("name", ""))
        rule_names.append(rule_name)
        if not 1 <= len(rule_name) <= 128 or not RULE_NAME.fullmatch(rule_name):
            found.append(f"{where}.rules[{index}].name: {rule_name!r}: a rule name starts with a "
                         "letter, then letters, digits or '_,:', ends with a letter, digit or "
                         "'_', at most 128 characters")  # fmt: skip
        if rule.get("action") in JOBSET_ACTIONS_BEHIND_GATES:
            found.append(f"{where}.rules[{index}].action: {rule['action']} needs JobSet's "
                         "RestartJob feature gate (off by default)")  # fmt: skip
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in JOB_FAILURE_REASONS:
                found.append(f"{where}.rules[{index}].onJobFailureReasons: {reason!r} is not a "
                             f"job failure reason ({', '.join(JOB_FAILURE_REASONS)})")  # fmt: skip
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                found.append(f"{where}.rules[{index}].targetReplicatedJobs: no {target!r}")
        for pattern in rule.get("onJobFailureMessagePatterns") or []:
            try:
                re.compile(pattern)
            except re.error as exc:
                found.append(f"{where}.rules[{index}].onJobFailureMessagePatterns: {exc}")
    for duplicate in sorted({n for n in rule_names if rule_names.count(n) > 1}):
        found.append(f"{where}.rules: rule names are not unique: {duplicate!r}")
    return found


def _job_rules(runtime: dict[str, Any]) -> list[str]:
    """The API server's validation of the Jobs JobSet creates (batch/v1) and of their pods."""
    found = []
    for index, rjob in enumerate(_replicated_jobs(runtime)):
        where = f"spec.template.spec.replicatedJobs[{index}].template.spec"
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        pod = _pod_spec(rjob)
        containers = pod.get("containers") or []
        names = [str(c.get("name", "")) for c in containers]
        found += _pod_failure_policy_rules(job_spec, pod, names, where)
        volumes = [str(v.get("name", "")) for v in pod.get("volumes") or []]
        for position, container in enumerate(containers):
            at = f"{where}.template.spec.containers[{position}]"
            if not DNS_1123_LABEL.fullmatch(names[position]) or len(names[position]) > 63:
                found.append(f"{at}.name: {names[position]!r} is not a DNS-1123 label")
            if not container.get("image"):
                found.append(f"{at}.image: required")
            for entry in container.get("env") or []:
                found += _env_problems(entry, at)
            for mount in container.get("volumeMounts") or []:
                if mount.get("name") not in volumes:
                    found.append(f"{at}.volumeMounts: no volume named {mount.get('name')!r}")
        if len(set(names)) != len(names):
            found.append(f"{where}.template.spec.containers: names must be unique")
    return found


def _pod_failure_policy_rules(job_spec: dict[str, Any], pod: dict[str, Any], names: list[str],
                              where: str) -> list[str]:  # fmt: skip
    rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
    if not rules:
        return []
    found = []
    if pod.get("restartPolicy") != "Never":
        found.append(f"{where}.template.spec.restartPolicy: only 'Never' is supported when "
                     "podFailurePolicy is specified")  # fmt: skip
    for index, rule in enumerate(rules):
        at = f"{where}.podFailurePolicy.rules[{index}]"
        if rule.get("action") not in POD_FAILURE_ACTIONS:
            found.append(f"{at}.action: {rule.get('action')!r} is not one of "
                         f"{', '.join(POD_FAILURE_ACTIONS)}")  # fmt: skip
        if rule.get("action") == "FailIndex" and "backoffLimitPerIndex" not in job_spec:
            found.append(f"{at}.action: FailIndex needs backoffLimitPerIndex")
        codes = rule.get("onExitCodes")
        if ("onExitCodes" in rule) == ("onPodConditions" in rule):
            found.append(f"{at}: exactly one of onExitCodes and onPodConditions")
        if not codes:
            continue
        if "containerName" in codes and codes["containerName"] not in names:
            found.append(f"{at}.onExitCodes.containerName: no container "
                         f"{codes['containerName']!r}")  # fmt: skip
        values = list(codes.get("values") or [])
        if codes.get("operator") not in ("In", "NotIn"):
            found.append(f"{at}.onExitCodes.operator: must be In or NotIn")
        if not values or len(values) > 255:
            found.append(f"{at}.onExitCodes.values: between 1 and 255 exit codes")
        if codes.get("operator") == "In" and 0 in values:
            found.append(f"{at}.onExitCodes.values: 0 is not allowed with the In operator")
        if values != sorted(set(values)):
            found.append(f"{at}.onExitCodes.values: must be ordered and unique")
    return found


def _env_problems(entry: dict[str, Any], where: str) -> list[str]:
    found = []
    name = str(entry.get("name", ""))
    if not ENV_NAME.fullmatch(name):
        found.append(f"{where}.env.{name}: not a valid environment variable name")
    ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
    if ref is not None:
        if not DNS_1123_SUBDOMAIN.fullmatch(str(ref.get("name", ""))):
            found.append(f"{where}.env.{name}: the secretKeyRef needs the name of a Secret "
                         f"(a DNS-1123 subdomain), not {ref.get('name')!r}")  # fmt: skip
        if not SECRET_KEY.fullmatch(str(ref.get("key", ""))):
            found.append(f"{where}.env.{name}: secretKeyRef key {ref.get('key')!r} is not valid")
    return found


def _launcher_rules(runtime: dict[str, Any], jobset_name: str) -> list[str]:
    """Orchestrate's own: the launcher's worker list is the JobSet's pods, one per node."""
    nodes = ((runtime.get("spec") or {}).get("mlPolicy") or {}).get("numNodes")
    for rjob in _replicated_jobs(runtime):
        for container in _pod_spec(rjob).get("containers") or []:
            for entry in container.get("env") or []:
                if entry.get("name") == pod_launcher.WORKERS_ENV:
                    workers = json.loads(entry.get("value") or "[]")
                    if workers != worker_hosts(jobset_name, len(workers)) or len(workers) != nodes:
                        return [f"TrainingRuntime {pod_launcher.WORKERS_ENV}: the worker list "
                                f"is not the {nodes} pods of TrainJob {jobset_name!r}"]  # fmt: skip
    return []


__all__ = ["dump", "problems", "refusals", "trainjob", "worker_hosts"]
