"""`orchestrate` on a real Slurm cluster: slurmctld here, two slurmd in their own network
namespaces (tests/cluster/slurm.py), real TensorFlow MultiWorkerMirroredStrategy between them,
and a login node with its own sshd for the runs driven from "a laptop" (slurm.login). Two more
nodes, only in the cluster's ROLES_PARTITION, carry a ParameterServerStrategy job's four tasks.

One cluster for the whole session; it is torn down afterwards and the teardown is checked.
Run these under `flock /tmp/orchestrate-slurm.lock` (one cluster on 10.232.0.0/24 at a time).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import phase_log
from tests.cluster.slurm import (
    LOGIN_ALIAS,
    PARTITION,
    ROLES_PARTITION,
    SlurmCluster,
    unavailable_reason,
)
from tests.conftest import (
    clean_env,
    dashboard_view,
    first_run_dir,
    progress_in,
    suspend_workers,
    wait_for,
)
from tests.jaxonly import jax_only_python
from tests.planted import ALL_NAMES, all_imports, host_program_imports, plant

pytestmark = [pytest.mark.slurm, pytest.mark.tf]
REPO = Path(__file__).resolve().parents[2]
UNAVAILABLE = unavailable_reason()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    if UNAVAILABLE is not None:
        pytest.skip(UNAVAILABLE)
    # Two nodes more, in ROLES_PARTITION only: a job of chief, workers and ps (issue 45).
    cluster = SlurmCluster(Path(f"/tmp/orchestrate-slurm-{os.getpid()}"), login=True, extra=2)
    with phase_log.phase("cluster", "Slurm cluster started"):
        cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        left = cluster.leftovers()
        assert not left, f"the Slurm test cluster left {left}"


class Orchestrate:
    """The real CLI as a user on the login node runs it, in a directory on the shared disk."""

    def __init__(self, cluster: SlurmCluster, cwd: Path, laptop: bool = False) -> None:
        self.cluster, self.cwd, self.laptop = cluster, cwd, laptop
        self.env = clean_env(SLURM_CONF=str(cluster.conf), TF_CPP_MIN_LOG_LEVEL="2")
        if laptop:  # no Slurm here: an empty config makes every Slurm command fail at once
            empty = cwd / "no-slurm-here.conf"
            empty.write_text("")
            self.env["SLURM_CONF"] = str(empty)

    def __call__(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=self.cwd,
                              env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False)  # fmt: skip

    def status(self, polling: bool = False) -> dict[str, Any]:
        """`polling`: a poll may find the login node slow to answer (exit 3, state unknown)
        on this loaded 2-core machine; the next poll asks again."""
        result = self("status", "--json", timeout=60)
        if polling and result.returncode == 3 and result.stdout.strip():
            return dict(json.loads(result.stdout))
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))

    def slurm(self, *argv: str) -> str:
        """A Slurm command on the cluster itself (never the laptop's environment)."""
        return subprocess.run(argv, env=self.cluster.env(), capture_output=True, text=True,
                              check=True).stdout  # fmt: skip

    def inventory(
        self, steps: int, stall_timeout: int = 120, job: list[str] | None = None, **slurm: object
    ) -> Path:
        """The shapes task on two nodes, or the `job` lines given."""
        options = {"nodes": 2, "partition": PARTITION, "python": sys.executable,
                   "workdir": str(self.cwd / "shared"), **slurm}  # fmt: skip
        if self.laptop:
            options.setdefault("login", {"address": LOGIN_ALIAS, "python": sys.executable,
                               "ssh_config": str(self.cluster.login_ssh_config)})  # fmt: skip
        shapes = ["  name: shapes", "  task: worker.examples.shapes:task", f"  steps: {steps}",
                  "  checkpoint_every: 100", "  batch_size: 16", "  log_every: 10"]  # fmt: skip
        lines = ["slurm:", *(f"  {k}: {json.dumps(v)}" for k, v in options.items()), "job:",
                 *(job or shapes), "  restart_backoff: 0",
                 f"  stall_timeout: {stall_timeout}"]  # fmt: skip
        path = self.cwd / "slurm.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path


@pytest.fixture
def orchestrate(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Orchestrate:
    # Not under pytest's 0700 tmp root: the nodes' tasks run the same paths (shared "disk").
    base = Path(f"{slurm_cluster.base}-work") / tmp_path_factory.mktemp("w").name
    base.mkdir(parents=True)
    os.chmod(base.parent, 0o755)
    return Orchestrate(slurm_cluster, base)


@pytest.fixture
def laptop(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Orchestrate:
    """orchestrate where Slurm's commands cannot work: it must go through the login node."""
    base = Path(f"{slurm_cluster.base}-work") / tmp_path_factory.mktemp("laptop").name
    base.mkdir(parents=True)
    os.chmod(base.parent, 0o755)
    return Orchestrate(slurm_cluster, base, laptop=True)


def run_processes(run_id: str) -> list[int]:
    """Every process of the run on any node (the nodes share this machine's process table)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"ORCHESTRATE_RUN_ID={run_id}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def wait_finished(orchestrate: Orchestrate, timeout: float = 150) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        status = orchestrate.status()
        lock = orchestrate.cwd / ".orchestrate" / "runs" / f"{status['run_id']}.lock"
        done = status["state"] in ("succeeded", "failed", "stopped")
        return status if done and not _locked(lock) else None

    try:
        return dict(wait_for(finished, timeout, "the run to end"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_what_the_run_did(orchestrate)}") from None


def _what_the_run_did(orchestrate: Orchestrate, tail: int = 1500) -> str:
    """For a run that did not end: its status, Slurm's queue, and the end of every log of
    its attempts (the batch script's, each task's launcher and worker)."""
    answer = orchestrate("status", "--json", timeout=60).stdout
    try:
        doc = json.loads(answer)
        workers = [{k: w.get(k) for k in ("name", "state", "step", "checkpoint_step", "pid")}
                   for w in doc.get("workers", [])]  # fmt: skip
        brief = json.dumps({"state": doc.get("state"), "workers": workers})
    except ValueError:
        brief = answer[-tail:]
    parts = [f"status: {brief}", f"squeue: {orchestrate.slurm('squeue', '-a')}"]
    runs = [r for r in (orchestrate.cwd / "shared").glob("*/runs/*") if r.is_dir()]
    for log in sorted(p for r in runs for p in r.rglob("*") if p.suffix in (".log", ".out")):
        text = log.read_text(errors="replace")[-tail:]
        parts.append(f"--- {log.relative_to(orchestrate.cwd)}:\n{text}")
    return "\n".join(parts)


def _locked(path: Path) -> bool:
    import fcntl

    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def test_trains_on_two_nodes_then_resumes_from_the_checkpoint(orchestrate: Orchestrate) -> None:
    started = time.monotonic()
    first = orchestrate("up", str(orchestrate.inventory(steps=100)))
    took = time.monotonic() - started
    assert first.returncode == 0, first.stderr
    assert "job shapes succeeded at step 100" in first.stderr + first.stdout
    nodes = {w["host"] for w in orchestrate.status()["workers"]}
    assert nodes == {"n1", "n2"}, nodes
    print(f"two-node job: {took:.1f} s from up to its end")

    again = orchestrate("up", str(orchestrate.inventory(steps=200)))
    assert again.returncode == 0, again.stderr
    assert "resuming from checkpoint ckpt-" in again.stderr, again.stderr
    status = orchestrate.status()
    assert [w["step"] for w in status["workers"]] == [200, 200]
    history = orchestrate.cwd / "shared" / "shapes" / "runs" / status["run_id"]
    log = (history / "attempt-0" / "task0" / "worker.log").read_text()
    assert "step 100" in log and "step 10/" not in log.replace("step 100/", "")
    assert len(status["scheduler"]["jobs"]) == 1
    # The launcher saw each task listen on its port: both joined the cluster (issue 28).
    exits = sorted(history.glob("attempt-*/task*/exit.json"))
    assert [json.loads(path.read_text()).get("joined") for path in exits] == [True, True]
    # The same steps a third time (issue 56): the chief's checkpoint, read on the shared disk
    # through the login side, reaches them: no batch job, no run, exit 0.
    third = orchestrate("up", str(orchestrate.inventory(steps=200)))
    assert third.returncode == 0, third.stderr
    assert "ckpt-200 already reaches steps: 200: nothing to train" in _flat(third.stderr)
    assert orchestrate.status()["run_id"] == status["run_id"]
    # The dashboard of a Slurm run: the chief's curves (the final evaluation's too) and both
    # tasks' logs, read on the shared disk through the backend.
    document, lines = dashboard_view(
        orchestrate.cwd,
        lambda d: "<polyline" in d["charts"]["val_loss"],
        env=orchestrate.env,
        log_workers=frozenset({"task0", "task1"}),
    )
    assert [w["state"] for w in document["workers"]] == ["succeeded", "succeeded"]
    assert "<polyline" in document["charts"]["loss"]
    assert {line["worker"] for line in lines} == {"task0", "task1"}


def test_status_while_running_then_down_leaves_nothing(orchestrate: Orchestrate) -> None:
    up = orchestrate("up", "--detach", str(orchestrate.inventory(steps=100000)))
    assert up.returncode == 0, up.stderr

    def running() -> dict[str, Any] | None:
        status = orchestrate.status()
        steps = [w["step"] or 0 for w in status["workers"]]
        return status if status["state"] == "running" and min(steps) > 0 else None

    status = wait_for(running, 90, "both workers to report steps")
    job = status["scheduler"]
    assert job["state"] == "RUNNING" and job["nodes"] == "n[1-2]", job
    assert {w["host"] for w in status["workers"]} == {"n1", "n2"}
    assert run_processes(status["run_id"])
    # Every task's stacks, now: scancel --signal=USR2, read back through the shared disk.
    _both_stacks(orchestrate, seen=("loop.py",))  # the built-in loop (worker/loop.py)
    assert orchestrate.status()["state"] == "running"  # SIGUSR2 ended nothing

    down = orchestrate("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "task0: stopped" in down.stdout, down.stdout
    assert orchestrate.slurm("squeue", "-h", "-j", job["job_id"]).strip() == ""
    wait_for(lambda: not run_processes(status["run_id"]), 20, "every process of the run to end")
    final = orchestrate.status()
    assert [w["state"] for w in final["workers"]] == ["stopped", "stopped"]


def _both_stacks(orchestrate: Orchestrate, *options: str, seen: tuple[str, ...]) -> None:
    """`orchestrate stacks` on a running two-task job: both tasks' Python stacks, with `seen`."""
    stacks = orchestrate("stacks", *options, timeout=60)
    assert stacks.returncode == 0, stacks.stdout + stacks.stderr
    for text in ("task0", "task1", "most recent call first", *seen):
        assert text in stacks.stdout, stacks.stdout


def _start_long_run(orchestrate: Orchestrate, steps: int) -> dict[str, Any]:
    up = orchestrate("up", "--detach", str(orchestrate.inventory(steps=steps)))
    assert up.returncode == 0, up.stderr

    def checkpointed() -> dict[str, Any] | None:
        status = orchestrate.status()
        points = [w["checkpoint_step"] or 0 for w in status["workers"]]
        return status if status["state"] == "running" and min(points) >= 100 else None

    return dict(wait_for(checkpointed, 120, "a checkpoint at step 100"))


def test_a_killed_task_then_a_preemption_each_resume_the_job(orchestrate: Orchestrate) -> None:
    # One run, two interruptions (a job's start on the cluster is what costs): a task killed,
    # then the resubmitted job preempted as Slurm preempts; each next job resumes.
    status = _start_long_run(orchestrate, steps=1500)
    killed_at = max(w["checkpoint_step"] or 0 for w in status["workers"])
    victim = status["workers"][1]
    os.kill(victim["pid"], signal.SIGKILL)

    resumed = orchestrate.cwd / "shared" / "shapes" / "runs" / status["run_id"] / "attempt-1"

    def resumed_and_checkpointed() -> int | None:  # a periodic save of its own
        points = [progress_in(resumed / t).get("checkpoint_step") or 0 for t in ("task0", "task1")]
        return min(points) if min(points) >= killed_at + 100 else None

    # From the tasks' own files, and the job from squeue, not through `status` (squeue and
    # sacct on a loaded machine: seconds a poll, in which the resumed job trained to its end).
    periodic = wait_for(resumed_and_checkpointed, 120, "the resumed job's own checkpoint")
    (job_id,) = orchestrate.slurm("squeue", "-h", "-o", "%i").split()
    orchestrate.slurm("scancel", "--signal=TERM", job_id)
    final = wait_finished(orchestrate)
    assert final["state"] == "succeeded", final
    assert [w["step"] for w in final["workers"]] == [1500, 1500]
    record = orchestrate.cwd / ".orchestrate" / "runs" / f"{final['run_id']}.json"
    restarts = json.loads(record.read_text())["restarts"]
    assert [r["kind"] for r in restarts] == ["killed", "preempted"], restarts
    assert restarts[0]["worker"] == "task1", restarts
    jobs = final["scheduler"]["jobs"]
    assert len(jobs) == 3 and len(set(jobs)) == 3, jobs
    preempted = orchestrate.cwd / "shared" / "shapes" / "runs" / final["run_id"] / "attempt-1"
    exits = [json.loads((preempted / t / "exit.json").read_text()) for t in ("task0", "task1")]
    assert [e["returncode"] for e in exits] == [75, 75]
    saved = {json.loads((preempted / t / "progress.json").read_text())["checkpoint_step"]
             for t in ("task0", "task1")}  # fmt: skip
    assert len(saved) == 1 and saved.pop() > periodic  # both at one step, past the periodic one


def test_sbatch_refusing_the_job_is_exit_3_with_slurms_message(orchestrate: Orchestrate) -> None:
    up = orchestrate("up", "--skip-checks", str(orchestrate.inventory(steps=10, partition="nope")))
    assert up.returncode == 3, up.stderr
    assert "sbatch refused the job" in up.stderr and "Invalid partition" in up.stderr
    check = orchestrate("check", str(orchestrate.inventory(steps=10, partition="nope")))
    assert check.returncode == 5 and "does not exist" in check.stderr, check.stderr


def test_preflight_finds_a_checkpoint_dir_one_node_does_not_share(
    orchestrate: Orchestrate, slurm_cluster: SlurmCluster
) -> None:
    inventory = orchestrate.inventory(steps=10)
    good = orchestrate("check", str(inventory))
    assert good.returncode == 0, good.stderr
    assert "tensorflow" in good.stderr and "every node and this machine see" in good.stderr
    private = str(orchestrate.cwd / "shared" / "shapes" / "checkpoints")
    slurm_cluster.mount_private_tmpfs("n2", private)
    try:
        bad = orchestrate("check", "--json", str(inventory))
    finally:
        slurm_cluster.unmount("n2", private)
    assert bad.returncode == 5, bad.stderr
    failed = [f for f in json.loads(bad.stdout) if f["status"] == "fail"]
    assert [f["check"] for f in failed] == ["shared filesystem"], failed
    assert private in failed[0]["detail"]
    assert "n2 does not see this machine's files there" in failed[0]["detail"]
    assert "n1" not in failed[0]["detail"]


def test_the_exported_script_runs_under_plain_sbatch(orchestrate: Orchestrate) -> None:
    exported = orchestrate("export", str(orchestrate.inventory(steps=30)), "--format", "sbatch")
    assert exported.returncode == 0, exported.stderr
    script = orchestrate.cwd / "train.sbatch"
    script.write_text(exported.stdout)
    # The launcher carries JoinWatch and the file helpers (hostside/bundle.py), and starts
    # isolated: modules planted in the submit directory (the launcher's working directory) and
    # on the tasks' PYTHONPATH, named like the standard library's and like every module it
    # carries, are never imported by it (tests/planted.py; issue 40).
    label = "# orchestrate: slurm_launcher.py shipped with "
    header = next(line for line in exported.stdout.splitlines() if line.startswith(label))
    shipped = header[len(label) :].split(" (")[0].split(", ")
    assert {"procwatch.py", "safefiles.py"} <= set(shipped), header
    names = ALL_NAMES + tuple(name.removesuffix(".py") for name in shipped)
    marker = orchestrate.cwd / "planted-imports.txt"
    plant(orchestrate.cwd, marker, names)
    plant(orchestrate.cwd / "site-libs", marker, names)
    submit_env = {**orchestrate.env, "PYTHONPATH": str(orchestrate.cwd / "site-libs")}
    submitted = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], cwd=orchestrate.cwd,
                               env=submit_env, capture_output=True, text=True, timeout=180,
                               check=False)  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    attempt = orchestrate.cwd / "shared" / "shapes" / "runs" / f"slurm-{job}" / "attempt-0"
    for task in ("task0", "task1"):
        record = json.loads((attempt / task / "exit.json").read_text())
        assert (record["returncode"], record.get("joined")) == (0, True), record
        assert json.loads((attempt / task / "progress.json").read_text())["step"] == 30
    assert (orchestrate.cwd / "shared" / "shapes" / "checkpoints" / "checkpoint").exists()
    assert host_program_imports(marker) == [], all_imports(marker)


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _first_lines(
    orchestrate: Orchestrate, args: list[str], enough: Callable[[str], bool], stream: str = "stdout"
) -> str:
    """Run a command that goes on until Ctrl-C; what it printed once `enough` of it came."""
    import selectors

    process = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=orchestrate.cwd,
                               env=orchestrate.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    source = process.stdout if stream == "stdout" else process.stderr
    assert source is not None
    seen = ""
    with selectors.DefaultSelector() as selector:
        selector.register(source, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        while not enough(seen) and time.monotonic() < deadline and process.poll() is None:
            if selector.select(timeout=1):
                seen += source.readline()
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=40)
    finally:
        if process.poll() is None:
            process.kill()
    assert enough(seen), f"{args}: {seen}"
    other = process.stderr if stream == "stdout" else process.stdout
    assert other is not None
    return seen + source.read() + other.read()  # what it said on the way out too


def test_a_laptop_drives_slurm_through_the_login_node(laptop: Orchestrate) -> None:  # noqa: PLR0915
    local = subprocess.run(["sinfo"], env=laptop.env, capture_output=True, text=True, check=False)
    assert local.returncode != 0, "Slurm must not work here, or nothing proves the SSH path"
    started = time.monotonic()
    check = laptop("check", str(laptop.inventory(steps=60)))
    assert check.returncode == 0, check.stderr
    assert f"every node and login node {LOGIN_ALIAS} see the same files" in _flat(check.stderr)
    up = laptop("up", "--skip-checks", str(laptop.inventory(steps=60)))
    assert up.returncode == 0, up.stderr
    assert "job shapes succeeded at step 60" in _flat(up.stderr + up.stdout)
    print(f"check + two-node job through the login node: {time.monotonic() - started:.1f} s")
    # TensorBoard here, on the chief's event files pulled from the login node.
    pulled = _first_lines(laptop, ["tensorboard", "--port", str(_free_port()), "--refresh", "1"],
                          lambda seen: "TensorBoard for run" in seen)  # fmt: skip
    assert "event file(s) from task0" in pulled and "TensorBoard stopped" in pulled, pulled
    events = laptop.cwd / ".orchestrate" / "tensorboard" / "shapes"
    assert any(p.name.startswith("events.out.tfevents") for p in events.rglob("*")), events

    # Held in Slurm's queue for longer than stall_timeout: no stall, the clock starts later. A
    # stand-in script (no TensorFlow start to wait for), uploaded through the login node.
    stepper = ["  name: stepper", f"  script: {REPO / 'tests' / 'scripts' / 'stepper.py'}",
               '  env: {STEPS: "100000", DELAY: "0.1",',
               '        NOISE: "tick\\n", NOISE_REPEAT: "1"}']  # fmt: skip
    long_run = laptop.inventory(steps=0, stall_timeout=5, job=stepper, sbatch_args=["--hold"])
    detached = laptop("up", "--detach", "--skip-checks", str(long_run))
    assert detached.returncode == 0, detached.stderr
    queued = laptop.status()
    assert queued["scheduler"]["state"] == "PENDING", queued["scheduler"]
    assert queued["scheduler"]["login"] == f"login node {LOGIN_ALIAS}"
    assert [w["state"] for w in queued["workers"]] == ["pending", "pending"]
    assert all(w["queued"] and "queue" in w["reason"] for w in queued["workers"]), queued
    time.sleep(8)  # past stall_timeout, still held
    held = laptop.status()
    assert (held["attempt"], held["restarts"], held["scheduler"]["state"]) == (0, 0, "PENDING")
    laptop.slurm("scontrol", "release", held["scheduler"]["job_id"])

    seen: list[dict[str, Any]] = []

    def running() -> dict[str, Any] | None:
        seen.append(laptop.status(polling=True))
        steps = [w["step"] or 0 for w in seen[-1]["workers"]]
        return seen[-1] if seen[-1]["state"] == "running" and min(steps) > 20 else None

    try:
        status = wait_for(running, 120, "both workers to train on")
    except AssertionError as error:
        raise AssertionError(f"{error}; the last status: {seen[-1:]}") from None
    assert status["restarts"] == 0 and status["attempt"] == 0, status  # the wait was no stall
    assert {w["host"] for w in status["workers"]} == {"n1", "n2"}
    assert status["scheduler"]["state"] == "RUNNING"
    tail = laptop("tail", "-n", "5", timeout=60)
    assert tail.returncode == 0, tail.stderr
    names = {line.split("|")[0].strip() for line in tail.stdout.splitlines() if "|" in line}
    assert names == {"task0", "task1"} and "tick" in tail.stdout, tail.stdout
    followed = _first_lines(laptop, ["tail", "-f", "-n", "1"],
                            lambda out: out.count("task0 |") > 2 and "task1 |" in out)  # fmt: skip
    assert "tick" in followed, followed
    assert run_processes(status["run_id"])
    # A script behind the boot, through the login node: its stacks, and no py-spy from here.
    _both_stacks(laptop, "--native", seen=("stepper.py", "py-spy would have to run on the task"))

    down = laptop("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert laptop.slurm("squeue", "-h", "-j", status["scheduler"]["job_id"]).strip() == ""
    wait_for(lambda: not run_processes(status["run_id"]), 20, "every process of the run to end")
    assert [w["state"] for w in laptop.status()["workers"]] == ["stopped", "stopped"]


def test_an_unreachable_login_node_is_named_exit_3(laptop: Orchestrate) -> None:
    # 10.232.0.99 is on the test cluster's own bridge, and nothing answers there.
    login = {"address": "10.232.0.99", "ssh_connect_timeout": 2, "python": sys.executable}
    inventory = str(laptop.inventory(steps=10, login=login))
    for command in (["check", inventory], ["up", inventory]):
        result = laptop(*command, timeout=60)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "login node 10.232.0.99" in _flat(result.stderr), result.stderr
        assert "Traceback" not in result.stderr


SECRET_NAME = "TRACKER_API_KEY"
# A task that reads its secret, prints it, and (with FAIL) ends with it in its last line: the
# line that becomes the exit record's error, the worker's reason and a restart's reason.
SECRET_TASK = """\
import hashlib, os, sys
secret = os.environ.get("TRACKER_API_KEY", "")
print("secret sha256", hashlib.sha256(secret.encode()).hexdigest(), flush=True)
print("the key is", secret, flush=True)
sys.exit("refused by the tracker: " + secret if os.environ.get("FAIL") else 0)
"""


def _secret_job(where: Orchestrate, **env: str) -> list[str]:
    script = where.cwd / "secret_task.py"
    script.write_text(SECRET_TASK)
    return ["  name: secretive", f"  script: {script}", f"  secret_env: [{SECRET_NAME}]",
            f"  env: {json.dumps(env)}", "  max_restarts: 1"]  # fmt: skip


def _files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*")
            if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]  # fmt: skip


class _Cmdlines(threading.Thread):
    """Every process's command line on the machine (the nodes and the login node share its
    process table), as any user sees them in `ps`, until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[bytes] = set()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        self.seen.add((entry / "cmdline").read_bytes())
                    except OSError:
                        continue
            time.sleep(0.002)

    def stop(self) -> bytes:
        self._done.set()
        self.join(10)
        return b"\n".join(self.seen)


def test_a_printed_secret_is_in_no_slurm_artifact(orchestrate: Orchestrate) -> None:
    """Issue 25: the launcher redacts a secret a script prints, as the host agent does; and a
    workdir with a space stays one --output for sbatch."""
    secret = f"sk-{secrets.token_hex(12)}"
    orchestrate.env[SECRET_NAME] = secret
    workdir = orchestrate.cwd / "shared space"
    inventory = orchestrate.inventory(steps=0, job=_secret_job(orchestrate, FAIL="1"),
                                      workdir=str(workdir))  # fmt: skip
    up = orchestrate("up", "--skip-checks", str(inventory))
    assert up.returncode == 1, up.stdout + up.stderr
    status = orchestrate("status", "--json").stdout
    record = orchestrate.cwd / ".orchestrate" / "runs" / f"{json.loads(status)['run_id']}.json"
    restarts = json.loads(record.read_text())["restarts"]
    assert restarts and restarts[0]["reason"].endswith("[redacted]"), restarts
    attempt = workdir / "secretive" / "runs" / json.loads(status)["run_id"] / "attempt-0"
    assert list(attempt.glob("slurm-*.out")), list(attempt.iterdir())  # --output, one path
    # The first task to fail ends the step (--kill-on-bad-exit): the other may be SIGTERMed
    # before it prints, or before it starts, so what one task wrote is looked for in either.
    logs = [(attempt / t / "worker.log").read_text() for t in ("task0", "task1")
            if (attempt / t / "worker.log").exists()]  # fmt: skip
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert any(f"secret sha256 {digest}" in log and "the key is [redacted]" in log
               for log in logs), logs  # fmt: skip
    errors = [json.loads((attempt / t / "exit.json").read_text())["error"]
              for t in ("task0", "task1") if (attempt / t / "exit.json").exists()]  # fmt: skip
    assert "refused by the tracker: [redacted]" in errors, errors
    assert _files_containing(orchestrate.cwd, secret.encode()) == []
    assert _files_containing(orchestrate.cwd, digest.encode())  # the search finds what is there
    for text in (status, up.stdout, up.stderr):
        assert secret not in text


def test_a_laptop_run_hands_its_secret_to_the_tasks_through_the_login_node(
    laptop: Orchestrate,
) -> None:
    """Issue 25: with slurm.login, secret_env travels on the SSH channel's standard input into
    sbatch's environment there: never a command line, never a file on the login node."""
    secret = f"sk-{secrets.token_hex(12)}"
    laptop.env[SECRET_NAME] = secret
    inventory = laptop.inventory(steps=0, job=_secret_job(laptop))
    sampler = _Cmdlines()
    sampler.start()
    try:
        up = laptop("up", "--skip-checks", str(inventory))
    finally:
        seen = sampler.stop()
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = laptop.status()["run_id"]
    attempt = laptop.cwd / "shared" / "secretive" / "runs" / run_id / "attempt-0"
    digest = hashlib.sha256(secret.encode()).hexdigest()
    for task in ("task0", "task1"):  # each task read the laptop's value
        log = (attempt / task / "worker.log").read_text()
        assert f"secret sha256 {digest}" in log and "the key is [redacted]" in log, log
    assert secret.encode() not in seen  # no command line held it, on any node or the login node
    assert b"def expand_nodelist" in seen  # it did look: the launcher's own command line
    assert _files_containing(laptop.cwd, secret.encode()) == []
    assert _files_containing(laptop.cluster.login_dir, secret.encode()) == []


def by_task(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in status["workers"] if w["name"] == name)


def test_a_parameter_server_job_trains_on_its_roles_and_a_lost_worker_restarts_in_place(
    orchestrate: Orchestrate,
) -> None:
    """A chief, two workers and a ps (`slurm.roles`) of the built-in loop under
    `strategy: parameter-server`, one task per node of one allocation, each with its role's
    TF_CONFIG; worker task1's SIGKILL (the chief held meanwhile, so the kill lands mid-run
    whatever the load) is restarted by its launcher at the same node and port while the same
    chief process trains on to its target in the first attempt.

    Four nodes, not four tasks on two: orchestrate places one task per node on Slurm (each binds
    slurm.port on its node), so the cluster gets two more slurmd (network namespaces, about a
    second each to start) in a partition of their own, and the product runs as it does on a
    real cluster; several tasks per node would need a port per task that it does not have."""
    job = ["  name: shapes", "  task: worker.examples.shapes:task", "  steps: 200",
           "  checkpoint_every: 50", "  batch_size: 16", "  log_every: 10",
           "  strategy: parameter-server"]  # fmt: skip
    roles = {"chief": 1, "worker": 2, "ps": 1}
    path = orchestrate.inventory(steps=200, job=job, nodes=4, partition=ROLES_PARTITION,
                                 roles=roles)  # fmt: skip
    up = orchestrate("up", "--detach", str(path))
    assert up.returncode == 0, up.stderr
    # The chief is held as soon as its own progress file (on the shared file system, no CLI in
    # between) says it trains: a `status` poll can take longer than the rest of the run.
    job_root = orchestrate.cwd / "shared" / "shapes"
    wait_for(lambda: (progress_in(first_run_dir(job_root, "task0")).get("step") or 0) >= 10,
             180, "the chief's step 10", interval=0.05)  # fmt: skip
    (chief,) = suspend_workers([first_run_dir(job_root, "task0")])  # the training waits here
    try:
        status = orchestrate.status(polling=True)
        assert [w["role"] for w in status["workers"]] == ["chief", "worker", "worker", "ps"]
        lost = by_task(status, "task1")["pid"]
        os.kill(lost, signal.SIGKILL)
        wait_for(lambda: by_task(orchestrate.status(polling=True), "task1")["pid"]
                 not in (None, lost), 60, "task1's worker started again")  # fmt: skip
    finally:
        chief.resume()
    final = wait_finished(orchestrate, timeout=240)
    assert (final["state"], final["attempt"], final["restarts"]) == ("succeeded", 0, 0), final
    assert final["restarted_alone"] == ["worker task1 restarted (1 of 6), the chief continued"]
    assert by_task(final, "task0")["step"] == 200
    attempt = orchestrate.cwd / "shared" / "shapes" / "runs" / final["run_id"] / "attempt-0"
    assert int((attempt / "task0" / "worker.pid").read_text()) == chief.pid  # the same chief
    log = (attempt / "task0" / "worker.log").read_text()
    assert "worker: finished at step 200" in log and log.count("worker: first step done") == 1
    (restart,) = json.loads((attempt / "task1" / "restarts.json").read_text())
    assert restart["signal"] == "SIGKILL"
    configs = [json.loads((attempt / f"task{i}" / "tf_config.json").read_text())
               for i in range(4)]  # fmt: skip
    assert [c["task"] for c in configs] == [{"type": "chief", "index": 0},
        {"type": "worker", "index": 0}, {"type": "worker", "index": 1},
        {"type": "ps", "index": 0}]  # fmt: skip
    cluster = configs[0]["cluster"]
    assert all(c["cluster"] == cluster for c in configs) and list(cluster) == [
        "chief", "worker", "ps"]  # fmt: skip
    nodes = [(attempt / f"task{i}" / "node").read_text().strip() for i in range(4)]
    assert len(set(nodes)) == 4 and cluster["worker"][0] == f"{nodes[1]}:20000", (nodes, cluster)
    assert len(final["scheduler"]["jobs"]) == 1  # one allocation throughout


def test_an_exported_parameter_server_script_ends_with_its_chief_under_plain_sbatch(
    orchestrate: Orchestrate,
) -> None:
    """The same roles exported (`export --format sbatch`) and submitted by hand: nothing
    supervises it, yet the batch job ends once the chief reached its target (the ps and workers,
    which only serve, are stopped by their launchers), every task a success to Slurm."""
    job = ["  name: shapes", "  task: worker.examples.shapes:task", "  steps: 30",
           "  batch_size: 16", "  log_every: 10", "  strategy: parameter-server"]  # fmt: skip
    path = orchestrate.inventory(steps=30, job=job, nodes=4, partition=ROLES_PARTITION,
                                 roles={"chief": 1, "worker": 2, "ps": 1})  # fmt: skip
    exported = orchestrate("export", str(path), "--format", "sbatch")
    assert exported.returncode == 0, exported.stderr
    script = orchestrate.cwd / "ps.sbatch"
    script.write_text(exported.stdout)
    submitted = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], cwd=orchestrate.cwd,
                               env=orchestrate.env, capture_output=True, text=True, timeout=180,
                               check=False)  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr  # ended by itself
    job_id = submitted.stdout.strip().split(";")[0]
    attempt = orchestrate.cwd / "shared" / "shapes" / "runs" / f"slurm-{job_id}" / "attempt-0"
    assert json.loads((attempt / "task0" / "exit.json").read_text())["returncode"] == 0
    assert json.loads((attempt / "task0" / "progress.json").read_text())["step"] == 30
    for task in ("task1", "task2", "task3"):
        stop = json.loads((attempt / task / "stop_requested").read_text())
        assert stop["by"] == "after the chief finished", (task, stop)


# --- keras: jax (issue 57): Keras 3 model.fit on the JAX backend, the cluster from the nodes ---
JAX_SCRIPT = REPO / "tests" / "scripts" / "fit_keras3_jax.py"


def _jax_job(epochs: int, **env: object) -> list[str]:
    """The model.fit script of test_keras_jax.py (a BackupAndRestore every 4 steps, 8 steps an
    epoch), as a `keras: jax` job. Its nodes run the jax-only install (tests/jaxonly.py), as a
    JAX user's hosts do: with TensorFlow installed beside JAX, Keras 3 imports TensorFlow in the
    middle of a run, and in one CI run both tasks then aborted in JAX's coordination service
    ("tried to connect with a different incarnation")."""
    values = {"EPOCHS": epochs, "SAVE_EVERY": 4, **env}
    return ["  name: fitjax", f"  script: {json.dumps(str(JAX_SCRIPT))}", "  keras: jax",
            "  max_restarts: 2", f"  env: {json.dumps(values)}"]  # fmt: skip


def _jax_finals(attempt: Path) -> list[dict[str, Any]]:
    return [json.loads((attempt / task / "checksum.json").read_text())
            for task in ("task0", "task1")]  # fmt: skip


def test_keras3_fit_on_jax_trains_two_tasks_and_resumes_after_a_killed_one(
    orchestrate: Orchestrate,
) -> None:
    """Each task's JAX cluster comes from Slurm's node list (the launcher's), JAX's own Slurm
    detection agreeing with it; a SIGKILLed task ends the batch job, the next resumes both from
    their BackupAndRestore, and both end with the same weights."""
    # Both tasks hold after their backup at step 12 (in the second epoch) until the kill: on a
    # busy machine a status through Slurm can take longer than the rest of the run, and a kill
    # after the end would test nothing (one CI run: task0 had finished when it landed).
    release = orchestrate.cwd / "shared" / "release-after-the-kill"
    job = _jax_job(3, STEP_DELAY=0.3, HOLD_FROM_STEP=12, HOLD_UNTIL=str(release))
    inventory = orchestrate.inventory(steps=0, job=job, python=jax_only_python())
    up = orchestrate("up", "--detach", str(inventory))
    assert up.returncode == 0, up.stderr

    def backed_up_in_the_second_epoch() -> dict[str, Any] | None:
        status = orchestrate.status(polling=True)
        points = [w["checkpoint_step"] or 0 for w in status["workers"]]
        return status if status["state"] == "running" and min(points) >= 12 else None

    status = wait_for(backed_up_in_the_second_epoch, 240, "a backup in the second epoch")
    os.kill(status["workers"][1]["pid"], signal.SIGKILL)
    release.touch()
    final = wait_finished(orchestrate, timeout=300)
    assert final["state"] == "succeeded", final
    restarts = json.loads((orchestrate.cwd / ".orchestrate" / "runs" /
                           f"{final['run_id']}.json").read_text())["restarts"]  # fmt: skip
    assert [(r["worker"], r["kind"]) for r in restarts] == [("task1", "killed")], restarts
    runs = orchestrate.cwd / "shared" / "fitjax" / "runs" / final["run_id"]
    assert not (runs / "attempt-0" / "task0" / "checksum.json").exists()
    done = _jax_finals(runs / "attempt-1")
    port = 20000  # the slurm: block's default port, on every node
    assert [d["addresses"] for d in done] == [f"n1:{port},n2:{port}"] * 2, done
    assert [(d["process"], d["tf_config"]) for d in done] == [(0, None), (1, None)]
    assert done[0]["sha256"] == done[1]["sha256"], f"the weights differ: {done}"
    log = (runs / "attempt-1" / "task1" / "worker.log").read_text()
    # Resumed from the backup at step 12, in the epoch it was made in: the second.
    first = re.search(r"Epoch (\d)/3", log)
    assert first is not None and first.group(1) == "2", log[-2000:]


def test_an_exported_keras_jax_script_trains_under_plain_sbatch(orchestrate: Orchestrate) -> None:
    inventory = orchestrate.inventory(steps=0, job=_jax_job(1), python=jax_only_python())
    # First the check: each node's name resolves there to its own address (its NodeAddr),
    # which gloo tells the other task; JAX and Keras 3 on both.
    check = orchestrate("check", "--json", str(inventory))
    assert check.returncode == 0, check.stdout + check.stderr
    found = {(f["host"], f["check"]): f for f in json.loads(check.stdout)}
    for node in ("n1", "n2"):
        assert found[(node, "gloo")]["status"] == "ok", found[(node, "gloo")]
        assert "resolves to 10.232.0." in found[(node, "gloo")]["detail"]
        assert found[(node, "jax")]["status"] == "ok"
    exported = orchestrate("export", str(inventory), "--format", "sbatch")
    assert exported.returncode == 0, exported.stderr
    script = orchestrate.cwd / "fitjax.sbatch"
    script.write_text(exported.stdout)
    submitted = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], cwd=orchestrate.cwd,
                               env=orchestrate.env, capture_output=True, text=True, timeout=240,
                               check=False)  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    attempt = orchestrate.cwd / "shared" / "fitjax" / "runs" / f"slurm-{job}" / "attempt-0"
    for task in ("task0", "task1"):
        assert json.loads((attempt / task / "exit.json").read_text())["returncode"] == 0
    done = _jax_finals(attempt)
    assert [d["process"] for d in done] == [0, 1] and done[0]["addresses"] == "n1:20000,n2:20000"
    assert done[0]["sha256"] == done[1]["sha256"], f"the weights differ: {done}"
