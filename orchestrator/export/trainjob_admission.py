"""The checks an API server would make before accepting the TrainingRuntime and TrainJob of
trainjob.py (Trainer v2.3.0's CRDs and webhooks, JobSet's, and the Job validation the Trainer's
JobSet meets), apart from the manifests they check. Pure apart from reading the vendored
schemas.

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
import re
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from orchestrator.export.kubernetes import (
    DNS_1035,
    DNS_1123_LABEL,
    DNS_1123_SUBDOMAIN,
    namespace_problems,
    secret_ref_problems,
)
from orchestrator.export.trainjob import (
    ANCESTOR_LABEL,
    ANCESTOR_TRAINER,
    API_GROUP,
    API_VERSION,
    NODE,
    worker_hosts,
)
from orchestrator.hostside import pod_launcher

ANCESTOR_CONTAINERS = {"trainer": NODE, "model-initializer": "model-initializer",
                       "dataset-initializer": "dataset-initializer"}  # fmt: skip
MANAGED_BY = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes",
                       "MaxFailedIndexesExceeded", "PodFailurePolicy")  # fmt: skip
JOBSET_ACTIONS_BEHIND_GATES = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
POD_FAILURE_ACTIONS = ("FailJob", "FailIndex", "Ignore", "Count")
ML_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
STORAGE_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$")
HERE = Path(__file__).parent
SCHEMA_PATHS = {
    "TrainingRuntime": HERE / "trainer-trainingruntime-v1alpha1.schema.json",
    "TrainJob": HERE / "trainer-trainjob-v1alpha1.schema.json",
}


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
    return found + namespace_problems(metadata)


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
    found += secret_ref_problems(entry, where)
    ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
    if ref is not None and not SECRET_KEY.fullmatch(str(ref.get("key", ""))):
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
                    port = int(workers[0].rsplit(":", 1)[1]) if workers else 0  # a jax job's
                    pods = worker_hosts(jobset_name, len(workers), port)
                    if workers != pods or len(workers) != nodes:
                        return [f"TrainingRuntime {pod_launcher.WORKERS_ENV}: the worker list "
                                f"is not the {nodes} pods of TrainJob {jobset_name!r}"]  # fmt: skip
    return []
