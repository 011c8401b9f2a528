"""`dashboard`, and starting one for `up --dashboard`."""

from __future__ import annotations

import getpass
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import click

from orchestrator.cli.app import Context, cli, errors, pass_context, run_option
from orchestrator.contract import install_hint
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.workers.plan import RUN_ID_PATTERN
from orchestrator.errors import MissingTool, RunStateError

DEFAULT_PORT = 6100
FINISHED = ("succeeded", "failed", "stopped")

port_option = click.option(
    "--port",
    default=DEFAULT_PORT,
    show_default=True,
    help="The port to serve on (0: any free one).",
)


def _require_web_stack() -> None:
    if any(importlib.util.find_spec(name) is None for name in ("starlette", "uvicorn")):
        raise MissingTool(
            "the dashboard needs Starlette and uvicorn, which are not installed for this Python",
            hint=install_hint("dashboard"),
        )


@cli.command()
@run_option
@port_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDRESS",
    help="The address to listen on (loopback only answers requests for a loopback name).",
)
@click.option(
    "--no-token",
    is_flag=True,
    help="Serve without the token (loopback only): every local user can then read the page.",
)
@click.option(
    "--interval", default=1.0, show_default=True, metavar="SECONDS", help="How often to poll."
)
@click.option("--exit-after-run", type=float, hidden=True, metavar="SECONDS")
@pass_context
def dashboard(  # noqa: PLR0917 - click passes every option by position
    context: Context,
    run_id: str | None,
    port: int,
    host: str,
    interval: float,
    no_token: bool,
    exit_after_run: float | None,
) -> None:
    """Serve a live web page of the run: every worker's state, progress and ETA, loss and steps/s
    curves across restarts, the restart timeline and root cause, every log followed live, the
    last preflight findings, a TensorBoard link, and the earlier runs. Ctrl-C stops it.

    \b
    The page updates by server push; /api/status gives the same JSON as 'status --json'.
    All viewers share one poll: next to a running supervisor the dashboard serves the status
    the supervisor writes at each poll; otherwise it polls the hosts once per --interval.
    Read-only. Without --run the page follows the latest run of the state directory.

    \b
    Every request needs the token (as in Jupyter): open the URL printed at start once, and the
    browser keeps it in a cookie; scripts send 'Authorization: Bearer TOKEN', the token being in
    the state directory's dashboard-token file (0600). --no-token is for loopback only.
    """
    _require_web_stack()
    if run_id is not None:
        if not RUN_ID_PATTERN.fullmatch(run_id):  # not a file of runs/ such as x.status
            raise RunStateError(
                f"'{run_id}' is not a run id", hint="'orchestrate status --json' names the run"
            )
        context.store.load(run_id)  # an unknown run is an error now, not a blank page
    from orchestrator.dashboard.server import Dashboard, may_go_without_token

    if no_token and not may_go_without_token(host):
        raise click.UsageError(
            f"--no-token is for a loopback address only, not {host}: any machine that reaches "
            f"{host} could read the runs. Leave --no-token out (the printed URL carries the "
            "token), or listen on 127.0.0.1"
        )
    token = None if no_token else _token(context.store)
    served = Dashboard(context.store, host, port, run_id, interval, token)
    click.echo(f"dashboard: {served.url}", nl=True)
    _say_who_reads(context.store, served.port, host, no_token)
    if exit_after_run is not None and run_id is not None:
        threading.Thread(
            target=_exit_after_run, args=(served, run_id, exit_after_run), daemon=True
        ).start()
    served.serve()
    errors.print("dashboard stopped")


def _say_who_reads(store: RunStore, port: int, host: str, no_token: bool) -> None:
    """On stderr: without a token, the other users logged in now; with it, where it is."""
    from orchestrator.dashboard.auth import other_users
    from orchestrator.dashboard.server import may_go_without_token

    if no_token:
        import psutil  # here: every other command starts without it (issue 31)

        others = other_users((u.name for u in psutil.users()), getpass.getuser())
        if others:
            errors.print(
                f"warning: without a token every user of this machine can read the dashboard "
                f"on port {port}, and {', '.join(others)} logged in now",
                markup=False,
                highlight=False,
            )
    else:
        where = "beyond this machine; " if not may_go_without_token(host) else ""
        errors.print(
            f"every request needs the token ({where}it is in the URL above and in "
            f"{store.dashboard_token_path()}; scripts send 'Authorization: Bearer TOKEN')",
            markup=False,
            highlight=False,
        )


def _token(store: RunStore) -> str:
    from orchestrator.dashboard.auth import stored_token

    path = store.dashboard_token_path()
    try:
        return stored_token(path)
    except OSError as exc:
        raise RunStateError(
            f"the dashboard cannot keep its token in {path}: {exc.strerror}",
            hint="point --state-dir at a directory you can write (or, on loopback, --no-token)",
        ) from exc


def _exit_after_run(served: object, run_id: str, linger: float) -> None:
    """For `up --dashboard`: the page stays up while the run lives and `linger` s after."""
    hub = served.hub  # type: ignore[attr-defined]
    finished_since: float | None = None
    while True:
        state = (hub.watch(run_id).document().get("status") or {}).get("state")
        if state in FINISHED:
            finished_since = finished_since or time.monotonic()
            if time.monotonic() - finished_since >= linger:
                os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful exit
                return
        else:
            finished_since = None
        time.sleep(5)


def spawn_dashboard(store: RunStore, run_id: str, port: int, linger: float = 600.0) -> str:
    """A detached `orchestrate dashboard --run RUN_ID` for `up --dashboard`; its URL."""
    _require_web_stack()
    log_path = store.dashboard_log_path(run_id)
    with store.open_private(log_path) as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "--state-dir", str(store.root.resolve()),
             "dashboard", "--run", run_id, "--port", str(port),
             "--exit-after-run", str(linger)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise MissingTool(f"the dashboard did not start: {said[0]}", hint=f"see {log_path}")
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith("dashboard: http") and _answers(port):
                return line.removeprefix("dashboard: ")
        time.sleep(0.1)
    raise MissingTool("the dashboard did not answer within 20 s", hint=f"see {log_path}")


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
