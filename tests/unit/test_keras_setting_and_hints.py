"""job.keras, the legacy-Keras preflight finding, the failure hints, the early-exit rule, the
zero-config local inventory and the script helpers: pure decisions, no TensorFlow."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.hosts.checks import run_preflight
from orchestrator.backends.registry import load_inventory, load_inventory_text
from orchestrator.cli.render import problems
from orchestrator.config.local import free_ports, local_inventory
from orchestrator.contract import KERAS_MARKER_FILE, LEGACY_KERAS_ENV, tf_keras_requirement
from orchestrator.engine.observe.failures import (
    DETERMINISTIC,
    HINTS,
    MEANINGS,
    Failure,
    classify_exit,
    early_exit,
    explain,
)
from orchestrator.engine.observe.status import collect_status
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run
from orchestrator.errors import InventoryError, JobFailed
from orchestrator.machines.kinds import kind_of
from orchestrator.model.findings import Status
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.vocabulary import FailureKind, WorkerState
from tests.fakes.backend import FakeBackend, exited, running
from tests.fakes.planning import plan_workers
from tests.unit.test_preflight_findings import all_ok_peers, backend_with, cluster, inspection
from worker import helpers
from worker.config import ConfigError
from worker.kerasflavor import check_restorable


def two_hosts(tmp_path: Path, job: str) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "inv.yaml"
    path.write_text(
        "defaults: {connection: local}\nhosts:\n"
        "  - {name: a, address: localhost, port: 20001}\n"
        "  - {name: b, address: localhost, port: 20002}\n"
        f"job: {job}\n"
    )
    return path


def test_keras_legacy_sets_the_variable_on_every_worker(tmp_path: Path) -> None:
    inventory = load_inventory(two_hosts(tmp_path, "{script: train.py, keras: legacy}"))
    assert inventory.job.keras == "legacy"
    specs = plan_workers(inventory, "r1", {"a": "/w", "b": "/w"})
    assert [s.env.get(LEGACY_KERAS_ENV) for s in specs] == ["1", "1"]
    default = load_inventory(two_hosts(tmp_path, "{script: train.py}"))
    assert default.job.keras == "default"
    specs = plan_workers(default, "r1", {"a": "/w", "b": "/w"})
    assert all(LEGACY_KERAS_ENV not in s.env for s in specs)


def test_keras_values_and_the_variable_in_env_are_inventory_errors(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as error:
        load_inventory(two_hosts(tmp_path, "{script: train.py, keras: '2'}"))
    assert "job.keras: expected one of default, legacy" in str(error.value.problems[0])
    with pytest.raises(InventoryError) as error:
        load_inventory(two_hosts(tmp_path, "{script: train.py, env: {TF_USE_LEGACY_KERAS: '1'}}"))
    assert "set 'job.keras: legacy' instead" in str(error.value.problems[0])


@pytest.mark.parametrize(
    ("tf_keras", "status", "words"),
    [
        ("2.21.0", Status.OK, "tf_keras 2.21.0"),
        (None, Status.FAIL, "not installed"),
        ("2.20.1", Status.FAIL, "does not match TensorFlow 2.21.0"),
    ],
)
def test_legacy_keras_preflight(tmp_path: Path, tf_keras: str | None, status: Status,
                                words: str) -> None:  # fmt: skip
    inventory = cluster(tmp_path, keras="legacy")
    packages = {"tensorflow": "2.21.0", "tf-keras": tf_keras, "tf-orchestrate": inspection()[
        "packages"]["tf-orchestrate"]}  # fmt: skip
    backend = backend_with({"b": inspection(packages=packages)}, all_ok_peers())
    report = run_preflight(inventory, backend)
    (finding,) = [f for f in report.findings if f.host == "b" and f.check == "keras"]
    assert finding.status is status and words in finding.detail
    if status is Status.FAIL:
        assert finding.hint and "pip install 'tf-keras~=2.21.0'" in finding.hint


def test_no_keras_finding_without_legacy(tmp_path: Path) -> None:
    report = run_preflight(cluster(tmp_path), backend_with({}, all_ok_peers()))
    assert not [f for f in report.findings if f.check == "keras"]
    assert tf_keras_requirement("2.21.3") == "tf-keras~=2.21.0"


@pytest.mark.parametrize(
    ("tail", "kind", "advice"),
    [
        (["AttributeError: 'SparseCategoricalAccuracy' object has no attribute 'reset_states'"],
         FailureKind.KERAS_API, "set job.keras: legacy"),
        (["  }) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>)"
          " to a Tensor."], FailureKind.KERAS_API, "set job.keras: legacy"),
        (["tensorflow.python.framework.errors_impl.UnknownError: Could not start gRPC server"],
         FailureKind.PORT_BUSY, "another port:"),
        (["tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted"],
         FailureKind.PEER_LOST, "the worker that failed first"),
        (["tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating"],
         FailureKind.OUT_OF_MEMORY, "batch_size"),
        (["ModuleNotFoundError: No module named 'mylib.tools'"], FailureKind.IMPORT_ERROR,
         "list mylib.py (or the mylib/ directory) under job.files:"),
        (["WARNING: Your environment has TF_USE_LEGACY_KERAS set to True, but you do not have the "
          "tf_keras package installed."], FailureKind.IMPORT_ERROR,
         "pip install '.[legacy-keras]'"),
    ],
)  # fmt: skip
def test_each_kind_explains_what_to_do(tail: list[str], kind: FailureKind, advice: str) -> None:
    assert classify_exit(1, tail) is kind
    assert advice in (explain(kind, tail) or "")


def test_every_kind_has_a_hint_and_the_deterministic_ones_are_not_retried() -> None:
    # The manual's failure reference is generated from HINTS and MEANINGS: every kind has both.
    assert [k for k in FailureKind if k not in HINTS] == []
    assert [k for k in FailureKind if k not in MEANINGS] == []
    assert {FailureKind.KERAS_API, FailureKind.IMPORT_ERROR, FailureKind.USAGE} <= DETERMINISTIC
    assert FailureKind.PEER_LOST not in DETERMINISTIC and FailureKind.KILLED not in DETERMINISTIC
    assert "memory" in (explain(classify_exit(137, [])) or "")  # SIGKILL: the OOM killer


def test_a_worker_that_left_early_is_the_cause() -> None:
    stalled = Failure("b", FailureKind.STALLED, "stalled: no progress for 8 s", None)
    blamed = early_exit(stalled, ["a"])
    assert (blamed.worker, blamed.kind) == ("a", FailureKind.LEFT_EARLY)
    assert "while b still waited for it" in blamed.reason
    assert early_exit(stalled, []) is stalled
    mid_training = Failure("b", FailureKind.STALLED, "stalled at step 40", 40)
    assert early_exit(mid_training, ["a"]) is mid_training  # stuck on its own
    crash = Failure("b", FailureKind.OUT_OF_MEMORY, "MemoryError", 3, 1)
    assert early_exit(crash, ["a"]) is crash  # a chief evaluating alone is no early exit


def supervise(tmp_path: Path, backend: FakeBackend, **job: Any) -> Any:
    hosts = tuple(WorkerSlot(name, f"10.0.0.{i + 1}", 20000) for i, name in enumerate("ab"))
    inventory = Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts,
                          Job("demo", script="t.py", restart_backoff=0, **job))  # fmt: skip
    store = RunStore(tmp_path / "state")
    record = start_run(inventory, store, backend)
    with pytest.raises(JobFailed) as error:
        Supervisor(store, backend, record, interval=0).run()
    return store, error.value


def test_the_killed_peer_not_the_aborted_one_is_the_root_cause(tmp_path: Path) -> None:
    aborted = ["UnavailableError: Collective ops is aborted by: worker b is unhealthy"]
    backend = FakeBackend(scripts={
        "a": {0: [running(3), exited(1, 3, finished_at=1.0, tail=aborted, error=aborted[0])]},
        "b": {0: [running(3), exited(-9, 3, finished_at=2.0)]},
    })  # fmt: skip
    store, error = supervise(tmp_path, backend, max_restarts=0)
    assert "the worker that failed first: b at step 3" in error.message
    assert "OOM killer" in error.message
    record = store.load()
    assert "What to do:" in (record.outcome or "")


def test_an_early_exit_is_reported_and_not_retried(tmp_path: Path) -> None:
    waiting = {"exists": True, "pid": 100, "alive": True, "worker_pid": 101, "progress": None}
    backend = FakeBackend(scripts={"a": {0: [exited(0, None)]}, "b": {0: [waiting]}})
    # start_timeout 1: the waiting peer is given up on at once (it never steps in this fake)
    store, error = supervise(tmp_path, backend, max_restarts=3, stall_timeout=1, start_timeout=1)
    assert "the worker that failed first: a" in error.message
    assert "after 0 restart(s)" in error.message
    assert store.load().restarts == ()


def test_status_lines_carry_the_hint(tmp_path: Path) -> None:
    tail = ["ModuleNotFoundError: No module named 'helpers'"]
    backend = FakeBackend(scripts={"a": {0: [exited(1, None, error=tail[0], tail=tail)]}})
    hosts = (WorkerSlot("a", "10.0.0.1", 20000),)
    inventory = Inventory(str(tmp_path / "i.yaml"), str(tmp_path), hosts, Job("d", script="t.py"))
    record = start_run(inventory, RunStore(tmp_path / "s"), backend)
    status = collect_status(record, backend, backend.scheduler)
    (worker,) = status.workers
    assert worker.state is WorkerState.FAILED and worker.failure_kind == "import error"
    assert worker.to_json()["hint"] and "job.files:" in worker.to_json()["hint"]
    assert any(line.startswith("  what to do:") for line in problems(status))


def test_local_inventory_is_a_valid_inventory_on_distinct_free_ports(tmp_path: Path) -> None:
    script = tmp_path / "my train.py"
    script.write_text("")
    ports = free_ports(3)
    assert len(set(ports)) == 3
    text = local_inventory(script, ports, ["--epochs", "3", "a b"], keras="legacy")
    inventory = load_inventory_text(text, "<local>", tmp_path, "x")
    assert [h.port for h in inventory.hosts] == ports
    assert [h.name for h in inventory.hosts] == ["worker-0", "worker-1", "worker-2"]
    assert inventory.job.script == str(script) and inventory.job.name == "my-train"
    assert inventory.job.args == ("--epochs", "3", "a b") and inventory.job.keras == "legacy"
    assert all(kind_of(h).shares_files_with_controller for h in inventory.hosts)


def test_chief_and_write_dir(tmp_path: Path) -> None:
    def config(index: int) -> dict[str, str]:
        cluster = {"worker": ["localhost:1", "localhost:2"]}
        return {"TF_CONFIG": json.dumps({"cluster": cluster,
                                         "task": {"type": "worker", "index": index}}),
                "ORCHESTRATE_RUN_DIR": str(tmp_path)}  # fmt: skip

    assert helpers.is_chief(config(0)) and not helpers.is_chief(config(1))
    assert helpers.is_chief({})  # no TF_CONFIG: a one-worker cluster
    # job.keras: jax has no TF_CONFIG: keras.distribution's process 0 is the chief
    jax = "KERAS_DISTRIBUTION_PROCESS_ID"
    assert helpers.is_chief({jax: "0"}) and not helpers.is_chief({jax: "1"})
    assert helpers.task_index(config(1)) == 1
    target = tmp_path / "saved"
    with helpers.write_dir(str(target), config(0)) as where:
        assert where == str(target) and target.is_dir()
    with helpers.write_dir(str(target), config(1)) as where:
        assert where != str(target) and os.path.isdir(where)
        Path(where, "weights").write_text("x")
    assert not os.path.exists(where)  # the temporary copy is gone


def test_a_checkpoint_of_the_other_keras_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(LEGACY_KERAS_ENV, "1")
    check_restorable(str(tmp_path), has_checkpoint=False)  # nothing to restore: fine
    with pytest.raises(ConfigError, match=re.escape("written with job.keras: default")):
        check_restorable(str(tmp_path), has_checkpoint=True)  # no marker: Keras 3 wrote it
    (tmp_path / KERAS_MARKER_FILE).write_text(json.dumps({"keras": "legacy"}))
    check_restorable(str(tmp_path), has_checkpoint=True)
    monkeypatch.delenv(LEGACY_KERAS_ENV)
    with pytest.raises(ConfigError, match=re.escape("Set job.keras: legacy again")):
        check_restorable(str(tmp_path), has_checkpoint=True)
