"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium) while the local two-worker TensorFlow example trains: the printed URL's token traded
for an HttpOnly cookie and gone from the address bar; both workers shown, the step advancing,
log lines arriving; SIGKILL of one worker shows up as a restart in the timeline, then both run
again; no JavaScript errors. The screenshot is kept in test-artifacts/.

And a script that writes hostile strings everywhere it can (log lines, its failure text, metric
and device names, a NaN in its history): the page shows them as text and runs none of them; the
token form lets a visitor in; a hostile URL's 404 runs nothing either."""

from __future__ import annotations

import os
import re
import shutil
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import REPO, Cli, busy_cpus, free_ports, local_tf_inventory, wait_for
from tests.integration.test_dashboard_http import serve

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


def assert_loss_views(driver: Any) -> None:
    """The loss chart's views (issue 56): the choice redraws it at once, from the last document."""
    drawn = driver.execute_script(
        "const s = document.getElementById('loss-view'); s.value = 'loss_log';"
        "s.dispatchEvent(new Event('change'));"
        "const chart = document.getElementById('chart-loss');"
        "return [chart.querySelector('.chart-title').textContent,"
        "        chart.querySelectorAll('polyline').length];"
    )
    assert drawn[0] == "log10(loss)" and drawn[1] >= 1, drawn


def test_page_follows_training_and_a_restart(cli: Cli, reaper: list[str], browser: Any) -> None:
    driver = browser
    local_tf_inventory(cli, steps=100_000, log_every=5, checkpoint_every=25, restart_backoff=0)
    port = free_ports(1)[0]
    started = cli("up", "--detach", "--skip-checks", "--dashboard", "--dashboard-port",
                  str(port), "inv.yaml", check=True)  # fmt: skip
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    try:
        url = re.search(rf"dashboard: (http://127\.0\.0\.1:{port}/\?token=\S+)", started.stderr)
        assert url, started.stderr
        driver.get(url.group(1))
        # The token went into an HttpOnly, SameSite=Strict cookie and left the address bar.
        assert driver.current_url == f"http://127.0.0.1:{port}/"
        cookie = driver.get_cookie(f"orchestrate-token-{port}")
        assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert "orchestrate-token" not in str(driver.execute_script("return document.cookie;"))

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
        # Under load, as on a busy workstation: the chief's aborted collective can be recorded
        # before the killed worker's exit; the root cause must still name the one killed.
        with busy_cpus():
            os.kill(victim["pid"], signal.SIGKILL)
            restart = wait_for(
                lambda: text("#timeline li.restart"), timeout=90, what="the restart in the timeline"
            )
        assert re.search(r"\bother at step \d+: killed by SIGKILL", restart), restart
        wait_for(
            lambda: (
                {r["state"] for r in rows().values()} == {"running"} and (step_of("chief") or 0) > 0
            ),
            timeout=120,
            what="both workers running again",
        )
        wait_for(lambda: count("#chart-loss polyline") >= 1, timeout=30, what="the loss curve")
        markers = count("#chart-loss .marker")
        assert_loss_views(driver)
        # Goodput's stacked bar: training and the restart's downtime among its segments, the
        # shares adding up to the whole; its line names the restart; the runs table a figure.
        wait_for(lambda: count("#goodput-bar rect[data-part='restart']") == 1, timeout=30,
                 what="the restart's downtime in the goodput bar")  # fmt: skip
        assert count("#goodput-bar rect[data-part='productive']") == 1
        shares = driver.execute_script(
            "return [...document.querySelectorAll('#goodput-bar rect[data-share]')]"
            ".map((r) => Number(r.dataset.share));"
        )
        assert abs(sum(shares) - 1) < 0.01, shares
        assert re.match(r"goodput \d+ %: .*lost to 1 restart", text("#goodput-line"))
        wait_for(lambda: re.fullmatch(r"\d+ %", text("#runs tr.current td.goodput")),
                 timeout=30, what="the run's goodput in the runs table")  # fmt: skip
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        assert markers, "the restart is marked on the loss curve"
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
    finally:
        cli("down", "--grace", "5")
        for process in dashboard_processes(run_id):
            process.terminate()


HOSTILE = (
    "<img src=x onerror=window.__pwned=1>",
    "<script>window.__pwned=2</script>",
    '"><svg onload=window.__pwned=3>',
)
HOSTILE_SCRIPT = """\
import os, sys
sys.path.insert(0, os.environ["REPO"])
from worker.progress import history_path, report
HOSTILE = {hostile!r}
for step in (1, 2, 3):
    report(step=step, target_steps=10, loss=1.0 / step, devices=list(HOSTILE),
           note=HOSTILE[0], **{{name: 1.0 for name in HOSTILE}})
    for line in HOSTILE:
        print("log", line, flush=True)
# A history that a script of its own writes: NaN and Infinity, as Python's json spells them.
with open(history_path(os.environ["ORCHESTRATE_PROGRESS_FILE"]), "a") as history:
    history.write('{{"step": 4, "loss": NaN}}\\n{{"step": 5, "loss": Infinity}}\\n'
                  '{{"step": 6, "loss": 0.2}}\\n')
print("ModuleNotFoundError: No module named 'x' " + HOSTILE[1], flush=True)
sys.exit("failed: " + " ".join(HOSTILE))
"""

PWNED_SCRIPT = """
const injected = document.querySelectorAll(
  "img[src='x'], svg[onload], body script:not([src]):not([type])");
return {pwned: window.__pwned === undefined ? null : window.__pwned, injected: injected.length};
"""


def test_hostile_strings_stay_text_and_the_token_form(
    cli: Cli, reaper: list[str], browser: Any
) -> None:
    driver = browser
    (cli.cwd / "train.py").write_text(HOSTILE_SCRIPT.format(hostile=HOSTILE))
    port = free_ports(1)[0]
    # A neighbour's file in the lease directory, named to inject markup and escapes (issue 41).
    leases = cli.cwd / "leases"
    leases.mkdir(mode=0o1777)
    planted = f"lease-{HOSTILE[0]}\x1b]0;pwned\x07.json"
    (leases / planted).write_text("{}")
    (cli.cwd / "inv.yaml").write_text(textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: ./work, gpus: 1, visible_gpus: [0],
                    lease_dir: '{leases}'}}
        hosts: [{{name: alpha, address: localhost, port: {port}}}]
        job: {{name: hostile, script: train.py, max_restarts: 0, env: {{REPO: '{REPO}'}}}}
        """))  # fmt: skip
    failed = cli("up", "--skip-checks", "inv.yaml")
    assert failed.returncode != 0
    reaper.append(cli.record()["run_id"])
    served = serve(cli)
    try:
        # No token yet: the form asks for it; the token typed in lets the visitor in.
        driver.get(served.base + "/")
        driver.find_element("id", "token").send_keys(str(served.token))
        driver.find_element("css selector", "form button").click()
        wait_for(lambda: driver.current_url == served.base + "/", timeout=10, what="the page")

        def text(selector: str) -> str:
            return str(driver.execute_script(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
                selector,
            ))  # fmt: skip

        logs = wait_for(lambda: HOSTILE[2] in (t := text("#logs")) and t, timeout=30, what="logs")
        assert all(line in logs for line in HOSTILE)  # shown as the script wrote them
        cause = wait_for(lambda: text("#root-cause"), timeout=30, what="the root cause")
        assert "failed: " + HOSTILE[0] in cause or HOSTILE[1] in cause, cause
        assert HOSTILE[0] in text("#workers")  # the device names, as text
        ignored = wait_for(lambda: text("#leases-ignored"), timeout=30, what="ignored leases")
        assert f"lease-{HOSTILE[0]}" in ignored, ignored  # the neighbour's file name, as text
        # The NaN and Infinity are gaps: the curve before them and the point after them.
        assert (
            driver.execute_script("return document.querySelectorAll('#chart-loss polyline').length")
            == 2
        )
        assert driver.execute_script(PWNED_SCRIPT) == {"pwned": None, "injected": 0}
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        asked = (
            f"{served.base}/ - Failed to load resource: the server responded with a status of 401"
        )
        assert [e for e in errors if not e.startswith(asked)] == []  # the form's own 401 aside

        # Arriving by a link from another site (here a file), the cookie works at once, and the
        # tokened address is not left in the tab's history.
        driver.delete_all_cookies()
        link = cli.cwd / "link.html"
        link.write_text(f'<a id="go" href="{served.url}">the dashboard</a>')
        driver.get(link.as_uri())
        before = driver.execute_script("return history.length")
        driver.find_element("id", "go").click()
        wait_for(lambda: text("#logs"), timeout=10, what="the page after a link from elsewhere")
        assert driver.current_url == served.base + "/"
        assert driver.execute_script("return history.length") == before + 1

        # A hostile URL: its 404 page shows the name as text and runs nothing.
        driver.get(served.base + "/runs/" + HOSTILE[0])
        assert "<img src=x" in text("body")
        assert driver.execute_script(PWNED_SCRIPT) == {"pwned": None, "injected": 0}
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard-hostile-404.png"))
    finally:
        served.process.terminate()
        served.process.wait(timeout=15)
