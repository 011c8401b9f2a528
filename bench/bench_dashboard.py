"""Benchmark for issue 16: what the dashboard costs while the two-worker example trains.

One run of the bundled shapes task on two local workers (`up --detach`, so a supervisor polls
and writes its status snapshot), measured in consecutive windows of --seconds each:

  without      no dashboard process at all
  1 client     `orchestrate dashboard` with one event-stream client connected
  10 clients   the same dashboard with ten clients connected

For each window: the chief's training steps/s (step difference over the window, from the
progress file) and the CPU the dashboard process used (user+system seconds over the window, as
% of one core). The clients read the stream in threads of this process, as browsers would.

    .venv/bin/python -m bench.bench_dashboard [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
ENV.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")


def orchestrate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, check=True)  # fmt: skip


def chief_step(cwd: Path) -> int:
    record = json.loads(orchestrate(cwd, "status", "--json").stdout)
    return int(record["workers"][0]["step"] or 0)


def client(url: str, token: str, stop: threading.Event, received: list[int]) -> None:
    bearer = {"Authorization": f"Bearer {token}"}  # as scripts send the dashboard's token
    with httpx.stream("GET", url, headers=bearer, timeout=None) as answer:
        for chunk in answer.iter_bytes():
            received.append(len(chunk))
            if stop.is_set():
                return


def window(cwd: Path, seconds: float, dashboard: psutil.Process | None) -> tuple[float, float]:
    step0, t0 = chief_step(cwd), time.monotonic()
    cpu0 = sum(dashboard.cpu_times()[:2]) if dashboard else 0.0
    time.sleep(seconds)
    cpu1 = sum(dashboard.cpu_times()[:2]) if dashboard else 0.0
    step1, t1 = chief_step(cwd), time.monotonic()
    return (step1 - step0) / (t1 - t0), 100 * (cpu1 - cpu0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    options = parser.parse_args()
    cwd = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    (cwd / "inv.yaml").write_text(
        "defaults: {connection: local, workdir: ./work}\n"
        "hosts:\n  - {name: chief, address: localhost, port: 23611}\n"
        "  - {name: other, address: localhost, port: 23612}\n"
        "job: {name: shapes, task: 'worker.examples.shapes:task', steps: 1000000,"
        " log_every: 10, checkpoint_every: 200, env: {TF_CPP_MIN_LOG_LEVEL: '2'}}\n"
    )
    orchestrate(cwd, "up", "--detach", "--skip-checks", "inv.yaml")
    server = None
    stop = threading.Event()
    try:
        while chief_step(cwd) < 20:
            time.sleep(1)
        # (window, steps/s, dashboard CPU %, pushed KiB/s: None without a dashboard)
        results: list[tuple[str, float, float, float | None]] = [
            ("without", *window(cwd, options.seconds, None), None)
        ]
        command = [sys.executable, "-m", "orchestrator", "dashboard", "--port", "0"]
        server = subprocess.Popen(command, cwd=cwd, env=ENV, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        url = re.search(r"(http\S+)", server.stdout.readline()).group(1)  # type: ignore[union-attr]
        run_id = (cwd / ".orchestrate" / "current").read_text().strip()
        base, token = url.split("?token=")
        events = f"{base.rstrip('/')}/api/runs/{run_id}/events"
        process = psutil.Process(server.pid)
        received: list[int] = []
        for count in (1, 10):
            while len([t for t in threading.enumerate() if t.name == "client"]) < count:
                threading.Thread(target=client, args=(events, token, stop, received), name="client",
                                 daemon=True).start()  # fmt: skip
            time.sleep(2)
            received.clear()
            rate, cpu = window(cwd, options.seconds, process)
            kib_per_s = sum(received) / options.seconds / 1024
            results.append((f"{count} client(s)", rate, cpu, kib_per_s))
    finally:
        stop.set()
        if server is not None:
            server.terminate()
            server.wait(timeout=15)
        orchestrate(cwd, "down", "--grace", "5")
    print(f"{options.seconds:g} s windows, load average {os.getloadavg()[0]:.2f}")
    print(f"{'window':<14} {'steps/s':>8} {'dashboard CPU %':>16} {'pushed KiB/s':>13}")
    for name, rate, cpu, sent in results:
        pushed = f"{sent:.1f}" if sent is not None else "-"
        shown = f"{cpu:.1f}" if name != "without" else "-"
        print(f"{name:<14} {rate:>8.2f} {shown:>16} {pushed:>13}")


if __name__ == "__main__":
    main()
