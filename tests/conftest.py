"""Shared fixtures: run the real CLI as a subprocess, in a scratch directory, as a user would."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import phase_log
from tests.cluster.pytest_support import SharedCluster
from tests.lanecpu import LaneCpu

REPO = Path(__file__).resolve().parents[1]

# A launcher that ignores SIGINT (a background job of a non-interactive shell) would pass that on
# to every `orchestrate` these tests start, and Ctrl-C (SIGINT), the way `tail -f` and
# `tensorboard` are stopped, would do nothing. A handler, unlike SIG_IGN, is not inherited.
signal.signal(signal.SIGINT, signal.default_int_handler)
# A run's standbys stay job.linger (default 300 s, ~560 MiB per slot) after it ended: in the
# tests none stay unless an inventory sets `linger:` (tests/integration/test_linger.py), so
# that a test's run leaves no process behind and the suite's memory stays flat.
os.environ.setdefault("ORCHESTRATE_LINGER", "0")
# Nor does a run start standbys (about one TensorFlow import per worker slot, wasted unless the
# test restarts): the tests about warm restarts set `warm_restarts: true` in their inventory.
os.environ.setdefault("ORCHESTRATE_WARM_RESTARTS", "0")
PROXY_VARIABLES = ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY")


def clean_env(**extra: str) -> dict[str, str]:
    # Proxy variables break worker-to-worker gRPC; TF's C++ log noise hides what matters.
    # ORCHESTRATE_WIDTH sets the CLI's width (cli/app.py): a test that wants one says so.
    dropped = (*PROXY_VARIABLES, "ORCHESTRATE_WIDTH")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}, **extra)
    return env


@dataclass
class Cli:
    """`orchestrate` run as a separate process in its own directory with its own state dir."""

    cwd: Path

    def __call__(
        self,
        *args: str,
        timeout: float = 180,
        check: bool = False,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=self.cwd,
            env={**clean_env(), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"orchestrate {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=self.cwd, env={**clean_env(), **(env or {})}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def status(self) -> dict[str, Any]:
        return json.loads(self("status", "--json", check=True).stdout)

    def status_when(self, predicate: Callable[[dict[str, Any]], object], timeout: float) -> Any:
        """Poll `status --json` (the run may not be recorded yet) until predicate holds."""

        def poll() -> dict[str, Any] | None:
            result = self("status", "--json")
            if result.returncode != 0:
                return None
            status = json.loads(result.stdout)
            return status if predicate(status) else None

        return wait_for(poll, timeout=timeout, interval=0.1)

    def record(self) -> dict[str, Any]:
        state = self.cwd / ".orchestrate"
        run_id = (state / "current").read_text().strip()
        return json.loads((state / "runs" / f"{run_id}.json").read_text())


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture(scope="session")
def namespace_hosts() -> Iterator[SharedCluster]:
    """The session's namespace cluster (tests/cluster/pytest_support.py), shared by the modules
    of the netns lane: each takes the hosts it needs with `.hosts(count)`, reset between them."""
    # Not pytest's 0700 temporary directory: a second user's login reads authorized_keys here.
    base = Path(tempfile.mkdtemp(prefix="orch-cluster-", dir="/tmp"))
    base.chmod(0o755)
    shared = SharedCluster(base)
    try:
        yield shared
    finally:
        shared.stop()
        shutil.rmtree(base, ignore_errors=True)


def worker_env(run_dir: Path, tf_config: str | None = None, **extra: str) -> dict[str, str]:
    """The environment orchestrate gives a worker, for tests that start `python -m worker`."""
    env = {
        key: value
        for key, value in os.environ.items()
        # Proxy variables make gRPC route worker-to-worker traffic through the proxy.
        if key.lower() not in {"http_proxy", "https_proxy", "grpc_proxy", "all_proxy", "tf_config"}
        and not key.startswith("ORCHESTRATE_")
    }
    env.update(TF_CPP_MIN_LOG_LEVEL="2", ORCHESTRATE_RUN_DIR=str(run_dir))
    env["ORCHESTRATE_PROGRESS_FILE"] = str(run_dir / "progress.json")
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    env.update(extra)
    return env


# Ports for the tests' own workers and servers: below the kernel's ephemeral range (32768 and up
# here), where no outgoing connection of a test beside this one can take a port between its
# check and the worker's bind (a TensorFlow worker then fails "Could not start gRPC server"),
# and in a band of their own per xdist worker (scripts/test.sh runs four; room for five), so two
# lanes never hand out the same one; the last band is a pytest's outside xdist (the unprivileged
# unit run).
PORT_BASE, PORT_BAND, PORT_BANDS = 22000, 1600, 6


@functools.cache  # one cycle per process: a port is handed out again only after the band
def _port_cycle() -> Iterator[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...; unset: not in a lane
    index = int(worker[2:]) if worker[2:].isdigit() else PORT_BANDS - 1
    start = PORT_BASE + (index % PORT_BANDS) * PORT_BAND
    return itertools.cycle(range(start, start + PORT_BAND))


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))  # as a TensorFlow worker binds it
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that nothing on this machine listens on now (see PORT_BASE)."""
    ports = _port_cycle()
    found: list[int] = []
    for _ in range(PORT_BAND):
        port = next(ports)
        if _bindable(port):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"fewer than {count} free ports in this worker's band of {PORT_BAND}")


def local_inventory(cli: Cli, hosts: list[str], job: dict[str, Any]) -> Path:
    """inv.yaml in cli's directory: `connection: local` hosts (flow-mapping lines without the
    dash) under ./work, and the job block."""
    path = cli.cwd / "inv.yaml"
    path.write_text(
        "defaults: {connection: local, workdir: ./work}\nhosts:\n"
        + "".join(f"  - {{{host}}}\n" for host in hosts)
        + f"job: {json.dumps(job)}\n"
    )
    return path


def stepping_script(steps: int) -> str:
    """A script that reports steps 1..`steps` to its progress file, one every 0.1 s."""
    return (
        "import json, os, time\n"
        'progress = os.environ["ORCHESTRATE_PROGRESS_FILE"]\n'
        f"for step in range(1, {steps + 1}):\n"
        '    with open(progress + ".tmp", "w") as f:\n'
        f'        json.dump({{"step": step, "target_steps": {steps}}}, f)\n'
        '    os.replace(progress + ".tmp", progress)\n'
        "    time.sleep(0.1)\n"
    )


def first_run_dir(job_root: Path, name: str, attempt: int = 0) -> Path | None:
    """The run directory of worker `name` in `attempt` of the job's first run, if it exists yet."""
    found = sorted(job_root.glob(f"runs/*/attempt-{attempt}/{name}"))
    return found[0] if found else None


def progress_in(run_dir: Path | None) -> dict[str, Any]:
    """A worker's progress file, read directly (no CLI in between: a `status` poll can take
    seconds on a busy machine, longer than a fast run has left); {} before it is written, or when
    caught mid-write."""
    try:
        return json.loads((run_dir / "progress.json").read_text()) if run_dir else {}
    except (OSError, ValueError):
        return {}


def snapshot_when(
    cli: Cli, predicate: Callable[[dict[str, Any]], object], timeout: float
) -> dict[str, Any]:
    """The status in the supervisor's snapshot of the current run (`{run_id}.status.json`,
    rewritten at each of its polls) once `predicate` holds for it: what the supervisor itself
    has seen, read without a CLI in between."""
    state = cli.cwd / ".orchestrate"

    def seen() -> dict[str, Any] | None:
        try:
            run_id = (state / "current").read_text().strip()
            status = json.loads((state / "runs" / f"{run_id}.status.json").read_text())["status"]
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not written yet, or caught mid-replace
        return status if predicate(status) else None

    found: dict[str, Any] = wait_for(seen, timeout=timeout, what="the supervisor's snapshot",
                                     interval=0.05)  # fmt: skip
    return found


def suspend_workers(run_dirs: list[Path | None]) -> list[psutil.Process]:
    """Suspend the worker of each run directory (its worker.pid); the caller resumes them."""
    workers = []
    for run_dir in run_dirs:
        assert run_dir is not None
        worker = psutil.Process(int((run_dir / "worker.pid").read_text()))
        worker.suspend()
        workers.append(worker)
    return workers


# The job keys of the paced shapes task (tests/tasks/paced.py): for a run that must still be
# training when the test acts, without training flat out while the test reads it.
PACED = {"task": "tests.tasks.paced:task",
         "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}}  # fmt: skip


def local_tf_inventory(cli: Cli, **job: Any) -> Path:
    """Two local workers, chief and other, training the bundled example; `job` overrides keys."""
    ports = free_ports(2)
    settings = {
        "name": "shapes",
        "task": "worker.examples.shapes:task",
        "checkpoint_every": 20,
        "log_every": 10,
        "env": {"TF_CPP_MIN_LOG_LEVEL": "2"},
        **job,
    }
    hosts = [f"name: {name}, address: localhost, port: {port}"
             for name, port in zip(("chief", "other"), ports, strict=True)]  # fmt: skip
    return local_inventory(cli, hosts, settings)


def val_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """val_loss and val_accuracy from the event files in `directory`, read by TensorBoard's own
    reader (TF2 writes scalars as tensors: the plugin-aware accumulator sees them)."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea

    accumulator = pea.EventAccumulator(str(directory), size_guidance={pea.TENSORS: 0})
    accumulator.Reload()
    return {
        tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]
        for tag in ("val_loss", "val_accuracy")
    }


def restored_steps(cli: Cli) -> list[int]:
    """The steps the current attempt's workers logged restoring, from their logs."""
    logs = cli("tail", "-n", "400", check=True).stdout
    return [
        int(line.split("restored checkpoint at step ")[1].split()[0])
        for line in logs.splitlines()
        if "restored checkpoint at step" in line
    ]


def run_processes(run_id: str) -> list[psutil.Process]:
    """Every live process on this machine started for the run (found by its environment)."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if (
                process.environ().get("ORCHESTRATE_RUN_ID") == run_id
                and process.status() != "zombie"
            ):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str = "condition", interval: float = 0.2
) -> Any:
    """Poll until `predicate` returns something truthy, and return it.

    A slow predicate is not run back to back: the pause after it is as long as it took, up to
    a second. An `orchestrate status` poll takes about 0.3 s of CPU and, on the busy machine of
    the lanes, a second or more of wall time; run back to back, one waiting test kept most of a
    core busy asking. (To act at a point of a fast run, read the run's own files instead:
    `progress_in`.)"""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        asked = time.monotonic()
        value = predicate()
        if value:
            return value
        time.sleep(max(interval, min(time.monotonic() - asked, 1.0)))
    raise AssertionError(f"{what} not met within {timeout} s")


@contextlib.contextmanager
def busy_cpus(loops: int | None = None) -> Iterator[None]:
    """The machine busy as a user's workstation is: `loops` busy loops (default one per CPU) at
    the test's own priority beside what the test does, ended when the block ends."""
    count = loops or os.cpu_count() or 2
    started = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in started:
            loop.kill()
            loop.wait()


def detached_supervisors(run_id: str) -> list[psutil.Process]:
    """The `orchestrate supervise RUN_ID` process of the run (`up --detach`), if it is alive."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if "supervise" in command and run_id in command:
            found.append(process)
    return found


@pytest.fixture
def reaper() -> Iterator[list[str]]:
    """Run ids registered here have every leftover process killed after the test, pass or fail."""
    run_ids: list[str] = []
    yield run_ids
    for run_id in run_ids:
        # The detached supervisor first (it carries no run variable): killed after the workers,
        # it would restart them, and that new attempt would outlive the test.
        for process in detached_supervisors(run_id):
            with contextlib.suppress(psutil.Error):
                process.kill()
        for process in run_processes(run_id):
            with contextlib.suppress(psutil.Error):
                process.kill()


def serve_tensorboard(cli: Cli, port: int) -> dict[str, Any]:
    """Run `orchestrate tensorboard`, fetch its scalar and image tags over HTTP, stop it with
    Ctrl-C (SIGINT) and check it exits cleanly."""
    import signal
    import urllib.request

    server = cli.popen("tensorboard", "--port", str(port), "--refresh", "1")

    def fetch(plugin: str) -> dict[str, Any] | None:
        url = f"http://127.0.0.1:{port}/data/plugin/{plugin}/tags"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                tags = json.loads(answer.read())
        except OSError:
            return None
        return tags if tags.get(".") else None

    try:
        scalars = wait_for(lambda: fetch("scalars"), timeout=60, interval=0.5)
        images = fetch("images")
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert "TensorBoard stopped" in err and f"http://127.0.0.1:{port}/" in out
    return {"scalars": scalars["."], "images": (images or {}).get(".", {}), "stdout": out}


def dashboard_view(
    cwd: Path,
    ready: Callable[[dict[str, Any]], bool],
    env: dict[str, str] | None = None,
    timeout: float = 60,
    log_workers: frozenset[str] = frozenset(),
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `orchestrate dashboard` in `cwd` on its current run and read its document over HTTP
    (with the token it printed) until `ready(document)`, and its followed log lines (once they
    hold a line of each of `log_workers`: the hosts' logs arrive one by one); then stop it with
    Ctrl-C (SIGINT)."""
    import re
    from urllib.parse import parse_qs, urlsplit

    import httpx

    server = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "dashboard", "--port", "0"], cwd=cwd,
        env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        found = re.search(r"dashboard: (http\S+)", line)
        assert found, line
        url = urlsplit(found.group(1))
        token = parse_qs(url.query).get("token", [None])[0]  # sent as scripts send it
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        run_id = (cwd / ".orchestrate" / "current").read_text().strip()
        with httpx.Client(base_url=f"{url.scheme}://{url.netloc}", headers=headers,
                          timeout=30) as client:  # fmt: skip
            document = wait_for(
                lambda: (
                    (d := client.get(f"/api/runs/{run_id}/dashboard").json()) and ready(d) and d
                ),
                timeout=timeout,
                interval=0.5,
            )
            lines = wait_for(
                lambda: (
                    (got := client.get(f"/api/runs/{run_id}/logs").json()["lines"])
                    and log_workers <= {line["worker"] for line in got}
                    and got
                ),
                timeout=timeout,
                interval=0.5,
            )
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=30)
    return document, lines


# Lanes for pytest-xdist's `--dist loadgroup` (scripts/test.sh): the tests of one lane run one
# after another in one xdist worker, beside the other lanes. A cluster exists once per machine
# (one subnet each), so each kind's tests share a lane and its session-scoped cluster (Slurm and
# Docker, a session fixture each, share one: together they last about as long as the others);
# local TensorFlow runs are CPU-bound, so they take turns in two lanes instead of crowding the
# two cores; everything else (plain tests, unit tests) fills in wherever a worker is free.
# First matching marker wins: a Slurm test that trains is in the clusters lane.
LANES = {"slurm": "clusters", "docker": "clusters", "netns": "netns", "tf": "tf"}
# The modules of the second TensorFlow lane: about half of the lanes' time, as measured in CI
# (docs/development.md has the table). Any split is correct; this one is balanced.
SECOND_TF_LANE = frozenset({
    "test_stacks", "test_faults_checkpoints", "test_supervision", "test_evaluator_watch",
    "test_linger", "test_worker_training", "test_worker_tensorboard_devices", "test_quick_start",
    "test_warm_restarts", "test_tracking",
})  # fmt: skip


def lane_of(item: pytest.Item) -> str | None:
    marker = next((m for m in LANES if item.get_closest_marker(m)), None)
    if marker is None:
        return None
    if LANES[marker] == "tf" and item.path.stem in SECOND_TF_LANE:
        return "tf2"
    return LANES[marker]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/unit is marked `unit` (CI runs most of them unprivileged, once:
    scripts/unit-tests-unprivileged.sh), and every test gets its lane (LANES).

    `root` tests make files owned by another account (chown): as a developer without root
    they are skipped and say why; CI runs them as root, and its unprivileged run deselects
    them."""
    unit_dir = REPO / "tests" / "unit"
    for item in items:
        if unit_dir in item.path.parents:
            item.add_marker(pytest.mark.unit)
        lane = lane_of(item)
        if lane is not None:
            item.add_marker(pytest.mark.xdist_group(lane))
    if os.geteuid() != 0:
        needs_root = pytest.mark.skip(reason="needs root: chowns files to another account")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(needs_root)


@pytest.hookimpl(trylast=True)  # after xdist named each test's group
def pytest_collection_finish(session: pytest.Session) -> None:
    """Lanes that silently mixed would run two clusters on one subnet at once: refuse instead."""
    if os.environ.get("PYTEST_XDIST_WORKER") and session.config.getvalue("loadgroup"):
        unnamed = [item.nodeid for item in session.items
                   if lane_of(item) and "@" not in item.nodeid]  # fmt: skip
        if unnamed:
            raise pytest.UsageError(
                f"pytest-xdist gave {unnamed[0]} no group: this pytest and pytest-xdist do not "
                "work together; install the versions pyproject.toml pins"
            )


LANE_CPU = LaneCpu()


def pytest_sessionstart(session: pytest.Session) -> None:
    """While scripts/test.sh keeps a phase log, each pytest process that runs tests (not
    xdist's controller) counts its tests' CPU in a cgroup of its own (tests/lanecpu.py)."""
    controller = session.config.getoption("numprocesses", None) and not os.environ.get(
        "PYTEST_XDIST_WORKER"
    )
    if os.environ.get(phase_log.PHASE_LOG_VARIABLE) and not controller:
        LANE_CPU.join(os.environ.get("PYTEST_XDIST_WORKER", "main"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    LANE_CPU.leave()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Each test's time in its lane, and its CPU where counted, for the phase table at the end
    of scripts/test.sh."""
    start, cpu_before = time.time(), LANE_CPU.used()
    try:
        return (yield)
    finally:
        lane = "quiet" if item.get_closest_marker("quiet") else lane_of(item) or "-"
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        cpu_after = LANE_CPU.used()
        cpu = {} if cpu_before is None or cpu_after is None else {"cpu": cpu_after - cpu_before}
        phase_log.record("test", lane, start, time.time(), test=item.nodeid, worker=worker, **cpu)
