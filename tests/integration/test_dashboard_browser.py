"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium) while the local two-worker TensorFlow example trains: both workers shown, the step
advancing, log lines arriving; SIGKILL of one worker shows up as a restart in the timeline, then
both run again; no JavaScript errors. The screenshot is kept in test-artifacts/."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, Cli, free_ports, local_tf_inventory, wait_for

pytestmark = pytest.mark.tf

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(os.environ.get("ORCHESTRATE_TEST_ARTIFACTS", REPO / "test-artifacts"))


@pytest.fixture
def browser() -> Iterator[object]:
    if CHROMIUM is None or DRIVER is None:
        if os.geteuid() == 0:
            pytest.fail("chromium/chromedriver missing: scripts/ci-system-deps.sh installs them")
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/ci-system-deps.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1600"):  # fmt: skip
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


ROWS_SCRIPT = """
const rows = {};
for (const row of document.querySelectorAll("#workers tbody tr")) {
  const cells = row.querySelectorAll("td");
  rows[row.dataset.worker] = {state: cells[2].innerText, progress: cells[3].innerText};
}
return rows;
"""


def dashboard_processes(run_id: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = process.info["cmdline"] or []
        if "dashboard" in command and run_id in command:
            found.append(process)
    return found


def test_page_follows_training_and_a_restart(cli: Cli, reaper: list[str], browser) -> None:  # type: ignore[no-untyped-def]
    driver = browser
    local_tf_inventory(cli, steps=100_000, log_every=5, checkpoint_every=25, restart_backoff=0)
    port = free_ports(1)[0]
    started = cli("up", "--detach", "--skip-checks", "--dashboard", "--dashboard-port",
                  str(port), "inv.yaml", check=True)  # fmt: skip
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    try:
        assert f"dashboard: http://127.0.0.1:{port}/" in started.stderr
        driver.get(f"http://127.0.0.1:{port}/")

        def rows() -> dict[str, dict[str, str]]:
            # Read in one script: the page replaces the rows at every update.
            return dict(driver.execute_script(ROWS_SCRIPT))

        def text(selector: str) -> str:
            return str(driver.execute_script(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
                selector,
            ))  # fmt: skip

        def count(selector: str) -> int:
            return int(driver.execute_script(
                "return document.querySelectorAll(arguments[0]).length;", selector
            ))  # fmt: skip

        def step_of(name: str) -> int | None:
            text = rows().get(name, {}).get("progress", "-").split("/")[0].strip()
            return int(text) if text.isdigit() else None

        shown = wait_for(lambda: set(rows()) == {"chief", "other"} and rows(), timeout=30)
        assert set(shown) == {"chief", "other"}
        first = wait_for(lambda: (s := step_of("chief")) and s > 0 and s, timeout=120)
        wait_for(lambda: (step_of("chief") or 0) > first, timeout=60, what="the step to advance")
        log_text = wait_for(
            lambda: "chief |" in (t := text("#logs")) and "step" in t and t, timeout=30
        )
        assert "other |" in log_text

        victim = next(w for w in cli.status()["workers"] if w["name"] == "other")
        os.kill(victim["pid"], signal.SIGKILL)
        restart = wait_for(
            lambda: text("#timeline li.restart"), timeout=90, what="the restart in the timeline"
        )
        assert "other" in restart and "SIGKILL" in restart
        wait_for(
            lambda: (
                {r["state"] for r in rows().values()} == {"running"} and (step_of("chief") or 0) > 0
            ),
            timeout=120,
            what="both workers running again",
        )
        wait_for(lambda: count("#chart-loss polyline") >= 1, timeout=30, what="the loss curve")
        markers = count("#chart-loss .marker")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        assert markers, "the restart is marked on the loss curve"
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
    finally:
        cli("down", "--grace", "5")
        for process in dashboard_processes(run_id):
            process.terminate()
