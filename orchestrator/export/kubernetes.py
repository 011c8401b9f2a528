"""What the TFJob and TrainJob exports share of Kubernetes: names, labels, the checkpoint volume
and its mount, the worker's port, its container with its environment (values, and secrets as
references), the pod's placement of the one worker definition, and the API server's rules on
names and Secret references. Pure.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.engine.workers.launch import worker_launch
from orchestrator.model.inventory import Inventory, Job
from orchestrator.model.launch import Placement, WorkerLaunch

APP_LABELS = {"app": "orchestrate"}
CHECKPOINT_VOLUME = "checkpoints"
CHECKPOINT_MOUNT = "/checkpoints"
PORT = 2222  # every worker's TensorFlow port in its pod (the TFJob operator's default too)
GPU_RESOURCE = "nvidia.com/gpu"
IMAGE_PYTHON = "python"  # the image's interpreter, as the container runs the worker
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def metadata(
    name: str, namespace: str | None, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A document's metadata: its name, orchestrate's label (and `labels`), its namespace."""
    document: dict[str, Any] = {"name": name, "labels": {**APP_LABELS, **(labels or {})}}
    if namespace:
        document["namespace"] = namespace
    return document


def checkpoint_path(job: Job, pvc: str | None) -> str:
    """Where the pods keep the checkpoints: the mount, then (on a claim that may hold several
    jobs) the job's own directory, then the checkpoint directory's last part."""
    leaf = posixpath.basename(job.checkpoint_dir.rstrip("/"))
    return posixpath.join(CHECKPOINT_MOUNT, *([job.name] if pvc else []), leaf)


def checkpoint_volume(pvc: str | None) -> dict[str, Any]:
    """The claim `pvc`, or without it a directory that lives as long as the pod."""
    if pvc:
        return {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": pvc}}
    return {"name": CHECKPOINT_VOLUME, "emptyDir": {}}


def pod_launch(
    inventory: Inventory, index: int, *, job_dir: str, checkpoints: str, cwd: str,
    script_dir: str, place_env: Mapping[str, str] | None = None,
) -> WorkerLaunch:  # fmt: skip
    """The worker of the host at `index` in a pod: the image's python, the script (if any) in
    the image under `script_dir`, the pod's own GPUs (the scheduler numbers them from 0), no
    run directory (so no boot writing stacks into one)."""
    script = inventory.job.script
    place = Placement(
        python=IMAGE_PYTHON, job_dir=job_dir, checkpoint_dir=checkpoints, cwd=cwd,
        script=posixpath.join(script_dir, posixpath.basename(script)) if script else None,
        place_env=dict(place_env or {}), host_gpus=False, booted=False,
    )  # fmt: skip
    return worker_launch(inventory, index, place)


def values(env: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"name": key, "value": value} for key, value in env.items()]


def secret_refs(names: Iterable[str], secret: str | None) -> list[dict[str, Any]]:
    """job.secret_env as references to the Secret `secret`, one key per variable name: a
    manifest never carries a value."""
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret or "", "key": key}}}
            for key in names]  # fmt: skip


def container(
    name: str, image: str | None, command: list[str], launch: WorkerLaunch, *,
    env: list[dict[str, Any]], port_name: str, working_dir: str | None = None, port: int = PORT,
) -> dict[str, Any]:  # fmt: skip
    """The worker's container: its command line as args to `command`, `env`, its port (the
    TensorFlow port unless said), the checkpoint volume mounted, and the GPUs the launch asks
    for."""
    built: dict[str, Any] = {"name": name, "image": image or "", "command": command,
                             "args": list(launch.argv)}  # fmt: skip
    if working_dir is not None:
        built["workingDir"] = working_dir
    built["env"] = env
    built["ports"] = [{"name": port_name, "containerPort": port}]
    built["volumeMounts"] = [{"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT}]
    if launch.gpus:
        built["resources"] = {"limits": {GPU_RESOURCE: launch.gpus}}
    return built


def namespace_problems(document_metadata: Mapping[str, Any]) -> list[str]:
    namespace = document_metadata.get("namespace")
    if namespace is None:
        return []
    if DNS_1123_LABEL.fullmatch(str(namespace)) and len(str(namespace)) <= 63:
        return []
    return [f"metadata.namespace: {namespace!r} is not a DNS-1123 label"]


def secret_ref_problems(entry: Mapping[str, Any], where: str) -> list[str]:
    """An env entry's secretKeyRef names no Secret (`where`: the container's path)."""
    ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
    if ref is None or DNS_1123_SUBDOMAIN.fullmatch(str(ref.get("name", ""))):
        return []
    return [f"{where}.env.{entry.get('name')}: the secretKeyRef needs the name of a Secret "
            f"(a DNS-1123 subdomain), not {ref.get('name')!r}"]  # fmt: skip
