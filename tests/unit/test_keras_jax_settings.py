"""job.keras: jax (issue 57): the inventory's rules, the local inventory, the JAX cluster's
variables of a plain JAX script (worker.jax_cluster), and JAX's failures read from their logs
(lines as JAX 0.10.2 prints them, from two local processes on this machine kind). Pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import __version__
from orchestrator.backends.hosts.checks import run_preflight
from orchestrator.backends.registry import load_inventory, load_inventory_text
from orchestrator.backends.software import WORKER_PACKAGE
from orchestrator.config.local import local_inventory
from orchestrator.contract import JAX_CPU_COLLECTIVES_ENV, KERAS_BACKEND_ENV
from orchestrator.engine.observe.failures import FailureKind, classify_exit, explain
from orchestrator.engine.supervision.policy import WARM_RESTARTS_ENV, with_warm_default
from orchestrator.errors import InventoryError
from orchestrator.model.findings import Status
from orchestrator.model.inventory import Inventory, Job
from tests.fakes.planning import plan_workers
from tests.unit.test_preflight_findings import all_ok_peers, backend_with, cluster, inspection
from worker.jax_cluster import cluster_arguments

# The survivor of a SIGKILLed peer (gloo's collective over the closed socket), then JAX's
# coordination service ending a process whose peer died.
GLOO_RESET = [
    "jax.errors.JaxRuntimeError: INTERNAL: Error dispatching computation: Gloo all-reduce "
    "failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:8113: "
    "Connection reset by peer",
]
GLOO_ALLGATHER = ["RuntimeError: Gloo AllGather failed: [pair.cc:589] Connection closed by peer"]
# Both workers of two namespace hosts whose name resolved to 127.0.0.1 (measured): gloo sent
# each to its own loopback.
GLOO_LOOPBACK = [
    "jax.errors.JaxRuntimeError: UNKNOWN: Gloo context initialization failed: [external/gloo/"
    "gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, "
    "remote=[127.0.0.1]:33154$1",
]
GLOO_CONNECT_TIMEOUT = [
    "jax.errors.JaxRuntimeError: UNKNOWN: Gloo context initialization failed: [external/gloo/"
    "gloo/transport/tcp/pair.h:311] Connect timeout [none]",
]
FATAL = [
    "F1207 08:39:53.679502   19216 client.h:80] Terminating process because the JAX distributed "
    "service detected fatal errors. This most likely indicates that another task died; see the "
    "other task logs for more details.",
]
# A process whose registration with the coordinator timed out (300 s): printed alike by the
# coordinator whose peer never came and by a peer that never reached the coordinator.
REGISTER_TIMEOUT = [
    "F1207 08:45:20.893895   28082 client.h:80] Terminating process because the JAX distributed "
    "service detected fatal errors. This most likely indicates that another task died; see the "
    "other task logs for more details. Disable Python buffering, i.e. `python -u`, to be sure to "
    "see all the previous output. absl::Status: DEADLINE_EXCEEDED: Deadline Exceeded",
    "",
    "RPC: /xla.coordination.CoordinationService/RegisterTask",
    "*** Check failure stack trace: ***",
]
REGISTRATION_FAILED = [
    "Stopping coordination service as cluster registration failed. This may be due to 1) some "
    "tasks crashed earlier before connecting, 2) some tasks were never scheduled",
    "Original error: DEADLINE_EXCEEDED: Barrier timed out. Id: "
    "[Init]Wait_for_all_tasks_to_register::0.",
]


def inventory_file(tmp_path: Path, job: str, hosts: str = "") -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "inv.yaml"
    path.write_text(
        "defaults: {connection: local}\nhosts:\n"
        "  - {name: a, address: localhost, port: 20001}\n"
        "  - {name: b, address: localhost, port: 20002}\n" + hosts + f"job: {job}\n"
    )
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.exit_code == 2
    return [str(p) for p in caught.value.problems]


def test_what_keras_jax_refuses_is_said_with_its_line(tmp_path: Path) -> None:
    tools = "{task: 'm:f', steps: 5, keras: jax, export: saved_model, profile_steps: [2, 3]}"
    task = problems(inventory_file(tmp_path, tools))
    assert any("job.export: saved_model is a TensorFlow SavedModel" in p for p in task), task
    assert any("job.profile_steps: TensorFlow's profiler" in p for p in task), task
    loop = load_inventory(inventory_file(tmp_path, "{task: 'm:f', steps: 5, keras: jax}"))
    assert loop.job.keras == "jax" and loop.job.task == "m:f"  # the built-in loop on JAX
    assert not loop.job.warm  # a standby would import TensorFlow, which a jax host lacks
    assert not with_warm_default(loop, {WARM_RESTARTS_ENV: "1"}).job.warm
    warm = problems(inventory_file(tmp_path, "{task: 'm:f', steps: 5, keras: jax, "
                                   "warm_restarts: true}"))  # fmt: skip
    assert any("job.warm_restarts: a standby imports TensorFlow" in p for p in warm), warm
    mirrored = problems(
        inventory_file(tmp_path, "{script: train.py, keras: jax, strategy: mirrored}")
    )
    assert any("job.strategy: mirrored is TensorFlow's" in p for p in mirrored), mirrored
    evaluator = "  - {name: e, role: evaluator, address: localhost, port: 20003}\n"
    found = problems(inventory_file(tmp_path, "{script: train.py, keras: jax}", evaluator))
    assert any("hosts.e.role: an evaluator reads TensorFlow checkpoints" in p for p in found)


def test_the_per_process_variables_are_not_job_env(tmp_path: Path) -> None:
    job = "{script: train.py, keras: jax, env: {KERAS_DISTRIBUTION_PROCESS_ID: '0'}}"
    found = problems(inventory_file(tmp_path, job))
    assert any("job.env.KERAS_DISTRIBUTION_PROCESS_ID: set 'job.keras: jax' instead" in p
               for p in found), found  # fmt: skip


def test_keras_jax_loads_on_slurm_its_cluster_left_to_the_launcher(tmp_path: Path) -> None:
    """Refused until the batch script's launcher wrote the JAX cluster from Slurm's node list
    (test_slurm_plan.py checks what it writes)."""
    (tmp_path / "train.py").write_text("")
    slurm = tmp_path / "slurm.yaml"
    slurm.write_text("slurm:\n  nodes: 2\njob:\n  name: demo\n  script: train.py\n  keras: jax\n")
    inventory = load_inventory(slurm)
    assert inventory.job.keras == "jax" and len(inventory.hosts) == 2


def test_the_local_inventory_of_keras_jax_runs_a_jax_cluster(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    text = local_inventory(script, [20001, 20002], keras="jax")
    inventory = load_inventory_text(text, "<local>", tmp_path, "train")
    assert inventory.job.keras == "jax"
    specs = plan_workers(inventory, "r1", {"worker-0": "/w", "worker-1": "/w"})
    assert [s.env[KERAS_BACKEND_ENV] for s in specs] == ["jax", "jax"]
    assert [s.env["KERAS_DISTRIBUTION_PROCESS_ID"] for s in specs] == ["0", "1"]
    assert {s.env["JAX_COORDINATOR_ADDRESS"] for s in specs} == {"localhost:20001"}
    assert {s.env[JAX_CPU_COLLECTIVES_ENV] for s in specs} == {"gloo"}
    assert [s.tf_config for s in specs] == [{}, {}]  # the minder then sets no TF_CONFIG


def test_a_plain_jax_script_gets_initialize_s_arguments() -> None:
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:2222", "JAX_NUM_PROCESSES": "3",
           "JAX_PROCESS_ID": "2"}  # fmt: skip
    assert cluster_arguments(env) == {
        "coordinator_address": "10.0.0.1:2222", "num_processes": 3, "process_id": 2,
    }  # fmt: skip
    assert cluster_arguments({}) is None  # run by hand: one process, nothing to join
    with pytest.raises(ValueError, match="JAX_PROCESS_ID not set"):
        cluster_arguments({k: v for k, v in env.items() if k != "JAX_PROCESS_ID"})
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES is 'two'"):
        cluster_arguments({**env, "JAX_NUM_PROCESSES": "two"})


@pytest.mark.parametrize(
    ("returncode", "tail", "kind"),
    [
        (1, GLOO_RESET, FailureKind.PEER_LOST),
        (1, GLOO_ALLGATHER, FailureKind.PEER_LOST),
        (-6, FATAL, FailureKind.PEER_LOST),  # JAX aborts the process itself: SIGABRT
        (1, REGISTRATION_FAILED, FailureKind.PEER_LOST),  # the coordinator waited for a peer
        (-6, REGISTER_TIMEOUT, FailureKind.COORDINATOR_UNREACHABLE),
        (1, GLOO_LOOPBACK, FailureKind.COLLECTIVES_UNREACHABLE),
        (1, GLOO_CONNECT_TIMEOUT, FailureKind.COLLECTIVES_UNREACHABLE),
        (-9, GLOO_RESET, FailureKind.KILLED),  # killed from outside: its own abort is no cause
    ],
)
def test_jax_failures_are_read_from_the_log(
    returncode: int, tail: list[str], kind: FailureKind
) -> None:
    assert classify_exit(returncode, tail) is kind


def test_an_unreachable_coordinator_says_where_to_look() -> None:
    hint = explain(FailureKind.COORDINATOR_UNREACHABLE) or ""
    assert "chief's host:port" in hint and "orchestrate check" in hint
    hint = explain(FailureKind.COLLECTIVES_UNREACHABLE) or ""
    assert "not 127.0.x.x" in hint and "the gloo check" in hint


JAX_OK = {"jax": "0.10.2", "keras": "3.15.1"}


@pytest.mark.parametrize(
    ("packages", "status", "words"),
    [
        (JAX_OK, Status.OK, "JAX 0.10.2, Keras 3.15.1"),
        ({"keras": "3.15.1"}, Status.FAIL, "job.keras is jax but JAX is not installed"),
        ({"jax": "0.10.2", "keras": "2.15.0"}, Status.FAIL, "Keras 2.15.0 is not Keras 3"),
        ({**JAX_OK, "jax": "0.9.0"}, Status.FAIL, "JAX 0.9.0, but the cluster mixes 0.10.2, 0.9.0"),
    ],
)
def test_jax_and_keras_versions_are_checked_on_every_host(
    tmp_path: Path, packages: dict[str, str], status: Status, words: str
) -> None:
    """Host b differs; a and c have JAX_OK. No TensorFlow anywhere: a jax job needs none."""
    tasked = cluster(tmp_path)
    inventory = Inventory(tasked.path, tasked.base_dir, tasked.hosts,
                          Job("demo", script="train.py", keras="jax"))  # fmt: skip
    others = inspection(packages=dict(JAX_OK))
    backend = backend_with({"a": others, "b": inspection(packages=packages), "c": others},
                           all_ok_peers())  # fmt: skip
    report = run_preflight(inventory, backend)
    (finding,) = [f for f in report.findings if f.host == "b" and f.check == "jax"]
    assert finding.status is status and words in finding.detail, finding
    assert not [f for f in report.findings if f.check in ("tensorflow", "keras")]
    if status is Status.FAIL:
        hint = finding.hint or ""
        assert "pip install '.[jax]'" in hint or "the same JAX version" in hint, hint
        assert "'orchestrate[" not in hint  # PyPI's orchestrate is another project


def test_tensorflow_beside_jax_is_a_warning_and_a_jax_task_needs_the_worker_package(
    tmp_path: Path,
) -> None:
    """TensorFlow on host b beside JAX: a warning naming it (the check still passes); the
    built-in loop (`task:`) on JAX needs the controller's worker package on every host."""
    tasked = cluster(tmp_path)
    inventory = Inventory(tasked.path, tasked.base_dir, tasked.hosts,
                          Job("demo", task="m:f", keras="jax"))  # fmt: skip
    worker = {WORKER_PACKAGE: __version__}
    backend = backend_with({"a": inspection(packages={**JAX_OK, **worker}),
                            "b": inspection(packages={**JAX_OK, **worker, "tensorflow": "2.21.0"}),
                            "c": inspection(packages=dict(JAX_OK))},
                           all_ok_peers())  # fmt: skip
    report = run_preflight(inventory, backend)
    found = {(f.host, f.check): f for f in report.findings}
    beside = found["b", "tensorflow"]
    assert (
        beside.status is Status.WARN
        and "TensorFlow 2.21.0 is installed beside JAX" in beside.detail
    )
    assert "pip install '.[jax]'" in (beside.hint or "")
    assert ("a", "tensorflow") not in found and ("c", "tensorflow") not in found
    assert found["a", "worker"].status is Status.OK
    assert found["c", "worker"].status is Status.FAIL
    assert "worker package is not installed" in found["c", "worker"].detail


@pytest.mark.parametrize(
    ("addresses", "status", "words"),
    [
        (["10.9.0.2", "127.0.1.1"], Status.OK, "node-b resolves to 10.9.0.2"),
        (["127.0.1.1", "10.9.0.2"], Status.FAIL, "node-b resolves to 127.0.1.1 on b"),
        ([], Status.FAIL, "node-b resolves to no address on b"),
    ],
)
def test_a_host_name_that_resolves_to_loopback_is_found_for_gloo(
    tmp_path: Path, addresses: list[str], status: Status, words: str
) -> None:
    """gloo (JAX's CPU collectives) advertises the first address of the host's own name: a
    loopback one sends the peers to their own machines (measured on namespace hosts: "timed
    out connecting ... remote=[127.0.0.1]"). TensorFlow jobs are not asked about it."""
    tasked = cluster(tmp_path)
    inventory = Inventory(tasked.path, tasked.base_dir, tasked.hosts,
                          Job("demo", script="train.py", keras="jax"))  # fmt: skip
    named = {n: inspection(packages=dict(JAX_OK), hostname=f"node-{n}",
                           name_addresses=[f"10.9.0.{i + 1}"])
             for i, n in enumerate("ac")}  # fmt: skip
    b = inspection(packages=dict(JAX_OK), hostname="node-b", name_addresses=addresses)
    report = run_preflight(inventory, backend_with({**named, "b": b}, all_ok_peers()))
    gloo = {f.host: f for f in report.findings if f.check == "gloo"}
    assert sorted(gloo) == ["a", "b", "c"] and gloo["a"].status is Status.OK
    assert gloo["b"].status is status and words in gloo["b"].detail, gloo["b"]
    if status is Status.FAIL:
        assert "(10.9.0.2) in its /etc/hosts" in (gloo["b"].hint or "")
    tensorflow = run_preflight(tasked, backend_with({"b": b}, all_ok_peers()))
    assert not [f for f in tensorflow.findings if f.check == "gloo"]
