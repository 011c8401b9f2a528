"""`export --format tfjob`: the manifest validates against the TFJob CRD's schema and the webhook
rules, invalid ones are refused with exit 2, and preemption's exit is retried by the operator."""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.backends.registry import load_inventory
from orchestrator.contract import EXIT_PREEMPTED, EXIT_USAGE
from orchestrator.export.tfjob import EXIT_WRAPPER, operator_retries, problems, schema, tfjob

REPO = Path(__file__).resolve().parents[2]
CRD = REPO.parent / "shared" / "specs" / "kubeflow.org_tfjobs.yaml"


def export(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", "export", *args], cwd=REPO,
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_the_bundled_schema_is_the_crds() -> None:
    if not CRD.exists():
        pytest.skip(f"{CRD} is not beside this checkout")
    crd = yaml.safe_load(CRD.read_text())
    assert schema() == crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_the_exported_tfjob_validates() -> None:
    result = export("inventory/local.yaml", "--format", "tfjob", "--image", "me/train:1",
                    "--namespace", "ml", "--pvc", "ckpt")  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert problems(manifest) == []
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2 and worker["restartPolicy"] == "ExitCode"
    container = worker["template"]["spec"]["containers"][0]
    assert container["name"] == "tensorflow" and container["image"] == "me/train:1"
    assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
    assert "--checkpoint-dir" in container["args"]
    assert worker["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "ckpt"
    }
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 3
    assert manifest["metadata"]["namespace"] == "ml"


@pytest.mark.parametrize(("args", "said"), [
    (["--format", "tfjob"], "image: required"),
    (["--format", "tfjob", "--image", "i", "--name", "Bad_Name"], "not a DNS-1035 label"),
    (["--format", "tfjob", "--image", "i", "--namespace", "No!"], "not a DNS-1123 label"),
])  # fmt: skip
def test_an_export_that_would_be_rejected_is_refused(args: list[str], said: str) -> None:
    result = export("inventory/local.yaml", *args)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_the_schema_and_the_webhook_rules_catch_what_they_should() -> None:
    good = tfjob(load_inventory(REPO / "inventory/local.yaml"), "img")
    assert problems(good) == []

    def broken(change: Any) -> list[str]:
        manifest = copy.deepcopy(good)
        change(manifest)
        return problems(manifest)

    worker = lambda m: m["spec"]["tfReplicaSpecs"]["Worker"]  # noqa: E731
    container = lambda m: worker(m)["template"]["spec"]["containers"][0]  # noqa: E731
    assert any("replicas" in p for p in broken(lambda m: worker(m).update(replicas="2")))
    assert any("no container named 'tensorflow'" in p
               for p in broken(lambda m: container(m).update(name="tf")))  # fmt: skip
    assert any("restartPolicy" in p for p in broken(lambda m: worker(m).update(
        restartPolicy="Sometimes")))  # fmt: skip
    assert any("at most one Chief" in p for p in broken(lambda m: m["spec"]["tfReplicaSpecs"]
               .update(Chief={**copy.deepcopy(worker(m)), "replicas": 2})))  # fmt: skip


def run_wrapper(child: list[str], env: dict[str, str], term_after: float | None = None) -> int:
    """The container's PID 1 as the manifest has it: sh -c WRAPPER orchestrate-worker ARGV."""
    process = subprocess.Popen(["/bin/sh", "-c", EXIT_WRAPPER, "orchestrate-worker", *child],
                               env=env)  # fmt: skip
    if term_after is not None:
        time.sleep(term_after)
        process.send_signal(signal.SIGTERM)  # what the kubelet sends a deleted pod
    return process.wait(timeout=30)


def test_preemption_is_retried_and_permanent_codes_are_not() -> None:
    manifest = tfjob(load_inventory(REPO / "inventory/local.yaml"), "img")
    env = {
        e["name"]: e["value"]
        for e in manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    env["PATH"] = "/usr/bin:/bin"
    policy = manifest["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"]
    # A worker that saves on SIGTERM and exits 75, as the built-in loop does.
    saver = [sys.executable, "-c", "import signal,sys,time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\ntime.sleep(30)"]  # fmt: skip
    preempted = run_wrapper(saver, env, term_after=1.0)
    assert preempted == 128 + EXIT_PREEMPTED and operator_retries(policy, preempted)
    peer_lost = run_wrapper(["sh", "-c", "exit 1"], env)
    assert operator_retries(policy, peer_lost)
    usage = run_wrapper(["sh", "-c", f"exit {EXIT_USAGE}"], env)
    assert usage == EXIT_USAGE and not operator_retries(policy, usage)
    assert run_wrapper(["true"], env) == 0
    # Without the wrapper ExitCode would have made 75 permanent: the reason it exists.
    assert not operator_retries("ExitCode", EXIT_PREEMPTED)
    assert operator_retries("OnFailure", EXIT_PREEMPTED)
