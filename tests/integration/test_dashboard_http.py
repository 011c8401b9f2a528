"""The dashboard over HTTP, against the real `orchestrate dashboard` process and a real run of
local script workers: endpoints, the event stream, the token, and unknown runs."""

from __future__ import annotations

import json
import re
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
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url
        self.base = url.split("?", maxsplit=1)[0].rstrip("/")


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


def events(url: str, documents: int, timeout: float = 30) -> list[tuple[str, Any]]:
    """The events of the stream at `url` until it has sent `documents` dashboard documents."""
    found: list[tuple[str, Any]] = []
    with httpx.stream("GET", url, timeout=timeout) as answer:
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
    base = served.base
    status = wait_for(
        lambda: (s := httpx.get(f"{base}/api/status").json()).get("state") == "running" and s,
        timeout=30,
    )
    # The same document as `status --json`: the same keys, the same run and workers.
    from_cli = cli.status()
    assert set(status) == set(from_cli)
    assert set(status["workers"][0]) == set(from_cli["workers"][0])
    assert [w["name"] for w in status["workers"]] == ["alpha", "beta"]
    assert httpx.get(f"{base}/api/runs/{run_id}/status").json()["run_id"] == run_id

    page = httpx.get(f"{base}/")
    assert page.status_code == 200 and "orchestrate" in page.text and "/static/app.js" in page.text
    assert httpx.get(f"{base}/static/app.js").status_code == 200

    runs = httpx.get(f"{base}/api/runs").json()["runs"]
    assert [(r["run_id"], r["current"]) for r in runs] == [(run_id, True)]

    # The push stream: a full document first, then log lines with tail's prefixes, and later
    # documents with a larger step.
    stream = events(f"{base}/api/runs/{run_id}/events", documents=2)
    documents = [data for event, data in stream if event == "dashboard"]
    lines = [entry for event, data in stream if event == "log" for entry in data]
    assert documents and documents[0]["run_id"] == run_id
    assert {e["prefix"] for e in lines} <= {"alpha |", "beta  |"} and lines
    first = documents[0]
    assert "<svg" in first["charts"]["loss"] and "<svg" in first["charts"]["steps_per_sec"]
    later = events(f"{base}/api/runs/{run_id}/events", documents=3)
    steps = [d["workers"][0]["step"] for e, d in later if e == "dashboard"]
    assert max(steps) > first["workers"][0]["step"]
    # Served from the detached supervisor's snapshot: the hosts are not probed a second time.
    assert [d["source"] for e, d in later if e == "dashboard"][-1] == "supervisor"

    # Unknown runs: a 404 with a message, for the page and for scripts.
    missing = httpx.get(f"{base}/api/runs/nope/status")
    assert missing.status_code == 404 and "no run 'nope'" in missing.json()["error"]
    assert httpx.get(f"{base}/runs/nope").status_code == 404
    assert httpx.get(f"{base}/api/runs/nope/events").status_code == 404

    logs = httpx.get(f"{base}/api/runs/{run_id}/logs").json()["lines"]
    assert any(e["line"].startswith("step ") for e in logs)


def test_charts_come_from_the_workers_history(served_run: tuple[Cli, Served]) -> None:
    cli, served = served_run
    run_id = cli.record()["run_id"]

    def drawn() -> str | None:
        document = httpx.get(f"{served.base}/api/runs/{run_id}/dashboard").json()
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
        document = httpx.get(f"{served.base}/api/runs/{cli.record()['run_id']}/dashboard").json()
        assert document["source"] == "dashboard"
        assert document["status"]["state"] == "succeeded"
    finally:
        served.process.terminate()
        served.process.wait(timeout=15)


def test_another_address_requires_the_printed_token(cli: Cli, reaper: list[str]) -> None:
    make_job(cli, steps=5)
    cli("up", "--skip-checks", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    # Listening on every address (reached here through 127.0.0.1: nothing else is addressed).
    served = serve(cli, "--host", "0.0.0.0")
    try:
        token = served.url.split("token=")[1]
        base = served.base.replace("0.0.0.0", "127.0.0.1")
        for path in ("/", "/api/status", "/api/runs", "/static/app.js", "/api/runs/x/events"):
            assert httpx.get(base + path).status_code == 401, path
            assert httpx.get(f"{base}{path}?token=wrong").status_code == 401, path
        assert httpx.get(f"{base}/api/status?token={token}").json()["state"] == "succeeded"
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{base}/api/runs", headers=bearer).status_code == 200
        page = httpx.get(f"{base}/?token={token}").text
        assert f"/static/app.js?token={token}" in page
    finally:
        served.process.terminate()
        served.process.wait(timeout=15)


def test_named_run_that_does_not_exist_is_an_error(cli: Cli) -> None:
    result = cli("dashboard", "--run", "nope", "--port", "0", timeout=30)
    assert result.returncode == 4
    assert "no run 'nope'" in result.stderr and "Traceback" not in result.stderr


def test_busy_port_is_a_clear_error(cli: Cli) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("dashboard", "--port", str(port), timeout=30)
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port" in result.stderr
