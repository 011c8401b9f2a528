"""job.tracking on real runs (issue 58): a real MLflow tracking server (`mlflow server`, sqlite
backend, on loopback in the test's directory), real local workers, the real CLI.

The tests that use the server are marked `tf`: they share one server (module-scoped, about
30 s to start on a busy machine), so they run in one lane, the TensorFlow one. The W&B tests
run W&B offline (WANDB_MODE=offline, no server): what the controller and the workers wrote is
read back from W&B's own run files (tests/wandbfiles.py)."""

from __future__ import annotations

import contextlib
import functools
import http.client
import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import (
    REPO,
    Cli,
    clean_env,
    detached_supervisors,
    first_run_dir,
    free_ports,
    local_inventory,
    local_tf_inventory,
    progress_in,
    restored_steps,
    suspend_workers,
    wait_for,
)
from tests.integration.test_dashboard_browser import browser  # noqa: F401 - the fixture
from tests.integration.test_dashboard_http import serve
from tests.mlflowserver import server_python
from tests.scripts import STEPPER
from tests.wandbfiles import OfflineRun, offline_run

# A missing MLflow client or W&B is a failure, never a skip: the dev extra installs both (the
# server is tests/mlflowserver.py's), and a skip would hide job.tracking untested.
DEV_EXTRA = "the dev extra installs it: pip install -e '.[dev]'"
if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


def mlflow_client(uri: str) -> MlflowClient:
    # Imported here, not at the top: MLflow's import (about 1 s of CPU) would be paid by every
    # pytest process that collects this module, in each lane, for tests it may not run.
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as missing:
        raise ImportError(f"these tests need MLflow's client ({missing}); {DEV_EXTRA}") from missing
    return MlflowClient(uri)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` with a sqlite store in a temporary directory, on a free loopback port
    (another if something took that one first: the server then exits); its URI once /health
    answers."""
    home = tmp_path_factory.mktemp("mlflow")
    for _ in range(3):
        port = free_ports(1)[0]
        server = _start_server(home, port)
        try:
            health = functools.partial(_health, server, port)
            if wait_for(health, 180, "the MLflow server's /health", interval=0.5) == "up":
                yield f"http://127.0.0.1:{port}"
                return
        finally:
            _stop(server)
    raise AssertionError((home / "server.log").read_text()[-3000:])


def _start_server(home: Path, port: int) -> subprocess.Popen[bytes]:
    with (home / "server.log").open("a") as log:
        return subprocess.Popen(
            [server_python(), "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{home}/mlflow.db",
             "--default-artifact-root", str(home / "artifacts")],
            cwd=home, stdout=log, stderr=subprocess.STDOUT,
            # No background job runners (huey, seven processes): tracking needs none of them.
            env=clean_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
            start_new_session=True,  # its own group: uvicorn's processes go with it
        )  # fmt: skip


def _health(server: subprocess.Popen[bytes], port: int) -> str | None:
    """ "up" once our server answers, "gone" when it exited (its port was taken)."""
    if server.poll() is not None:
        return "gone"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return "up" if answer.status == 200 else None
    except (OSError, http.client.HTTPException):  # not yet, or someone else's listener
        return None


def _stop(server: subprocess.Popen[bytes]) -> None:
    """The server's whole group: it leaves job runners (huey) behind after a SIGTERM."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(15)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


STEPS = 400


def sent_up_to(client: MlflowClient, experiment: str, step: int) -> int | None:
    """`step` once the experiment's run has the loss of every log step up to it."""
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    history = client.get_metric_history(runs[0].info.run_id, "loss") if runs else []
    return step if sorted(m.step for m in history) == list(range(10, step + 1, 10)) else None


def the_one_run(client: MlflowClient, experiment: str) -> Any:
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


@pytest.mark.tf
def test_a_killed_worker_leaves_one_finished_mlflow_run_with_both_attempts(
    cli: Cli, reaper: list[str], mlflow_server: str
) -> None:
    """The bundled example on two local workers, `other` SIGKILLed after the chief's first
    checkpoint: one MLflow run, FINISHED, its loss from both attempts without a step twice,
    the restart (worker, cause, step) and the goodput logged by the controller, the job's
    settings as params; `status` names the run and links to it."""
    experiment = f"shapes-{cli.cwd.name}"
    # Warm restarts, as a task job has them by default: the second attempt's chief is a
    # standby that imported TensorFlow before it was handed the worker's environment.
    local_tf_inventory(cli, steps=STEPS, checkpoint_every=40, log_every=10, restart_backoff=0,
                       warm_restarts=True,
                       tracking={"mlflow": mlflow_server, "experiment": experiment})  # fmt: skip
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    job_root = cli.cwd / "work" / "shapes"
    client = mlflow_client(mlflow_server)
    try:
        first = wait_for(lambda: progress_in(first_run_dir(job_root, "chief")).get(
            "checkpoint_step"), 180, "the first checkpoint", interval=0.05)  # fmt: skip
        # Past it (usually before the next: then the next attempt trains steps again that the
        # run holds already, which must not be logged twice), hold `other`: the chief waits for
        # it in its next collective while its own thread sends what it logged (a failed
        # attempt's survivors are killed at once, queue and all).
        chief_dir = first_run_dir(job_root, "chief")
        wait_for(lambda: progress_in(chief_dir).get("step", 0) > first, 60, "a step past it",
                 interval=0.02)  # fmt: skip
        (other,) = suspend_workers([first_run_dir(job_root, "other")])
        sent = wait_for(lambda: sent_up_to(client, experiment, progress_in(chief_dir)["step"]),
                        120, "the chief's loss in MLflow")  # fmt: skip
        other.kill()
        out, err = up.communicate(timeout=300)
    finally:
        up.kill()
    reaper.append(cli.record()["run_id"])
    assert up.returncode == 0, err
    assert "killed by SIGKILL" in out
    run = the_one_run(client, experiment)
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert f"tracking: MLflow run {run_id}" in out + err
    # The controller's: the restart, the goodput, the verdict, the settings.
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    assert tags["orchestrate.restart.1.worker"] == "other"
    assert "SIGKILL" in tags["orchestrate.restart.1"]
    assert tags["orchestrate.verdict"] == "succeeded"
    assert metrics["orchestrate.restarts"] == 1
    assert 0 < metrics["orchestrate.goodput"] < 1
    assert metrics["orchestrate.goodput.lost_seconds"] >= 0
    assert (
        params["job.steps"] == str(STEPS) and params["orchestrate.run_id"] == cli.record()["run_id"]
    )
    # The chief's loss from both attempts (before and after the restart), no step twice: what
    # the first attempt sent stays, the second logs every step past it to the last.
    history = client.get_metric_history(run_id, "loss")
    steps = sorted(m.step for m in history)
    assert steps == list(range(10, STEPS + 1, 10)), f"a step logged twice, or lost: {steps}"
    restarted_at = cli.record()["restarts"][0]["at"] * 1000
    assert max(m.step for m in history if m.timestamp < restarted_at) == sent
    assert min(m.step for m in history if m.timestamp > restarted_at) == sent + 10
    resumed = restored_steps(cli)
    assert resumed and min(resumed) >= first
    status = cli.status()
    assert status["tracking"]["mlflow_run_id"] == run_id
    assert status["tracking"]["mlflow_link"].endswith(f"/runs/{run_id}")
    assert f"tracking: MLflow run {run_id}" in cli("status").stdout


@pytest.mark.tf
def test_an_up_that_resumes_a_saved_run_resumes_its_tracking_run(
    cli: Cli, reaper: list[str], mlflow_server: str
) -> None:
    """`up`, `down --save` mid-run, `up` again (more steps, other ports) from the saved
    checkpoint: one MLflow run, KILLED by the `down`, RUNNING again during the second `up`,
    FINISHED at its end, with the loss of both ups and no step twice; one W&B run id, which the
    controller wrote into at the first `up` (offline: the settings), at the `down` (stopped) and
    at the second `up`'s end (succeeded). Then `status` and the real dashboard (its page document
    and /status) link to that run."""
    experiment = f"resume-{cli.cwd.name}"
    tracking = {"mlflow": mlflow_server, "experiment": experiment, "wandb": {"project": "p"}}
    local_tf_inventory(cli, steps=100_000, checkpoint_every=1000, log_every=10,
                       tracking=tracking)  # fmt: skip
    cli("up", "--detach", "--skip-checks", "inv.yaml", check=True, env=OFFLINE)
    first = cli.record()
    reaper.append(first["run_id"])
    cli.status_when(lambda s: all((w["step"] or 0) >= 45 for w in s["workers"]), 180)
    down = cli("down", "--save", check=True, timeout=120, env=OFFLINE)
    saved = int(down.stderr.split("saved a checkpoint at step ")[1].split()[0])
    wait_for(lambda: not detached_supervisors(first["run_id"]), 60, "the supervisor's end")
    client = mlflow_client(mlflow_server)
    run_id = the_one_run(client, experiment).info.run_id
    assert client.get_run(run_id).info.status == "KILLED"

    target = (saved // 10 + 4) * 10
    local_tf_inventory(cli, steps=target, checkpoint_every=1000, log_every=10, tracking=tracking)
    up = cli.popen("up", "--skip-checks", "inv.yaml", env=OFFLINE)
    try:
        cli.status_when(lambda s: s["run_id"] != first["run_id"] and s["state"] == "running", 180)
        assert client.get_run(run_id).info.status == "RUNNING"
        out, err = up.communicate(timeout=300)
    finally:
        up.kill()
    second = cli.record()
    reaper.append(second["run_id"])
    assert up.returncode == 0, err
    assert f"tracking: MLflow run {run_id} resumed (run {first['run_id']}" in out + err
    assert restored_steps(cli) == [saved, saved]
    run = the_one_run(client, experiment)
    assert run.info.status == "FINISHED" and run.data.tags["orchestrate.verdict"] == "succeeded"
    assert run.data.tags["orchestrate.run_ids"] == f"{first['run_id']} {second['run_id']}"
    assert run.data.params["orchestrate.run_id"] == first["run_id"]  # the first up's settings
    identities = [r["inventory"]["job"]["tracking"] for r in (first, second)]
    assert identities[0]["mlflow_run_id"] == identities[1]["mlflow_run_id"] == run_id
    assert identities[0]["wandb_run_id"] == identities[1]["wandb_run_id"] is not None
    made, stopped, ended = controllers_runs(cli, identities[0]["wandb_run_id"])
    assert made.config["orchestrate.run_id"] == first["run_id"] and made.exit_code == 0
    assert (stopped.summary["orchestrate.verdict"], stopped.exit_code) == ("stopped", 130)
    assert (ended.summary["orchestrate.verdict"], ended.exit_code) == ("succeeded", 0)
    assert ended.summary["orchestrate.run_id"] == second["run_id"]
    # Both ups' loss, each step once: the first's up to the save, the second's past it.
    history = client.get_metric_history(run_id, "loss")
    steps = sorted(m.step for m in history)
    assert steps == list(range(10, target + 1, 10)), f"a step logged twice, or lost: {steps}"
    resumed_at = second["created_at"] * 1000
    assert max(m.step for m in history if m.timestamp < resumed_at) <= saved
    assert min(m.step for m in history if m.timestamp > resumed_at) > saved
    assert_linked(cli, run_id)


def assert_linked(cli: Cli, run_id: str) -> None:
    """`status`, `status --json` and the real dashboard name the MLflow run and link to it."""
    link_end = f"/runs/{run_id}"
    assert f"tracking: MLflow run {run_id}" in cli("status").stdout
    assert cli.status()["tracking"]["mlflow_link"].endswith(link_end)
    served = serve(cli)
    try:
        current = cli.record()["run_id"]
        document = served.get(f"/api/runs/{current}/dashboard").json()
        assert document["mlflow"].endswith(link_end)
        status = served.get(f"/api/runs/{current}/status").json()
        assert status["tracking"]["mlflow_run_id"] == run_id
        assert status["tracking"]["mlflow_link"] == document["mlflow"]
        page = served.get("/").text
        assert 'id="mlflow"' in page  # the link app.js fills from the document's `mlflow`
    finally:
        served.process.terminate()
        served.process.wait(timeout=15)


@pytest.mark.tf
def test_the_dashboard_page_links_to_the_mlflow_run(
    cli: Cli,
    reaper: list[str],
    mlflow_server: str,
    browser: Any,  # noqa: F811 - the fixture
) -> None:
    """In a real browser, the page of a tracked run shows its `MLflow ↗` link, to the run's
    page on the server; the page of a run without tracking shows none."""
    (cli.cwd / "train.py").write_text(STEPPER.read_text())
    experiment = f"page-{cli.cwd.name}"
    ports = free_ports(2)
    hosts = [f"name: alpha, address: localhost, port: {ports[0]}",
             f"name: beta, address: localhost, port: {ports[1]}"]  # fmt: skip
    job = {"name": "demo", "script": "train.py", "warm_restarts": False,
           "env": {"STEPS": 5, "DELAY": 0.01}}  # fmt: skip
    local_inventory(cli, hosts, {**job, "tracking": {"mlflow": mlflow_server,
                                                     "experiment": experiment}})  # fmt: skip
    cli("up", "--skip-checks", "inv.yaml", check=True, timeout=120)
    tracked = cli.record()["run_id"]
    reaper.append(tracked)
    run = the_one_run(mlflow_client(mlflow_server), experiment).info
    page = f"{mlflow_server}/#/experiments/{run.experiment_id}/runs/{run.run_id}"
    local_inventory(cli, hosts, job)
    cli("up", "--skip-checks", "inv.yaml", check=True, timeout=120)
    reaper.append(cli.record()["run_id"])
    served = serve(cli)
    try:
        browser.get(served.url)  # the token traded for the cookie

        def link(run: str) -> tuple[bool, str | None]:
            # Loaded once, then read until the page's first live update shows the run: a reload
            # per poll restarts the event stream, which a loaded runner may not render in time.
            browser.get(f"{served.base}/runs/{run}")

            def shown() -> tuple[bool, str | None] | None:
                visible, href, title = browser.execute_script(LINK_SCRIPT)
                return (visible, href) if title == run else None

            found: tuple[bool, str | None] = wait_for(shown, 60, f"the page of run {run}")
            return found

        visible, href = link(tracked)
        assert visible and href == page
        assert link(cli.record()["run_id"]) == (False, None)
    finally:
        served.process.terminate()
        served.process.wait(timeout=15)


# The MLflow link as the page shows it (visible, href) once it shows the run it was asked for.
LINK_SCRIPT = """
const link = document.getElementById("mlflow");
const title = document.getElementById("run-title").textContent;
const shown = getComputedStyle(link).display !== "none";
return [shown, link.getAttribute("href"), title.split("run ").pop()];
"""


SCRIPT = textwrap.dedent("""\
    import os, sys
    import mlflow

    attempt = int(os.environ["ORCHESTRATE_RUN_DIR"].split("attempt-")[1].split("/")[0])
    worker = os.environ["ORCHESTRATE_WORKER"]
    with mlflow.start_run() as run:  # MLFLOW_RUN_ID: the run orchestrate made
        mlflow.log_metric(f"hello_{worker}", attempt, step=attempt)
    print("logged into", run.info.run_id, flush=True)
    if worker == "beta" and attempt == 0:
        sys.exit(1)  # one restart: the next attempt joins the same run
    """)


@pytest.mark.tf
def test_a_scripts_own_start_run_joins_the_run_from_every_attempt(
    cli: Cli, reaper: list[str], mlflow_server: str
) -> None:
    (cli.cwd / "train.py").write_text(SCRIPT)
    experiment = f"script-{cli.cwd.name}"
    ports = free_ports(2)
    local_inventory(cli, [f"name: alpha, address: localhost, port: {ports[0]}",
                          f"name: beta, address: localhost, port: {ports[1]}"],
                    {"name": "demo", "script": "train.py", "restart_backoff": 0,
                     "tracking": {"mlflow": mlflow_server, "experiment": experiment}})  # fmt: skip
    done = cli("up", "--skip-checks", "inv.yaml", timeout=240)
    reaper.append(cli.record()["run_id"])
    assert done.returncode == 0, done.stderr
    client = mlflow_client(mlflow_server)
    run = the_one_run(client, experiment)
    assert run.info.status == "FINISHED"
    for worker, attempts in (("alpha", [0, 1]), ("beta", [0, 1])):
        history = client.get_metric_history(run.info.run_id, f"hello_{worker}")
        assert sorted(m.step for m in history) == attempts
    assert run.data.tags["orchestrate.restart.1.worker"] == "beta"


@pytest.mark.tf
def test_a_model_fit_script_with_keras_progress_logs_into_the_run(
    cli: Cli, reaper: list[str], mlflow_server: str
) -> None:
    """keras_progress() (issue 56) logs what it reports from the chief into the run's MLflow
    run, once per step, at the optimizer's step (issue 58)."""
    experiment = f"fit-{cli.cwd.name}"
    ports = free_ports(2)
    local_inventory(cli, [f"name: worker-{i}, address: localhost, port: {p}"
                          for i, p in enumerate(ports)],
                    {"name": "fit", "script": str(REPO / "tests" / "scripts" / "fit_mwms.py"),
                     "keras": "legacy", "env": {"TF_CPP_MIN_LOG_LEVEL": "2"},
                     "tracking": {"mlflow": mlflow_server, "experiment": experiment}})  # fmt: skip
    done = cli("up", "--skip-checks", "inv.yaml", timeout=300)
    reaper.append(cli.record()["run_id"])
    assert done.returncode == 0, done.stderr
    client = mlflow_client(mlflow_server)
    run = the_one_run(client, experiment)
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert len(steps) == len(set(steps)) and 8 in steps and max(steps) == 8, steps
    accuracy = [m.step for m in client.get_metric_history(run.info.run_id, "accuracy")]
    assert len(accuracy) == len(set(accuracy)) and 8 in accuracy, accuracy


@pytest.mark.tf
def test_down_ends_the_mlflow_run_killed(cli: Cli, reaper: list[str], mlflow_server: str) -> None:
    """A detached run stopped by `down`: its MLflow run ends KILLED, its verdict `stopped`."""
    (cli.cwd / "train.py").write_text(STEPPER.read_text())
    experiment = f"down-{cli.cwd.name}"
    ports = free_ports(2)
    local_inventory(cli, [f"name: alpha, address: localhost, port: {ports[0]}",
                          f"name: beta, address: localhost, port: {ports[1]}"],
                    {"name": "demo", "script": "train.py", "warm_restarts": False,
                     "env": {"STEPS": 100_000, "DELAY": 0.05},
                     "tracking": {"mlflow": mlflow_server, "experiment": experiment}})  # fmt: skip
    cli("up", "--detach", "--skip-checks", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    cli.status_when(lambda s: s["state"] == "running", timeout=60)
    client = mlflow_client(mlflow_server)
    assert the_one_run(client, experiment).info.status == "RUNNING"
    cli("down", check=True)  # it waits for its writes to the tracker before it exits
    run = the_one_run(client, experiment)
    assert run.info.status == "KILLED" and run.data.tags["orchestrate.verdict"] == "stopped"


@pytest.mark.tf
def test_a_failed_run_ends_its_mlflow_run_failed_with_the_cause(
    cli: Cli, reaper: list[str], mlflow_server: str
) -> None:
    (cli.cwd / "train.py").write_text(STEPPER.read_text())
    experiment = f"failed-{cli.cwd.name}"
    ports = free_ports(2)
    local_inventory(cli, [f"name: alpha, address: localhost, port: {ports[0]}",
                          f"name: beta, address: localhost, port: {ports[1]}"],
                    {"name": "demo", "script": "train.py", "warm_restarts": False,
                     "permanent_exit_codes": [3],
                     "env": {"STEPS": 40, "DELAY": 0.05, "FAIL_WORKER": "beta",
                             "FAIL_HOW": "permanent"},
                     "tracking": {"mlflow": mlflow_server, "experiment": experiment}})  # fmt: skip
    done = cli("up", "--skip-checks", "inv.yaml", timeout=120)
    reaper.append(cli.record()["run_id"])
    assert done.returncode == 1, done.stderr
    run = the_one_run(mlflow_client(mlflow_server), experiment)
    assert run.info.status == "FAILED"
    assert run.data.tags["orchestrate.verdict"] == "failed"
    assert "exit code 3 is marked permanent" in run.data.tags["orchestrate.root_cause"]
    assert run.data.metrics["orchestrate.goodput.total_seconds"] > 0  # the share: none measured


@pytest.mark.tf
def test_metrics_resumed_from_an_earlier_step_are_not_logged_twice(mlflow_server: str) -> None:
    """The worker's rule (worker/tracking.py) against the real server: a second attempt that
    resumes at step 20 of a run that logged up to 40 logs only 50 and 60."""
    from worker.tracking import MetricLog

    client = mlflow_client(mlflow_server)
    experiment = client.create_experiment(f"dedupe-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    for attempt, steps in ((0, range(10, 41, 10)), (1, range(30, 61, 10))):
        log = MetricLog(mlflow_server, run_id)
        for step in steps:
            log.log(step, {"loss": float(attempt), "val_loss": None})
        log.close()
        assert not log.thread.is_alive()
    history = client.get_metric_history(run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [
        (10, 0.0), (20, 0.0), (30, 0.0), (40, 0.0), (50, 1.0), (60, 1.0)]  # fmt: skip


@pytest.mark.tf
def test_a_resumed_runs_restarts_number_on_after_the_earlier_ones(mlflow_server: str) -> None:
    """The supervisor's tracker against the real server: in a run that resumes one whose two
    restarts are tagged already (restarts_before=2), its first restart is the 3rd; the end's
    count says 3 and ends the run FINISHED."""
    from orchestrator.engine.observe.events import run_event
    from orchestrator.engine.trackers.tracking import Tracker
    from orchestrator.model.inventory import Tracking
    from orchestrator.model.records import Restart

    client = mlflow_client(mlflow_server)
    experiment = client.create_experiment(f"numbering-{time.time_ns()}")
    run_id = client.create_run(experiment).info.run_id
    client.set_tag(run_id, "orchestrate.restart.2", "other at step 57: killed by SIGKILL")
    tracking = Tracking(mlflow=mlflow_server, mlflow_run_id=run_id,
                        mlflow_experiment_id=experiment, restarts_before=2)  # fmt: skip
    said: list[str] = []
    tracker = Tracker(tracking, said.append)
    restart = Restart(at=time.time(), attempt=0, worker="chief", reason="exit code 1", step=80)

    def event(name: str, restarts: int) -> dict[str, Any]:
        return run_event(name, job="demo", run_id="r2", status=None, at=time.time(),
                         event_id=name, restarts=restarts)  # fmt: skip

    tracker.event("restarting-0", event("restarting", 1), restart)
    tracker.event("succeeded", event("succeeded", 1), None)
    tracker.close()
    assert said == []
    run = client.get_run(run_id)
    assert run.data.tags["orchestrate.restart.2"].endswith("killed by SIGKILL")  # kept
    assert run.data.tags["orchestrate.restart.3"] == "chief at step 80: exit code 1"
    assert run.data.tags["orchestrate.restart.3.worker"] == "chief"
    assert run.data.tags["orchestrate.restart_count"] == "3"
    assert run.data.metrics["orchestrate.restarts"] == 3
    assert run.info.status == "FINISHED"


@pytest.mark.tf
def test_a_resumed_run_whose_up_does_not_start_ends_as_it_was(mlflow_server: str) -> None:
    """`up`'s hold on the tracking run (engine/trackers/tracking.held_tracking) against the real
    server: the resumed MLflow run is RUNNING while the start goes on; a start that fails (a check)
    sets it back to how the earlier run ended, its verdict that run's, where a run made for the `up`
    would end KILLED as `not started`."""
    from orchestrator.engine.trackers.tracking import held_tracking
    from orchestrator.engine.trackers.trackresume import Resumed
    from orchestrator.model.inventory import Inventory, Job, Tracking

    client = mlflow_client(mlflow_server)
    experiment = client.create_experiment(f"held-{time.time_ns()}")
    run_id = client.create_run(experiment, tags={"orchestrate.run_id": "r1"}).info.run_id
    client.set_tag(run_id, "orchestrate.verdict", "failed")
    client.set_terminated(run_id, status="FAILED")
    tracking = Tracking(mlflow=mlflow_server, mlflow_run_id=run_id,
                        mlflow_experiment_id=experiment)  # fmt: skip
    job = Job(name="demo", script="train.py", tracking=tracking)
    inventory = Inventory(path="inv.yaml", base_dir=".", hosts=(), job=job)
    said: list[str] = []
    with pytest.raises(RuntimeError), held_tracking(
        inventory, "r2", said.append, Resumed(tracking, "r1", "ckpt-40")
    ) as opened:  # fmt: skip
        assert opened.job.tracking == tracking
        assert client.get_run(run_id).info.status == "RUNNING"
        raise RuntimeError("a check failed")
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["orchestrate.verdict"] == "failed"
    assert run.data.tags["orchestrate.run_ids"] == "r1 r2"
    assert any(f"MLflow run {run_id} resumed (run r1" in line for line in said), said


def test_an_unreachable_tracker_is_a_warning_and_the_run_trains(
    cli: Cli, reaper: list[str]
) -> None:
    """Nothing listens at the MLflow URI: `check` warns and passes, `up` warns and the run
    succeeds; its workers get the experiment's name only."""
    (cli.cwd / "train.py").write_text(STEPPER.read_text())
    nowhere = f"http://127.0.0.1:{free_ports(1)[0]}"
    ports = free_ports(2)
    local_inventory(cli, [f"name: alpha, address: localhost, port: {ports[0]}",
                          f"name: beta, address: localhost, port: {ports[1]}"],
                    {"name": "demo", "script": "train.py", "warm_restarts": False,
                     "env": {"STEPS": 5, "DELAY": 0.01},
                     "tracking": {"mlflow": nowhere}})  # fmt: skip
    checked = cli("check", "inv.yaml")
    assert checked.returncode == 0, checked.stderr
    assert "tracking" in checked.stderr and nowhere in checked.stderr
    done = cli("up", "--skip-checks", "inv.yaml", timeout=120)
    reaper.append(cli.record()["run_id"])
    assert done.returncode == 0, done.stderr
    assert "warning: tracking: no MLflow run" in done.stdout + done.stderr
    assert cli.record()["inventory"]["job"]["tracking"]["mlflow_run_id"] is None


# A worker's own W&B: wandb.init() (orchestrate's WANDB_RUN_ID, WANDB_RESUME, WANDB_PROJECT)
# and one value; then STEPS steps of DELAY s, reported with worker.report() (so the goodput
# is measured) and a "checkpoint" every 5 steps, which the next attempt resumes from.
WANDB_SCRIPT = textwrap.dedent("""\
    import os, time
    import wandb
    from worker import report

    attempt = int(os.environ["ORCHESTRATE_RUN_DIR"].split("attempt-")[1].split("/")[0])
    worker = os.environ["ORCHESTRATE_WORKER"]
    # A directory per worker and attempt: W&B names an offline run by the second it began.
    os.environ["WANDB_DIR"] = os.path.join(os.environ["WANDB_DIR"], f"{worker}-{attempt}")
    os.makedirs(os.environ["WANDB_DIR"])
    run = wandb.init()
    run.log({f"attempt_{worker}": attempt})
    run.finish()
    checkpoint = os.path.join(os.environ["ORCHESTRATE_CHECKPOINT_DIR"], worker)
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
    start = int(open(checkpoint).read()) if os.path.exists(checkpoint) else 0
    steps = int(os.environ["STEPS"])
    report(step=start, start_step=start, target_steps=steps)
    for step in range(start + 1, steps + 1):
        time.sleep(float(os.environ["DELAY"]))
        if worker == os.environ.get("FAIL_WORKER") and step == 7:
            raise SystemExit(3)
        if step % 5 == 0:
            with open(checkpoint, "w") as f:
                f.write(str(step))
        report(step=step, checkpoint_step=step - step % 5)
    """)
# W&B offline: the controller's writes go to the state directory (.orchestrate/wandb/).
OFFLINE = {"WANDB_MODE": "offline"}


def wandb_job(runs: Path, steps: int, **extra: Any) -> dict[str, Any]:
    """A job of WANDB_SCRIPT, offline, its workers' W&B runs under `runs`."""
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(runs), "WANDB_SILENT": "true",
           "STEPS": steps, "DELAY": 0.1, **extra.pop("env", {})}  # fmt: skip
    return {"name": "demo", "script": "train.py", "restart_backoff": 0, "warm_restarts": False,
            "env": env, "tracking": {"wandb": {"project": "vision", "entity": "lab"}},
            **extra}  # fmt: skip


def wandb_cli(cli: Cli, steps: int, **extra: Any) -> Path:
    """train.py and inv.yaml (two local workers, alpha and beta) in cli's directory; where the
    workers' W&B runs go."""
    if importlib.util.find_spec("wandb") is None:
        pytest.fail(f"this test runs wandb.init(): {DEV_EXTRA}", pytrace=False)
    (cli.cwd / "train.py").write_text(WANDB_SCRIPT)
    runs = cli.cwd / "wandb-runs"
    runs.mkdir()
    ports = free_ports(2)
    local_inventory(cli, [f"name: alpha, address: localhost, port: {ports[0]}",
                          f"name: beta, address: localhost, port: {ports[1]}"],
                    wandb_job(runs, steps, **extra))  # fmt: skip
    return runs


def controllers_runs(cli: Cli, run_id: str) -> list[OfflineRun]:
    """The controller's offline W&B sessions of run `run_id`, in the order they began."""
    found = sorted((cli.cwd / ".orchestrate" / "wandb").glob(f"offline-run-*-{run_id}"))
    return [offline_run(path) for path in found]


def test_wandb_run_has_the_settings_restarts_goodput_and_verdict(
    cli: Cli, reaper: list[str]
) -> None:
    """W&B in offline mode, `beta` SIGKILLed after its first checkpoint: both workers of both
    attempts wrote under the one id orchestrate picked, and the controller wrote into that
    run, as W&B's own run files say: at `up` the job's settings as its config, at the end the
    restart (cause, worker, step), the goodput and the verdict, and exit code 0 (finished)."""
    runs = wandb_cli(cli, steps=60)
    up = cli.popen("up", "--skip-checks", "inv.yaml", env=OFFLINE)
    job_root = cli.cwd / "work" / "demo"
    try:
        beta = wait_for(lambda: (d := first_run_dir(job_root, "beta")) and progress_in(d).get(
            "checkpoint_step") and d, 120, "beta's first checkpoint", interval=0.05)  # fmt: skip
        os.kill(int((beta / "worker.pid").read_text()), signal.SIGKILL)
        out, err = up.communicate(timeout=240)
    finally:
        up.kill()
    record = cli.record()
    reaper.append(record["run_id"])
    assert up.returncode == 0, err
    run_id = record["inventory"]["job"]["tracking"]["wandb_run_id"]
    assert run_id and len(run_id) == 8
    assert f"tracking: W&B run {run_id} in lab/vision" in out + err
    assert "wandb:" not in out + err  # W&B's own console output stays in its writer
    workers = sorted(runs.glob("*/wandb/offline-run-*"))
    assert [path.parents[1].name for path in workers] == ["alpha-0", "alpha-1", "beta-0", "beta-1"]
    assert {offline_run(path).run_id for path in workers} == {run_id}
    start, end = controllers_runs(cli, run_id)
    assert (start.run_id, start.project, start.entity) == (run_id, "vision", "lab")
    assert start.name == f"demo-{record['run_id']}" and start.exit_code == 0
    assert start.config["job.script"] == str(cli.cwd / "train.py") and start.config["workers"] == 2
    assert start.config["orchestrate.run_id"] == record["run_id"]
    assert not any(key.startswith(("job.env", "job.tracking")) for key in start.config)
    (restart,) = record["restarts"]
    assert end.run_id == run_id and end.exit_code == 0
    summary = end.summary
    assert summary["orchestrate.verdict"] == "succeeded"
    assert summary["orchestrate.restart_count"] == 1
    assert summary["orchestrate.restart.1"] == f"beta at step {restart['step']}: killed by SIGKILL"
    assert summary["orchestrate.restart.1.worker"] == "beta"
    assert summary["orchestrate.restart.1.step"] == restart["step"] >= 5
    assert summary["orchestrate.restart.1.kind"] == restart["kind"]
    assert 0 < summary["orchestrate.goodput"] < 1
    assert summary["orchestrate.goodput.total_seconds"] > 0
    assert summary["orchestrate.goodput.productive_seconds"] > 0
    assert f"W&B run {run_id} in lab/vision" in cli("status").stdout


def test_wandb_run_of_a_run_stopped_by_down_ends_failed_saying_stopped(
    cli: Cli, reaper: list[str]
) -> None:
    """A detached run stopped by `down`: `down` writes the end into the W&B run, after the
    workers stopped: verdict `stopped`, the goodput, exit code 130 (W&B can end a run only
    finished or failed, and this one did not finish)."""
    wandb_cli(cli, steps=100_000)
    cli("up", "--detach", "--skip-checks", "inv.yaml", check=True, env=OFFLINE)
    record = cli.record()
    reaper.append(record["run_id"])
    cli.status_when(lambda s: s["state"] == "running", timeout=120)
    down = cli("down", check=True, env=OFFLINE)
    run_id = record["inventory"]["job"]["tracking"]["wandb_run_id"]
    start, end = controllers_runs(cli, run_id)
    assert start.exit_code == 0 and start.config["job.max_restarts"] == 3
    assert end.summary["orchestrate.verdict"] == "stopped"
    assert end.summary["orchestrate.root_cause"] == "stopped by 'orchestrate down'"
    assert end.summary["orchestrate.goodput.total_seconds"] > 0
    assert end.exit_code == 130
    assert "wandb:" not in down.stdout + down.stderr


def test_wandb_run_of_a_failed_run_ends_failed_with_the_cause(cli: Cli, reaper: list[str]) -> None:
    wandb_cli(cli, steps=40, permanent_exit_codes=[3],
              env={"FAIL_WORKER": "beta"})  # fmt: skip
    done = cli("up", "--skip-checks", "inv.yaml", timeout=180, env=OFFLINE)
    record = cli.record()
    reaper.append(record["run_id"])
    assert done.returncode == 1, done.stderr
    _, end = controllers_runs(cli, record["inventory"]["job"]["tracking"]["wandb_run_id"])
    assert end.exit_code == 1 and end.summary["orchestrate.verdict"] == "failed"
    assert "exit code 3 is marked permanent" in end.summary["orchestrate.root_cause"]


def test_a_wandb_the_controller_cannot_use_is_a_warning_and_the_run_trains(
    cli: Cli, reaper: list[str]
) -> None:
    """No W&B login on this machine (no WANDB_API_KEY, no ~/.netrc): `up` says the settings
    were not written and trains; the end's write fails too, said in its output, and the run
    still succeeds, its workers given the run's id."""
    (cli.cwd / "train.py").write_text(STEPPER.read_text())
    ports = free_ports(2)
    local_inventory(cli, [f"name: alpha, address: localhost, port: {ports[0]}",
                          f"name: beta, address: localhost, port: {ports[1]}"],
                    {"name": "demo", "script": "train.py", "warm_restarts": False,
                     "env": {"STEPS": 5, "DELAY": 0.01},
                     "tracking": {"wandb": {"project": "vision"}}})  # fmt: skip
    nowhere = {"HOME": str(cli.cwd), "WANDB_API_KEY": "", "WANDB_MODE": "online",
               "WANDB_BASE_URL": f"http://127.0.0.1:{free_ports(1)[0]}"}  # fmt: skip
    done = cli("up", "--skip-checks", "inv.yaml", timeout=240, env=nowhere)
    record = cli.record()
    reaper.append(record["run_id"])
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    run_id = record["inventory"]["job"]["tracking"]["wandb_run_id"]
    assert f"warning: tracking: W&B run {run_id} in vision: the job's settings were not " in said
    assert "No API key configured" in said
    assert f"tracking: W&B run {run_id}: " in said  # the end's write, said once
    assert "Traceback" not in said


def test_a_wandb_run_whose_up_does_not_start_ends_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up`'s hold on the tracking run (held_tracking) with W&B offline: the run made with the
    job's settings; a start that then fails (a check) ends it failed, verdict `not started`."""
    from orchestrator.engine.trackers.tracking import held_tracking
    from orchestrator.model.inventory import Inventory, Job, Tracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    job = Job(name="demo", script="train.py", tracking=Tracking(wandb_project="p"))
    inventory = Inventory(path="inv.yaml", base_dir=".", hosts=(), job=job)
    said: list[str] = []
    with pytest.raises(RuntimeError), held_tracking(
        inventory, "r1", said.append, None, tmp_path
    ) as opened:  # fmt: skip
        assert opened.job.tracking is not None
        run_id = opened.job.tracking.wandb_run_id
        raise RuntimeError("a check failed")
    assert said == [f"tracking: W&B run {run_id} in p"]
    found = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    made, ended = (offline_run(path) for path in found)
    assert made.config["job.script"] == "train.py" and made.exit_code == 0
    assert (ended.summary["orchestrate.verdict"], ended.exit_code) == ("not started", 1)


def test_a_wandb_write_that_fails_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real writer child and the real wandb (the suite's venv has it; the unprivileged unit
    run's has not): what W&B refused is one TrackingError line."""
    from orchestrator.engine.trackers import wandbrun
    from orchestrator.engine.trackers.base import TrackingError
    from orchestrator.model.inventory import Inventory, Job, Tracking, WorkerSlot

    tracking = Tracking(wandb_project="vision", wandb_run_id="ab12cd34")
    job = Job(name="demo", task="m:f", steps=4, tracking=tracking)
    inventory = Inventory(path="inv.yaml", base_dir=".", job=job,
                          hosts=(WorkerSlot("alpha", "localhost", 1),))  # fmt: skip
    monkeypatch.setenv("WANDB_MODE", "sideways")
    with pytest.raises(TrackingError, match="sideways"):
        wandbrun.write(wandbrun.start_plan(tracking, inventory, "r1"), tmp_path)
