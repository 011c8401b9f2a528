"""`export --format trainjob`: the TrainingRuntime and TrainJob validate against the vendored
Trainer v2.3.0 CRD schemas and the CEL and webhook rules, what an API server would refuse is
refused with exit 2, and the embedded launcher gives each pod its TF_CONFIG."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.backends.registry import load_inventory
from orchestrator.export.trainjob import LAUNCHER_SOURCE, trainjob, worker_hosts
from orchestrator.export.trainjob_admission import SCHEMA_PATHS, problems, schema_source
from orchestrator.hostside import pod_launcher

REPO = Path(__file__).resolve().parents[2]


def export(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "export", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def rjob(documents: list[dict[str, Any]]) -> Any:
    """The runtime's `node` replicated job itself (tests edit it in place)."""
    return documents[0]["spec"]["template"]["spec"]["replicatedJobs"][0]


def node(documents: list[dict[str, Any]]) -> Any:
    return rjob(documents)["template"]["spec"]["template"]["spec"]["containers"][0]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


SCRIPT_INVENTORY = """\
hosts:
  - {name: a, address: 10.0.0.1, port: 2222, visible_gpus: [0, 1]}
  - {name: b, address: 10.0.0.2, port: 2222, visible_gpus: [0, 1]}
  - {name: c, address: 10.0.0.3, port: 2222, visible_gpus: [0, 1]}
job:
  name: resnet
  script: train.py
  args: ["--epochs", "3"]
  env: {WANDB_PROJECT: demo}
  secret_env: [WANDB_API_KEY]
  max_restarts: 5
  permanent_exit_codes: [3, 2]
"""


@pytest.fixture
def script_inventory(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "inv.yaml"
    path.write_text(SCRIPT_INVENTORY)
    return path


def test_the_vendored_schemas_are_trainer_v2_3_0s_without_descriptions() -> None:
    for kind, path in SCHEMA_PATHS.items():
        source = schema_source(kind)
        assert source["tag"] == "v2.3.0"
        assert source["commit"] == "658725bdae5c7e3a0854d93ac6ff492e109a22ab"
        assert source["path"].startswith("manifests/base/crds/trainer.kubeflow.org_")
        assert '"description"' not in path.read_text()


def test_the_exported_example_validates() -> None:
    result = export(
        "inventory/local.yaml",
        "--format",
        "trainjob",
        "--image",
        "me/train:1",
        "--namespace",
        "ml",
        "--pvc",
        "ckpt",
    )
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in documents] == ["TrainingRuntime", "TrainJob"]
    assert problems(documents) == []
    runtime, job = documents
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2}  # the plain policy
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 3
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "shapes",
    }
    assert runtime["metadata"]["namespace"] == job["metadata"]["namespace"] == "ml"
    assert rjob(documents)["template"]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"] == {
        "containerName": "node",
        "operator": "In",
        "values": [2],
    }
    container = node(documents)
    assert container["image"] == "me/train:1"
    assert container["command"] == ["python", "-I", "-c", LAUNCHER_SOURCE]  # isolated
    assert container["args"][:3] == ["python", "-m", "worker"]
    assert "/checkpoints/shapes/checkpoints" in container["args"]
    env = env_of(container)
    assert json.loads(env[pod_launcher.WORKERS_ENV]) == [
        "shapes-node-0-0.shapes:2222",
        "shapes-node-0-1.shapes:2222",
    ]
    assert "resources" not in container
    pod = rjob(documents)["template"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}
    ]
    assert "warning" not in result.stderr


def test_a_script_job_with_env_secrets_gpus_and_a_pvc_validates(script_inventory: Path) -> None:
    result = export(
        str(script_inventory),
        "--format",
        "trainjob",
        "--image",
        "me/resnet:2",
        "--pvc",
        "data",
        "--secret",
        "wandb",
        "--workdir",
        "/opt/app",
    )
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert problems(documents) == []
    container = node(documents)
    assert container["args"] == ["python", "/opt/app/train.py", "--epochs", "3"]
    assert container["workingDir"] == "/opt/app"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    env = env_of(container)
    assert env["WANDB_PROJECT"] == "demo"
    assert env["WANDB_API_KEY"] == {"secretKeyRef": {"name": "wandb", "key": "WANDB_API_KEY"}}
    assert len(json.loads(env[pod_launcher.WORKERS_ENV])) == 3
    assert documents[0]["spec"]["mlPolicy"]["numNodes"] == 3
    assert documents[0]["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 5
    codes = rjob(documents)["template"]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]
    assert codes["values"] == [2, 3]  # the API server wants them ordered


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d[0]["spec"]["mlPolicy"].update(numNodes="2"), "numNodes: '2' is not of type"),
        (lambda d: rjob(d).update(replicas="1"), "replicas: '1' is not of type 'integer'"),
        (lambda d: rjob(d)["template"]["spec"].update(backoffLimit=[0]), "backoffLimit"),
        (lambda d: node(d).update(args="python -m worker"), "args: 'python -m worker' is not"),
        (lambda d: d[1]["spec"].pop("runtimeRef"), "'runtimeRef' is a required property"),
        (lambda d: d[0]["spec"]["mlPolicy"].update(numNode=2), "unknown field 'numNode'"),
        (
            lambda d: d[0]["spec"]["template"]["spec"]["failurePolicy"]["rules"][0].update(
                action="Fail"
            ),
            "'Fail' is not one of",
        ),
    ],
)
def test_a_mistyped_field_fails_the_schema(change: Any, said: str) -> None:
    documents = trainjob(load_inventory(REPO / "inventory/local.yaml"), "img")
    assert problems(documents) == []
    change(documents)
    found = problems(documents)
    assert any(said in line for line in found), found


def _broken(change: Any, name: str | None = None) -> list[str]:
    documents = copy.deepcopy(
        trainjob(load_inventory(REPO / "inventory/local.yaml"), "img", name=name)
    )
    change(documents)
    return problems(documents)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        # The CRDs' CEL rules (x-kubernetes-validations).
        (lambda d: [x["metadata"].update(name="Shapes") for x in d], "RFC 1035 DNS label"),
        (lambda d: d[0]["spec"]["mlPolicy"].update(torch={}, jax={}), "Only one of the policy"),
        (lambda d: d[1]["spec"].update(managedBy="me"), "spec.managedBy: must be"),
        (
            lambda d: d[0]["spec"]["template"]["spec"].update(
                volumeClaimPolicies=[{"templates": [{"metadata": {"name": "x", "namespace": "n"}}]}]
            ),
            "namespace cannot be set",
        ),
        # The Trainer's webhooks.
        (lambda d: rjob(d).update(replicas=2), "replicas: always must be 1"),
        (lambda d: node(d).update(name="tensorflow"), "must contain the required container"),
        (lambda d: d[1]["spec"]["runtimeRef"].update(name="other"), "must be created before"),
        (lambda d: d[1]["spec"]["runtimeRef"].update(kind="Runtime"), "unsupported runtime"),
        # JobSet's webhook, on the JobSet the Trainer makes.
        (
            lambda d: d[0]["spec"]["template"]["spec"]["failurePolicy"]["rules"][0].update(
                name="permanent exit"
            ),
            "a rule name starts with a letter",
        ),
        (
            lambda d: d[0]["spec"]["template"]["spec"]["failurePolicy"]["rules"][0].update(
                onJobFailureReasons=["OOMKilled"]
            ),
            "is not a job failure reason",
        ),
        (
            lambda d: d[0]["spec"]["template"]["spec"]["failurePolicy"].update(
                restartStrategy="InPlaceRestart"
            ),
            "feature gate",
        ),
        # The Job validation the JobSet's Jobs meet.
        (
            lambda d: rjob(d)["template"]["spec"]["template"]["spec"].update(
                restartPolicy="OnFailure"
            ),
            "only 'Never' is supported",
        ),
        (
            lambda d: rjob(d)["template"]["spec"]["podFailurePolicy"]["rules"][0][
                "onExitCodes"
            ].update(values=[3, 0]),
            "0 is not allowed",
        ),
        (
            lambda d: rjob(d)["template"]["spec"]["podFailurePolicy"]["rules"][0][
                "onExitCodes"
            ].update(values=[3, 2]),
            "must be ordered",
        ),
        (
            lambda d: node(d)["env"].append({"name": "PYTHONUNBUFFERED", "value": "0"}),
            "two items with the same name",
        ),
        (
            lambda d: node(d)["env"].append(
                {"name": "K", "valueFrom": {"secretKeyRef": {"name": "", "key": "K"}}}
            ),
            "needs the name of a Secret",
        ),
        (lambda d: node(d).update(image=""), "image: required"),
        # Orchestrate's own: the launcher's list is the pods of this TrainJob.
        (lambda d: d[1]["metadata"].update(name="renamed"), "worker list"),
    ],
)
def test_the_rules_a_schema_validator_does_not_run(change: Any, said: str) -> None:
    found = _broken(change)
    assert any(said in line for line in found), found


def test_a_name_too_long_for_the_pods_is_refused() -> None:
    name = "a" * 50
    found = _broken(lambda d: None, name=name)
    assert any("pod names generated for this JobSet will exceed 63" in p for p in found), found
    assert _broken(lambda d: None, name="a" * 40) == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--format", "trainjob"], "--image IMAGE is required"),
        (["--format", "trainjob", "--image", "i", "--name", "Bad_Name"], "RFC 1035 DNS label"),
        (["--format", "trainjob", "--image", "i", "--namespace", "No!"], "not a DNS-1123 label"),
        (["--format", "trainjob", "--image", "i", "--name", "x" * 60], "exceed 63 characters"),
    ],
)
def test_an_export_that_would_be_rejected_is_refused(args: list[str], said: str) -> None:
    result = export("inventory/local.yaml", *args)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_what_a_trainjob_cannot_carry_is_refused(tmp_path: Path, script_inventory: Path) -> None:
    result = export(str(script_inventory), "--format", "trainjob", "--image", "i")
    assert result.returncode == 2 and "--secret NAME" in result.stderr, result.stderr
    with_files = tmp_path / "files.yaml"
    (tmp_path / "helpers.py").write_text("")
    with_files.write_text(SCRIPT_INVENTORY.replace("  max_restarts: 5", "  files: [helpers.py]"))
    result = export(str(with_files), "--format", "trainjob", "--image", "i", "--secret", "s")
    assert result.returncode == 2 and "give --pvc NAME" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    result = export(
        str(with_files), "--format", "trainjob", "--image", "i", "--secret", "s", "--pvc", "c"
    )
    assert result.returncode == 0, result.stderr
    assert "copy job.files to resnet/files/ on claim c" in result.stderr
    container = node(list(yaml.safe_load_all(result.stdout)))
    assert container["workingDir"] == "/checkpoints/resnet/files"
    broken = tmp_path / "broken.yaml"
    broken.write_text("job: {name: x}\n")
    result = export(str(broken), "--format", "trainjob", "--image", "i")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr


def test_the_launcher_gives_each_index_its_tf_config(tmp_path: Path) -> None:
    workers = worker_hosts("shapes", 2)
    assert pod_launcher.problem(workers, "1", "shapes") is None
    assert "must be Indexed" in str(pod_launcher.problem(workers, "", ""))
    assert "the export has 2 workers" in str(pod_launcher.problem(workers, "2", ""))
    assert "--name other" in str(pod_launcher.problem(workers, "0", "other"))
    show = "import json,os,sys; print(os.environ['TF_CONFIG']); sys.exit(int(sys.argv[1]))"
    env = {
        **os.environ,
        pod_launcher.WORKERS_ENV: json.dumps(workers),
        pod_launcher.INDEX_ENV: "1",
    }
    launched = [sys.executable, "-I", "-c", LAUNCHER_SOURCE, sys.executable, "-c", show]
    result = subprocess.run([*launched, "7"], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 7  # the worker's code, for the podFailurePolicy
    config = json.loads(result.stdout.splitlines()[-1])
    assert config == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 1}}
    env[pod_launcher.JOBSET_NAME_ENV] = "other"
    result = subprocess.run([*launched, "0"], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "exported for 'shapes'" in result.stderr


def test_a_keras_jax_trainjob_targets_the_trainers_jax_policy(tmp_path: Path) -> None:
    """The runtime declares mlPolicy.jax (whose plugin, in Trainer v2.3.0, writes
    JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID into a TrainJob's `node`
    container, pod 0 at port 29500, when the TrainJob has a trainer); the launcher checks them
    against the export's pods, adds Keras' variables and sets no TF_CONFIG; without them (a
    runtime without the policy) it exits 2 naming what is missing."""
    (tmp_path / "train.py").write_text("")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("defaults: {port: 2222}\nhosts:\n  - {name: a, address: 10.0.0.1}\n"
                         "  - {name: b, address: 10.0.0.2}\n"
                         "job: {name: fit, script: train.py, keras: jax}\n")  # fmt: skip
    runtime, train_job = trainjob(load_inventory(inventory), "img")
    assert problems([runtime, train_job]) == []
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2, "jax": {}}
    assert train_job["spec"]["trainer"] == {"numNodes": 2}
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    container = pod["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert not {"TF_CONFIG", "JAX_COORDINATOR_ADDRESS", "KERAS_DISTRIBUTION_PROCESS_ID"} & set(env)
    workers = json.loads(env[pod_launcher.WORKERS_ENV])
    assert workers == ["fit-node-0-0.fit:29500", "fit-node-0-1.fit:29500"]
    assert container["ports"] == [{"name": "jax-coordinator", "containerPort": 29500}]
    shown = ("TF_CONFIG", "KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_PROCESS_ID")
    show = f"import json, os; print(json.dumps([os.environ.get(k) for k in {shown!r}]))"
    launched = [sys.executable, "-I", "-c", LAUNCHER_SOURCE, sys.executable, "-c", show]
    pod_env = {**os.environ, **env, pod_launcher.INDEX_ENV: "1", "TF_CONFIG": "{}"}
    result = subprocess.run(launched, env=pod_env, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "JAX_COORDINATOR_ADDRESS=None" in result.stderr
    assert "mlPolicy.jax" in result.stderr
    trainer = {"JAX_COORDINATOR_ADDRESS": "fit-node-0-0.fit:29500", "JAX_NUM_PROCESSES": "2",
               "JAX_PROCESS_ID": "1"}  # what the jax plugin writes for TrainJob "fit"  # fmt: skip
    result = subprocess.run(launched, env={**pod_env, **trainer}, capture_output=True, text=True,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [None, ",".join(workers), "1"]
