"""The dashboard over HTTP, against the real `orchestrate dashboard` process and a real run of
local script workers: endpoints, the event stream, the token (its cookie, its file, Bearer),
the Host allowlist and the security headers, and unknown runs."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Cli, free_ports, wait_for

# Reports progress through worker.progress, so the bounded history file is written too.
SCRIPT = """\
import os, sys, time
sys.path.insert(0, os.environ["REPO"])
from worker.progress import report
steps = int(os.environ["STEPS"])
for step in range(1, steps + 1):
    report(step=step, target_steps=steps, loss=1.0 / step, accuracy=0.5, steps_per_sec=20.0)
    print("step", step, flush=True)
    time.sleep(0.05)
"""


def make_job(cli: Cli, steps: int) -> None:
    (cli.cwd / "train.py").write_text(SCRIPT)
    ports = free_ports(2)
    repo = Path(__file__).resolve().parents[2]
    (cli.cwd / "inv.yaml").write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: ./work}}
        hosts:
          - {{name: alpha, address: localhost, port: {ports[0]}}}
          - {{name: beta, address: localhost, port: {ports[1]}}}
        job: {{name: demo, script: train.py, restart_backoff: 0,
               env: {{STEPS: {steps}, REPO: '{repo}'}}}}
        """)
    )


class Served:
    """A dashboard process, its printed URL, and its token sent as scripts send it."""

    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url
        self.base = url.split("?", maxsplit=1)[0].rstrip("/")
        self.token = url.split("?token=")[1] if "?token=" in url else None
        self.headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, **options: Any) -> httpx.Response:
        return httpx.get(self.base + path, headers=self.headers, **options)


def serve(cli: Cli, *args: str) -> Served:
    process = cli.popen("dashboard", "--port", "0", *args)
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"dashboard: (http\S+)", line)
    assert match, f"no URL printed: {line!r} {process.stderr.read() if process.stderr else ''}"
    return Served(process, match.group(1))


@pytest.fixture
def served_run(cli: Cli, reaper: list[str]) -> Iterator[tuple[Cli, Served]]:
    make_job(cli, steps=2000)
    cli("up", "--detach", "--skip-checks", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    served = serve(cli)
    try:
        yield cli, served
    finally:
        served.process.terminate()
        served.process.wait(timeout=15)
        cli("down", "--grace", "2")


def events(served: Served, path: str, documents: int, timeout: float = 30) -> list[tuple[str, Any]]:
    """The events of the stream at `path` until it has sent `documents` dashboard documents."""
    found: list[tuple[str, Any]] = []
    with httpx.stream("GET", served.base + path, headers=served.headers, timeout=timeout) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in answer.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event:
                found.append((event, json.loads(line.removeprefix("data: "))))
                if sum(1 for e, _ in found if e == "dashboard") >= documents:
                    break
    return found


def test_endpoints_stream_and_404(served_run: tuple[Cli, Served]) -> None:
    cli, served = served_run
    run_id = cli.record()["run_id"]
    status = wait_for(
        lambda: (s := served.get("/api/status").json()).get("state") == "running" and s,
        timeout=30,
    )
    # The same document as `status --json`: the same keys, the same run and workers.
    from_cli = cli.status()
    assert set(status) == set(from_cli)
    assert set(status["workers"][0]) == set(from_cli["workers"][0])
    assert [w["name"] for w in status["workers"]] == ["alpha", "beta"]
    assert served.get(f"/api/runs/{run_id}/status").json()["run_id"] == run_id

    page = served.get("/")
    assert page.status_code == 200 and "orchestrate" in page.text and "/static/app.js" in page.text
    assert served.get("/static/app.js").status_code == 200

    runs = served.get("/api/runs").json()["runs"]
    assert [(r["run_id"], r["current"]) for r in runs] == [(run_id, True)]

    # The push stream: a full document first, then log lines with tail's prefixes, and later
    # documents with a larger step.
    stream = events(served, f"/api/runs/{run_id}/events", documents=2)
    documents = [data for event, data in stream if event == "dashboard"]
    lines = [entry for event, data in stream if event == "log" for entry in data]
    assert documents and documents[0]["run_id"] == run_id
    assert {e["prefix"] for e in lines} <= {"alpha |", "beta  |"} and lines
    first = documents[0]
    assert "<svg" in first["charts"]["loss"] and "<svg" in first["charts"]["steps_per_sec"]
    later = events(served, f"/api/runs/{run_id}/events", documents=3)
    steps = [d["workers"][0]["step"] for e, d in later if e == "dashboard"]
    assert max(steps) > first["workers"][0]["step"]
    # Served from the detached supervisor's snapshot: the hosts are not probed a second time.
    assert [d["source"] for e, d in later if e == "dashboard"][-1] == "supervisor"

    # Unknown runs: a 404 with a message, for the page and for scripts.
    missing = served.get("/api/runs/20990101-000000-ffff/status")
    assert missing.status_code == 404
    assert "no run '20990101-000000-ffff'" in missing.json()["error"]
    assert served.get("/runs/nope").status_code == 404
    assert served.get("/api/runs/nope/events").status_code == 404
    # A snapshot's name is not a run: it neither answers nor stops the page of the real run.
    assert served.get(f"/api/runs/{run_id}.status/status").status_code == 404
    assert served.get(f"/api/runs/{run_id}/status").json()["run_id"] == run_id

    logs = served.get(f"/api/runs/{run_id}/logs").json()["lines"]
    assert any(e["line"].startswith("step ") for e in logs)


def test_charts_come_from_the_workers_history(served_run: tuple[Cli, Served]) -> None:
    cli, served = served_run
    run_id = cli.record()["run_id"]

    def drawn() -> str | None:
        document = served.get(f"/api/runs/{run_id}/dashboard").json()
        return document["charts"]["loss"] if "<polyline" in document["charts"]["loss"] else None

    chart = wait_for(drawn, timeout=30)
    assert 'data-attempt="0"' in chart


def test_the_dashboard_polls_itself_without_a_supervisor(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, steps=5)
    cli("up", "--skip-checks", "inv.yaml", check=True)  # ran to the end: nobody supervises now
    reaper.append(cli.record()["run_id"])
    (cli.cwd / ".orchestrate" / "runs" / f"{cli.record()['run_id']}.status.json").unlink()
    served = serve(cli)
    try:
        document = served.get(f"/api/runs/{cli.record()['run_id']}/dashboard").json()
        assert document["source"] == "dashboard"
        assert document["status"]["state"] == "succeeded"
    finally:
        served.process.terminate()
        served.process.wait(timeout=15)


def test_the_token_the_host_allowlist_and_the_headers(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, steps=5)
    cli("up", "--skip-checks", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    # On loopback, by default: a token, in the printed URL and in the state directory's file.
    served = serve(cli)
    try:
        assert served.token, served.url
        token_file = cli.cwd / ".orchestrate" / "dashboard-token"
        info = token_file.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
        assert token_file.read_text().strip() == served.token
        from_file = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        base = served.base
        for path in ("/", "/api/status", "/api/runs", "/static/app.js", "/api/runs/x/events"):
            assert httpx.get(base + path).status_code == 401, path
            assert httpx.get(f"{base}{path}?token=wrong").status_code == 401, path
        assert "<form" in httpx.get(f"{base}/").text  # a page visit gets the form, not a bare 401
        status = httpx.get(f"{base}/api/status", headers=from_file)
        assert status.json()["state"] == "succeeded"
        for name, value in (
            ("content-security-policy", "default-src 'self'; frame-ancestors 'none'"),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
        ):
            assert status.headers[name] == value
        # The first visit: the token becomes an HttpOnly cookie and leaves the URL.
        visit = httpx.get(served.url)
        assert visit.status_code == 303 and visit.headers["location"] == "/"
        port = base.rsplit(":", 1)[1]
        assert visit.headers["set-cookie"].startswith(f"orchestrate-token-{port}=")
        page = httpx.get(f"{base}/", cookies=visit.cookies)
        assert page.status_code == 200 and served.token not in page.text
        # DNS rebinding: a request for another name, even with the token, is refused.
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.nip.io"):
            foreign = httpx.get(f"{base}/api/status", headers={**from_file, "Host": host})
            assert foreign.status_code == 403 and "succeeded" not in foreign.text, host
        assert httpx.get(
            f"{base}/api/status", headers={**from_file, "Host": f"localhost:{port}"}
        ).is_success
    finally:
        served.process.terminate()
        served.process.wait(timeout=15)
    check_off_loopback_and_no_token(cli, served.token)


def check_off_loopback_and_no_token(cli: Cli, token: str) -> None:
    # Listening on every address (reached here through 127.0.0.1: nothing else is addressed):
    # any Host, the token is the gate; the same token, the file already holds one.
    wide = serve(cli, "--host", "0.0.0.0")
    try:
        assert wide.token == token
        base = wide.base.replace("0.0.0.0", "127.0.0.1")
        assert httpx.get(f"{base}/api/runs").status_code == 401
        named = {"Authorization": f"Bearer {wide.token}", "Host": "dashboard.lab.example"}
        assert httpx.get(f"{base}/api/runs", headers=named).status_code == 200
    finally:
        wide.process.terminate()
        wide.process.wait(timeout=15)
    refused = cli("dashboard", "--host", "0.0.0.0", "--no-token", "--port", "0", timeout=30)
    assert refused.returncode == 2 and "--no-token is for a loopback address only" in refused.stderr
    open_one = serve(cli, "--no-token")
    try:
        assert open_one.token is None and httpx.get(f"{open_one.base}/api/runs").status_code == 200
    finally:
        open_one.process.terminate()
        open_one.process.wait(timeout=15)


def test_named_run_that_does_not_exist_is_an_error(cli: Cli) -> None:
    result = cli("dashboard", "--run", "20990101-000000-ffff", "--port", "0", timeout=30)
    assert result.returncode == 4
    assert "no run '20990101-000000-ffff'" in result.stderr and "Traceback" not in result.stderr
    result = cli("dashboard", "--run", "x.status", "--port", "0", timeout=30)
    assert result.returncode == 4 and "'x.status' is not a run id" in result.stderr


def test_busy_port_is_a_clear_error(cli: Cli) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("dashboard", "--port", str(port), timeout=30)
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port" in result.stderr
