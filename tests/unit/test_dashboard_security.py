"""Who may read the dashboard and what its answers may contain, against the real ASGI app (its
Guard, routes and a real state directory) through Starlette's test client: the Host allowlist,
the security headers, the token and its cookie, the login form, 404s that echo nothing raw,
run ids, unreadable records, non-finite values, the token file. The same in a real process and
a real browser: tests/integration/test_dashboard_http.py and test_dashboard_browser.py."""

from __future__ import annotations

import json
import os
import stat
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

with warnings.catch_warnings():  # starlette 1.x would rather have httpx2; httpx is what we pin
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from orchestrator.dashboard import model
from orchestrator.dashboard.app import create_app
from orchestrator.dashboard.auth import allowed_hosts, cookie_name, other_users, stored_token
from orchestrator.dashboard.charts import Series, line_chart
from orchestrator.dashboard.watch import Hub, RunWatch, web_link
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.workers.plan import RUN_ID_PATTERN, new_run_id
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.records import RunRecord

PORT = 6100
TOKEN = "t0ken-of-this-dashboard-xyz"
RUN = "20260102-030405-abcd"
HOSTILE = "<img src=x onerror=alert(1)>"


def save_run(store: RunStore, run_id: str = RUN) -> None:
    inventory = Inventory(
        path="inv.yaml",
        base_dir=".",
        hosts=(WorkerSlot(name="a", address="localhost", port=1),),
        job=Job(name="demo", script="train.py"),
    )
    store.save(RunRecord(run_id=run_id, inventory=inventory, created_at=time.time()))


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    store = RunStore(tmp_path / ".orchestrate")
    save_run(store)
    return store


@pytest.fixture
def hub(store: RunStore) -> Iterator[Hub]:
    hub = Hub(store, interval=0.2)
    yield hub
    hub.close()


def client(hub: Hub, token: str | None = TOKEN) -> TestClient:
    """A browser at http://127.0.0.1:PORT of a dashboard bound to 127.0.0.1."""
    app = create_app(hub, token, PORT, allowed_hosts("127.0.0.1", PORT))
    return TestClient(app, base_url=f"http://127.0.0.1:{PORT}", follow_redirects=False)


def signed_in(hub: Hub) -> TestClient:
    browser = client(hub)
    assert browser.get(f"/?token={TOKEN}").status_code == 303
    return browser


# -- the Host allowlist and the headers ---------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["127.0.0.1:6100", "localhost:6100", "[::1]:6100", "LOCALHOST:6100"]
)
def test_loopback_names_with_the_port_are_answered(hub: Hub, host: str) -> None:
    answer = signed_in(hub).get("/api/runs", headers={"host": host})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    "host",
    ["evil.example:6100", "evil.example", "127.0.0.1:80", "127.0.0.1", "localhost.evil:6100"],
)
def test_a_foreign_host_header_is_refused_on_loopback(hub: Hub, host: str) -> None:
    # DNS rebinding: a page of evil.example that now resolves to 127.0.0.1 is same-origin with
    # the dashboard, cookies aside; its requests carry its own name in Host.
    for browser in (signed_in(hub), client(hub, token=None)):
        answer = browser.get("/api/runs", headers={"host": host})
        assert answer.status_code == 403 and "runs" not in answer.text, host


def test_off_loopback_any_host_reaches_the_token_check() -> None:
    assert allowed_hosts("0.0.0.0", PORT) is None
    assert allowed_hosts("192.0.2.7", PORT) is None
    assert allowed_hosts("127.0.0.2", PORT) >= {"127.0.0.2:6100", "127.0.0.1:6100"}  # type: ignore[operator]
    assert allowed_hosts("::1", 80) >= {"[::1]", "[::1]:80", "localhost"}  # type: ignore[operator]


def test_every_answer_carries_the_security_headers(hub: Hub) -> None:
    browser = signed_in(hub)
    answers = [
        browser.get("/"), browser.get("/static/app.js"), browser.get("/api/runs"),
        browser.get("/runs/nope"), client(hub).get("/"), client(hub).get("/api/runs"),
        browser.get("/", headers={"host": "evil.example:6100"}),
    ]  # fmt: skip
    for answer in answers:
        headers = answer.headers
        assert headers["content-security-policy"] == "default-src 'self'; frame-ancestors 'none'"
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"


# -- the token and its cookie -------------------------------------------------------------------


def test_the_first_visit_trades_the_token_for_a_cookie(hub: Hub) -> None:
    browser = client(hub)
    answer = browser.get(f"/runs/{RUN}?token={TOKEN}&x=1")
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/runs/{RUN}?x=1"  # the same URL without the token
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(PORT)}={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    page = browser.get(f"/runs/{RUN}")
    assert page.status_code == 200 and 'id="settings"' in page.text
    assert TOKEN not in page.text  # neither the page nor its asset links carry it
    assert "?token" not in page.text and browser.get("/api/runs").status_code == 200


def test_arriving_from_another_site_the_exchange_is_a_page_of_ours(hub: Hub) -> None:
    # After a 303 the browser would still count the request as cross-site: no Strict cookie.
    browser = client(hub)
    answer = browser.get(f"/?token={TOKEN}", headers={"sec-fetch-site": "cross-site"})
    assert answer.status_code == 200 and answer.headers["set-cookie"].startswith(cookie_name(PORT))
    assert 'id="next" href="/"' in answer.text and '<script src="/static/enter.js">' in answer.text
    assert TOKEN not in answer.text
    assert client(hub).get("/static/enter.js").status_code == 200  # before any cookie


def test_a_visit_without_the_token_gets_a_form_that_asks_for_it(hub: Hub) -> None:
    browser = client(hub)
    form = browser.get(f"/runs/{RUN}")
    assert form.status_code == 401 and "text/html" in form.headers["content-type"]
    assert '<form method="post" action="/login">' in form.text and 'name="token"' in form.text
    assert f'value="/runs/{RUN}"' in form.text
    wrong = browser.post("/login", data={"token": "nope-nope-nope-nope", "next": f"/runs/{RUN}"})
    assert wrong.status_code == 401 and "not this dashboard" in wrong.text
    assert "set-cookie" not in wrong.headers
    right = browser.post("/login", data={"token": TOKEN, "next": f"/runs/{RUN}"})
    assert right.status_code == 303 and right.headers["location"] == f"/runs/{RUN}"
    assert browser.get(f"/runs/{RUN}").status_code == 200
    # Back to this dashboard only, never to another site.
    for elsewhere in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
        away = client(hub).post("/login", data={"token": TOKEN, "next": elsewhere})
        assert away.headers["location"] == "/", elsewhere


def test_scripts_send_a_bearer_token_and_get_json_401s(hub: Hub) -> None:
    anonymous = client(hub)
    for path in ("/api/status", "/api/runs", f"/api/runs/{RUN}/events", "/static/app.js"):
        assert anonymous.get(path).status_code == 401, path
        assert anonymous.get(path, headers={"authorization": "Bearer wrong"}).status_code == 401
    denied = anonymous.get("/api/runs")
    assert denied.headers["content-type"] == "application/json"
    assert "Bearer" in denied.json()["error"]
    answer = anonymous.get("/api/runs", headers={"authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200 and answer.json()["runs"][0]["run_id"] == RUN
    bad = anonymous.get("/?token=wrong")
    assert bad.status_code == 401 and "set-cookie" not in bad.headers
    other_port = client(hub)
    other_port.cookies.set(cookie_name(PORT + 1), TOKEN)  # another dashboard's cookie
    assert other_port.get("/api/runs").status_code == 401


def test_without_a_token_loopback_is_open(hub: Hub) -> None:
    assert client(hub, token=None).get("/api/runs").status_code == 200


def test_the_token_file_is_ours_0600_and_shared(tmp_path: Path) -> None:
    path = tmp_path / "state" / "dashboard-token"
    token = stored_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == token
    assert stored_token(path) == token  # a second dashboard, or a restart: the same token
    path.chmod(0o644)  # readable by others: perhaps read, so not kept
    fresh = stored_token(path)
    assert fresh != token and stat.S_IMODE(path.stat().st_mode) == 0o600
    target = tmp_path / "elsewhere"
    target.write_text("planted-token-planted-token\n")
    target.chmod(0o600)
    path.unlink()
    path.symlink_to(target)  # a link left where the token goes: neither followed nor used
    linked = stored_token(path)
    assert linked != "planted-token-planted-token" and not path.is_symlink()
    assert target.read_text() == "planted-token-planted-token\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["dashboard-token"]  # no temp left


def test_others_logged_in_are_named_for_the_no_token_warning() -> None:
    assert other_users(["me", "alice", "me", "bob", ""], "me") == ["alice", "bob"]
    assert other_users(["me"], "me") == []


# -- what the answers may contain ---------------------------------------------------------------


def test_the_404_page_echoes_nothing_raw_and_no_path(hub: Hub, store: RunStore) -> None:
    browser = signed_in(hub)
    for path in (f"/runs/{HOSTILE}", "/runs/%3Csvg%20onload=alert(1)%3E"):
        page = browser.get(path)
        assert page.status_code == 404 and "text/html" in page.headers["content-type"]
        assert "<img" not in page.text and "<script>alert" not in page.text
        assert "&lt;" in page.text
        assert str(store.root.resolve()) not in page.text
    missing = browser.get("/api/runs/20990101-000000-ffff/status")
    assert missing.status_code == 404 and str(store.root.resolve()) not in missing.text
    assert "no run '20990101-000000-ffff'" in missing.json()["error"]


def test_names_that_are_not_run_ids_are_no_runs(hub: Hub, store: RunStore) -> None:
    # runs/x.status.json is a snapshot, not a record: exists() alone would take `x.status`.
    store.write_file(store.snapshot_path("x"), "{}")
    browser = signed_in(hub)
    for name in ("x.status", f"{RUN}.status", "r1", "%2e%2e"):
        for path in (f"/runs/{name}", f"/api/runs/{name}/status", f"/api/runs/{name}/events"):
            answer = browser.get(path)
            assert answer.status_code == 404, path
    assert "not a run id" in browser.get("/api/runs/x.status/status").json()["error"]
    assert RUN_ID_PATTERN.fullmatch(new_run_id())


def test_the_page_settings_cannot_close_their_script(hub: Hub, store: RunStore) -> None:
    (store.root / "current").write_text("</script><script>alert(1)</script>\n")
    page = client(hub, token=None).get("/")
    assert page.status_code == 200
    settings = page.text.split('<script id="settings" type="application/json">')[1]
    settings = settings.split("</script>")[0]
    assert "<" not in settings and json.loads(settings)["run"].startswith("</script>")


def test_an_unreadable_record_is_named_not_a_500(hub: Hub, store: RunStore) -> None:
    runs = store.root / "runs"
    (runs / "20260101-000000-0001.json").write_text("{not json")
    (runs / "20260101-000000-0002.json").write_text("{}")
    answer = signed_in(hub).get("/api/runs")
    assert answer.status_code == 200
    listed = {r["run_id"]: r for r in answer.json()["runs"]}
    assert listed[RUN]["job"] == "demo" and "unreadable" not in listed[RUN]
    for bad in ("20260101-000000-0001", "20260101-000000-0002"):
        assert "unreadable" in listed[bad]["unreadable"], listed[bad]


def test_a_non_finite_value_is_a_gap_in_the_curve() -> None:
    history = model.parse_history(
        '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": NaN}\n{"step": 3, "loss": 1.0}\n'
        '{"step": 4, "loss": Infinity}\n{"step": 5, "loss": 0.5}\n{"step": NaN, "loss": 1}\n'
    )
    assert [p["step"] for p in history] == [1, 2, 3, 4, 5]
    svg = line_chart("loss", model.curve({0: history}, "loss"))
    assert svg.count("<polyline") == 3 and "nan" not in svg.lower() and "inf" not in svg
    only_nan = line_chart("loss", [Series(0, ((1.0, float("nan")),))], empty="waiting")
    assert "waiting" in only_nan


def test_a_bad_tick_answers_with_an_error_instead_of_silence(store: RunStore) -> None:
    # A record without workers (odd, or hostile) breaks the page's build: the watch must still
    # answer, at once, and keep polling.
    path = store.root / "runs" / f"{RUN}.json"
    store.write_file(path, json.dumps({**json.loads(path.read_text()), "workers": []}))
    watch = RunWatch(store, RUN, interval=0.2)
    try:
        started = time.monotonic()
        document = watch.document(timeout=10)
        assert time.monotonic() - started < 5 and "error" in document, document
        time.sleep(0.5)
        assert not watch.stopped.is_set()
    finally:
        watch.stop()


def test_only_http_links_reach_the_page() -> None:
    assert web_link("http://127.0.0.1:6006/") and web_link("https://tb.example/x")
    for url in ("javascript:alert(1)", "JavaScript:alert(1)", "data:text/html,x", "//x.y/",
                "http://", "http://a b/", "vbscript:x", None, 3, "http://a\n.b/"):  # fmt: skip
        assert not web_link(url), url


def test_a_javascript_tensorboard_link_is_not_served(store: RunStore) -> None:
    store.tensorboard_path().write_text(
        json.dumps({"url": "javascript:alert(document.cookie)", "pid": os.getpid()})
    )
    watch = RunWatch(store, RUN, interval=0.2)
    try:
        assert watch._tensorboard() is None  # the one place the link is chosen
        served = {"url": "http://127.0.0.1:6006/", "pid": os.getpid()}
        store.tensorboard_path().write_text(json.dumps(served))
        assert watch._tensorboard() == served
    finally:
        watch.stop()
