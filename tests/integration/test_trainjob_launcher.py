"""The exported TrainJob's launcher, run as the two pods would run it (the container's command
and args, JOB_COMPLETION_INDEX 0 and 1) with JobSet's host names swapped for 127.0.0.1 ports,
gives the workers TF_CONFIGs with which a real two-worker MultiWorkerMirroredStrategy job trains.
One short run (about 20 s on two CPU cores). The pods' PYTHONPATH holds modules named like the
standard library's and the shipped ones (tests/planted.py): the launcher imports none (issue 40).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.contract import CHECKPOINT_DIR_ENV
from orchestrator.export.trainjob import trainjob
from orchestrator.export.trainjob_admission import problems
from orchestrator.hostside import pod_launcher
from tests.conftest import free_ports, worker_env
from tests.jaxonly import jax_only_python
from tests.planted import all_imports, host_program_imports, plant

pytestmark = pytest.mark.tf

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180


def test_two_pods_launched_from_the_runtime_train_together(tmp_path: Path) -> None:
    inventory_file = tmp_path / "inv.yaml"
    inventory_file.write_text(
        "hosts:\n"
        "  - {name: a, address: 10.0.0.1, port: 2222}\n"
        "  - {name: b, address: 10.0.0.2, port: 2222}\n"
        "job: {name: shapes, task: 'worker.examples.shapes:task', steps: 20,\n"
        "      checkpoint_every: 10, log_every: 10}\n"
    )
    documents = trainjob(load_inventory(inventory_file), "img", pvc="ckpt")
    assert problems(documents) == []
    replicated = documents[0]["spec"]["template"]["spec"]["replicatedJobs"][0]
    container = replicated["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    exported = json.loads(env[pod_launcher.WORKERS_ENV])
    assert exported == ["shapes-node-0-0.shapes:2222", "shapes-node-0-1.shapes:2222"]

    # The pods' /checkpoints mount becomes a temporary directory, their python this one.
    checkpoints = tmp_path / "checkpoints"
    args = [
        a.replace("/checkpoints/shapes/checkpoints", str(checkpoints)) for a in container["args"]
    ]
    assert args[0] == "python" and str(checkpoints) in args
    command = [sys.executable, *container["command"][1:], sys.executable, *args[1:]]
    local = [f"127.0.0.1:{port}" for port in free_ports(2)]
    marker = tmp_path / "planted-imports.txt"
    plant(tmp_path / "image-libs", marker)  # a directory on the image's PYTHONPATH
    processes = []
    for index in range(2):
        run_dir = tmp_path / f"pod{index}"
        run_dir.mkdir()
        pod_env = worker_env(run_dir, None, **{**env, CHECKPOINT_DIR_ENV: str(checkpoints)})
        pod_env[pod_launcher.WORKERS_ENV] = json.dumps(local)
        pod_env[pod_launcher.INDEX_ENV] = str(index)  # what the Indexed Job gives each pod
        pod_env["PYTHONPATH"] = str(tmp_path / "image-libs")
        processes.append(
            subprocess.Popen(
                command,
                cwd=REPO,
                env=pod_env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    results = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            out, err = process.communicate()
            pytest.fail(f"a pod did not finish in {TIMEOUT_S}s\n{out}\n{err}")
        results.append((process.returncode, out, err))
    for index, (code, out, err) in enumerate(results):
        assert code == 0, f"pod {index}: exit {code}\nstdout:\n{out}\nstderr:\n{err}"
        said = next(line for line in out.splitlines() if "TF_CONFIG" in line)
        config = json.loads(said.split("TF_CONFIG ", 1)[1])
        assert config == {"cluster": {"worker": local}, "task": {"type": "worker", "index": index}}
        progress = json.loads((tmp_path / f"pod{index}" / "progress.json").read_text())
        assert (progress["task_index"], progress["num_workers"]) == (index, 2)
        assert progress["num_replicas"] == 2  # one cluster of two workers, not two alone
        assert (progress["step"], progress["checkpoint_step"]) == (20, 20)
    assert "(chief)" in results[0][1] and "(chief)" not in results[1][1]
    assert (checkpoints / "checkpoint").exists()  # the chief wrote them
    assert host_program_imports(marker) == [], all_imports(marker)


def test_two_jax_pods_launched_from_the_runtime_fit_together(tmp_path: Path) -> None:
    """keras: jax: the pods get what the Trainer's jax policy writes (JAX_COORDINATOR_ADDRESS,
    pod 0's; JAX_NUM_PROCESSES; JAX_PROCESS_ID, the index), JobSet's names swapped for local
    ports as above; the launcher adds Keras' variables and a real Keras 3 model.fit on JAX
    (tests/scripts/fit_keras3_jax.py) trains in both with the same weights."""
    script = REPO / "tests" / "scripts" / "fit_keras3_jax.py"
    inventory_file = tmp_path / "inv.yaml"
    inventory_file.write_text(
        "defaults: {port: 2222}\n"
        "hosts:\n  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.2}\n"
        f"job: {{name: fit, script: {json.dumps(str(script))}, keras: jax,\n"
        "      env: {EPOCHS: '1', SAVE_EVERY: '4', TF_CPP_MIN_LOG_LEVEL: '2'}}\n"
    )
    documents = trainjob(load_inventory(inventory_file), "img")
    assert problems(documents) == []
    replicated = documents[0]["spec"]["template"]["spec"]["replicatedJobs"][0]
    container = replicated["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert container["args"] == ["python", "/workspace/fit_keras3_jax.py"]
    # The pods' python: the jax-only install (JAX and Keras 3, no TensorFlow), as a JAX image's.
    python = jax_only_python()
    command = [python, *container["command"][1:], python, str(script)]
    local = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = []
    for index in range(2):
        run_dir = tmp_path / f"pod{index}"
        run_dir.mkdir()
        pod_env = worker_env(run_dir, None, **{**env, CHECKPOINT_DIR_ENV: str(tmp_path / "c")})
        pod_env.update({pod_launcher.WORKERS_ENV: json.dumps(local),
                        pod_launcher.INDEX_ENV: str(index),
                        # the Trainer's jax policy, for pods named as `local`
                        "JAX_COORDINATOR_ADDRESS": local[0], "JAX_NUM_PROCESSES": "2",
                        "JAX_PROCESS_ID": str(index)})  # fmt: skip
        pod = subprocess.Popen(command, cwd=REPO, env=pod_env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        processes.append(pod)
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            pytest.fail(f"a pod did not finish in {TIMEOUT_S}s\n{process.communicate()[0]}")
    for index, (process, out) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"pod {index}: exit {process.returncode}\n{out[-3000:]}"
        assert f"process {index} of 2, JAX cluster {','.join(local)}" in out
    done = [json.loads((tmp_path / f"pod{i}" / "checksum.json").read_text()) for i in range(2)]
    assert [(d["process"], d["tf_config"], d["addresses"]) for d in done] == [
        (0, None, ",".join(local)), (1, None, ",".join(local))]  # fmt: skip
    assert done[0]["sha256"] == done[1]["sha256"], done
