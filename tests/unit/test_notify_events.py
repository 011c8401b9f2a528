"""`notify:` and the ETA: the block's validation, the events (what each says, who wants it, its
body and signature), the supervisor's and `down`'s events on a fake backend, the delivery rules
against real servers on loopback, and the one ETA estimate."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.cli.render import progress_line, status_table
from orchestrator.config.notify import SIGNATURE_HEADER
from orchestrator.dashboard import model
from orchestrator.engine.observe.eta import eta_seconds, run_eta, worker_eta
from orchestrator.engine.observe.events import (
    body,
    dashboard_address,
    event_text,
    run_event,
    signature,
    target_label,
    wants,
)
from orchestrator.engine.observe.failures import Failure
from orchestrator.engine.observe.goodput import PARTS
from orchestrator.engine.observe.notify import (
    NotDelivered,
    Notifier,
    RunEvents,
    deliver,
    missing_notify_secrets,
)
from orchestrator.engine.observe.snapshot import write_snapshot
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run
from orchestrator.errors import InventoryError, JobFailed, SecretMissing
from orchestrator.model.inventory import (
    DEFAULT_NOTIFY_EVENTS,
    NOTIFY_EVENTS,
    Inventory,
    Job,
    NotifyTarget,
    WorkerSlot,
)
from orchestrator.model.records import Restart, RunRecord
from orchestrator.model.vocabulary import FailureKind, WorkerState
from tests.fakes.backend import FakeBackend, Script, exited, running

HEAD = (
    "hosts:\n  - {name: a, address: localhost, port: 20001, connection: local}\n"
    "job: {script: train.py}\n"
)


def load(tmp_path: Path, notify: str) -> Inventory:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "inv.yaml"
    path.write_text(HEAD + "notify:\n" + notify)
    return load_inventory(path)


def problems(tmp_path: Path, notify: str) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, notify)
    return [str(p) for p in caught.value.problems]


# The block.


def test_targets_read_with_their_defaults(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("")
    (tmp_path / "hook.sh").write_text("")
    inventory = load(
        tmp_path,
        "  - webhook: https://hooks.example.com/services/T/B/X\n"
        "    format: slack\n    secret_env: HOOK_KEY\n    ca_file: ca.pem\n"
        "    headers: {Authorization: Bearer x, X-Team: 7}\n"
        "  - command: [./hook.sh, --json]\n    events: [started, failed]\n    timeout: 20\n"
        "  - webhook: http://127.0.0.1:8080/hook\n",
    )
    slack, command, local = inventory.notify
    assert slack.url == "https://hooks.example.com/services/T/B/X" and slack.format == "slack"
    assert slack.ca_file == str(tmp_path / "ca.pem") and slack.secret_env == "HOOK_KEY"
    assert slack.headers == {"Authorization": "Bearer x", "X-Team": "7"}
    assert slack.events == DEFAULT_NOTIFY_EVENTS and "started" not in slack.events
    assert slack.timeout == 5
    assert command.command == (str(tmp_path / "hook.sh"), "--json") and command.url is None
    assert command.events == ("started", "failed") and command.timeout == 20
    assert local.url == "http://127.0.0.1:8080/hook" and local.format == "json"


@pytest.mark.parametrize(
    ("notify", "expected"),
    [
        ("  - webhook: http://hooks.example.com/x\n",
         "inv.yaml:5: notify[0].webhook: http:// is for this machine only (loopback)"),
        ("  - webhook: ftp://127.0.0.1/x\n", "notify[0].webhook: expected an https:// URL"),
        ("  - webhook: https://me:pw@example.com/x\n",
         "notify[0].webhook: a user or password in the URL is not sent"),
        ("  - webhook: https://example.com:99999/x\n", "notify[0].webhook: not a URL"),
        ("  - {}\n", "notify[0]: set exactly one of 'webhook'"),
        ("  - {webhook: 'https://e.com/', command: [x]}\n", "notify[0]: set exactly one of"),
        ("  - {command: []}\n", "notify[0].command: expected a list: the program, then"),
        ("  - {command: [./missing.sh]}\n", "notify[0].command: no such file:"),
        ("  - {command: [echo], format: slack}\n", "notify[0].format: applies to webhook: only"),
        ("  - {webhook: 'https://e.com/', events: [done]}\n",
         "notify[0].events[0]: expected one of queued, started, restarting, stalled"),
        ("  - {webhook: 'https://e.com/', events: [failed, failed]}\n",
         "notify[0].events[1]: failed is listed twice"),
        ("  - {webhook: 'https://e.com/', events: []}\n", "notify[0].events: expected a list"),
        ("  - {webhook: 'https://e.com/', secret_env: 1X}\n",
         "notify[0].secret_env: expected an environment variable name"),
        ("  - {webhook: 'https://e.com/', headers: {Content-Length: '3'}}\n",
         "notify[0].headers.Content-Length: is set by orchestrate"),
        ("  - {webhook: 'https://e.com/', headers: {X-Orchestrate-Signature-256: x}}\n",
         "is set by orchestrate"),
        ("  - {webhook: 'https://e.com/', headers: {'bad name': x}}\n",
         "notify[0].headers.bad name: expected an HTTP header name"),
        ("  - {webhook: 'http://127.0.0.1/', ca_file: inv.yaml}\n",
         "notify[0].ca_file: applies to https:// only"),
        ("  - {webhook: 'https://e.com/', ca_file: nope.pem}\n", "notify[0].ca_file: no such file"),
        ("  - {webhook: 'https://e.com/', timeout: 61}\n", "notify[0].timeout: expected an"),
        ("  - {webhook: 'https://e.com/', retries: 3}\n", "notify[0].retries: unknown key"),
        ("  - https://e.com/\n", "notify[0]: expected a mapping with webhook: URL"),
        ("  {webhook: 'https://e.com/'}\n", "notify: expected a list of targets"),
    ],
)  # fmt: skip
def test_each_mistake_is_named_with_its_line(tmp_path: Path, notify: str, expected: str) -> None:
    found = problems(tmp_path, notify)
    assert any(expected in p for p in found), found


def test_every_problem_at_once_and_loopback_http_allowed(tmp_path: Path) -> None:
    found = problems(
        tmp_path, "  - {webhook: 'http://e.com/'}\n  - {command: [echo], headers: {}}\n"
    )
    assert len(found) == 2 and "notify[1].headers: applies to webhook: only" in found[1]
    for address in ("localhost", "127.0.0.1", "[::1]"):
        (target,) = load(tmp_path, f"  - webhook: http://{address}:9/x\n").notify
        assert target.url == f"http://{address}:9/x"


def test_the_targets_travel_in_the_run_record(tmp_path: Path) -> None:
    inventory = load(tmp_path, "  - {webhook: 'https://e.com/', headers: {A: b}}\n"
                     "  - {command: [echo, x], events: [stopped]}\n")  # fmt: skip
    record = RunRecord("r1", inventory, 0.0)
    read = RunRecord.from_json(json.loads(json.dumps(record.to_json())), lambda kind, raw: None,
                               lambda inventory, settings: (None, None))  # fmt: skip
    assert read.inventory.notify == inventory.notify


def test_up_refuses_without_a_secret_it_would_sign_with() -> None:
    targets = [NotifyTarget(url="https://e.com/", secret_env="HOOK_KEY")]
    with pytest.raises(SecretMissing, match="notify: secret_env HOOK_KEY is not set"):
        missing_notify_secrets(targets, {}, doing="'up'")
    missing_notify_secrets(targets, {"HOOK_KEY": "v"}, doing="'up'")


# Events.


def worker(name: str = "a", state: str = "running", **fields: object) -> WorkerStatus:
    declared = dataclasses.fields(WorkerStatus)
    unset = {f.name: None for f in declared if f.default is dataclasses.MISSING}
    given = {"name": name, "index": 0, "host": "localhost", "state": WorkerState(state)}
    return WorkerStatus(**{**unset, "devices": (), "log_tail": (), **given, **fields})  # type: ignore[arg-type]


def status(state: str, *workers: WorkerStatus, restarts: int = 0) -> RunStatus:
    restart = Restart(1.0, 0, "b", "killed by SIGKILL", 3, "killed")
    return RunStatus("r1", "demo", WorkerState(state), workers, attempt=restarts,
                     restarts=(restart,) * restarts)  # fmt: skip


def test_an_event_says_what_happened_why_how_far_and_where_to_look() -> None:
    now = status("running", worker("a", step=40, target_steps=100, steps_per_sec=4.0),
                 worker("b", "failed", step=30, target_steps=100, steps_per_sec=4.0))  # fmt: skip
    event = run_event("restarting", job="demo", run_id="r1", status=now, at=5.0, event_id="e1",
                      root_cause="b at step 30: killed by SIGKILL", hint="look at b",
                      restarts=1, dashboard="http://127.0.0.1:6100/")  # fmt: skip
    assert {k: v for k, v in event.items() if k != "text"} == {
        "event": "restarting", "job": "demo", "run_id": "r1", "state": "running",
        "step": 30, "target_steps": 100, "eta_seconds": 15.0,  # a's: b is not running
        "root_cause": "b at step 30: killed by SIGKILL", "hint": "look at b", "restarts": 1,
        "attempt": 0, "dashboard": "http://127.0.0.1:6100/", "at": 5.0, "id": "e1",
    }  # fmt: skip
    assert event["text"] == (
        "orchestrate: job demo (run r1) is restarting (restart 1): b at step 30: killed by "
        "SIGKILL. What to do: look at b. Step 30/100, ETA 15s. Dashboard: http://127.0.0.1:6100/."
    )
    ended = status("succeeded", worker(step=100, target_steps=100), restarts=2)
    done = run_event("succeeded", job="demo", run_id="r1", at=1.0, event_id="e2", status=ended)
    assert done["restarts"] == 2 and done["eta_seconds"] is None
    assert (
        event_text(done) == "orchestrate: job demo (run r1) succeeded. Step 100/100, 2 restart(s)."
    )
    bare = run_event("test", job="demo", run_id=None, status=None, at=1.0, event_id="e3")
    assert bare["state"] is None and bare["text"] == "orchestrate: job demo test notification."


def test_targets_get_the_events_they_chose_and_their_shape() -> None:
    default = NotifyTarget(url="https://e.com/")
    assert [e for e in NOTIFY_EVENTS if wants(default, e)] == list(DEFAULT_NOTIFY_EVENTS)
    only = NotifyTarget(command=("true",), events=("started",))
    assert wants(only, "started") and not wants(only, "failed") and wants(only, "test")
    event = {"event": "failed", "text": "it failed", "job": "demo"}
    assert json.loads(body(default, event)) == event
    assert json.loads(body(NotifyTarget(url="https://e.com/", format="slack"), event)) == {
        "text": "it failed"
    }
    # A command gets the event whatever format says (format is for webhooks).
    assert json.loads(body(dataclasses.replace(only, format="slack"), event)) == event


def test_the_signature_is_hmac_sha256_of_the_exact_body() -> None:
    payload = b'{"event": "failed"}'
    expected = hmac.new(b"k3y", payload, hashlib.sha256).hexdigest()
    assert signature("k3y", payload) == f"sha256={expected}"
    assert signature("k3y", payload + b" ") != signature("k3y", payload)


def test_logs_name_a_target_without_its_path_or_query() -> None:
    slack = NotifyTarget(url="https://hooks.slack.com/services/T0/B0/SECRET?x=1")
    assert target_label(0, slack) == "notify[0] https://hooks.slack.com/..."
    assert target_label(2, NotifyTarget(url="http://[::1]:81/a")) == "notify[2] http://[::1]:81/..."
    assert (
        target_label(1, NotifyTarget(command=("/bin/hook", "x"))) == "notify[1] command /bin/hook"
    )


def test_the_dashboard_address_never_carries_its_token() -> None:
    log = "dashboard: http://127.0.0.1:6100/?token=abc123#x\nlistening on 0.0.0.0 ...\n"
    assert dashboard_address(log) == "http://127.0.0.1:6100/"
    assert dashboard_address("dashboard: https://u:p@host:1/base?t=1") == "https://host:1/base"
    assert dashboard_address(log + "dashboard stopped\n") is None
    assert dashboard_address("") is None


# The supervisor's and down's events, on a fake backend; a command target writes what it gets.


def recording(tmp_path: Path, events: tuple[str, ...] = NOTIFY_EVENTS) -> NotifyTarget:
    out = tmp_path / "events.jsonl"
    return NotifyTarget(command=("sh", "-c", f"cat >> '{out}'; echo >> '{out}'"), events=events)


def received(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def fake_inventory(tmp_path: Path, *targets: NotifyTarget, **job: object) -> Inventory:
    hosts = tuple(WorkerSlot(name, f"10.0.0.{i + 1}", 20000) for i, name in enumerate("ab"))
    options = {"script": "train.py", "restart_backoff": 0, "max_restarts": 3, **job}
    return Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts,
                     Job("demo", **options), notify=targets)  # type: ignore[arg-type]  # fmt: skip


def test_the_supervisor_tells_start_restart_with_its_cause_and_success(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={
        "a": {0: [running(1), running(2), exited(-9, 2)], 1: [running(3), exited(0, 5)]},
        "b": {0: [running(1), running(2)], 1: [running(3), exited(0, 5)]},
    })  # fmt: skip
    store = RunStore(tmp_path / "state")
    record = start_run(fake_inventory(tmp_path, recording(tmp_path)), store, backend)
    said: list[str] = []
    final = Supervisor(store, backend, record, say=said.append, interval=0).run()
    assert final.state is WorkerState.SUCCEEDED
    started, restarting, succeeded = received(tmp_path)
    assert [started["event"], restarting["event"], succeeded["event"]] == [
        "started",
        "restarting",
        "succeeded",
    ]
    assert restarting["root_cause"].startswith("a at step 2: ") and restarting["restarts"] == 1
    assert restarting["hint"] and succeeded["restarts"] == 1 and succeeded["step"] == 5
    # The run's goodput at its end (engine/observe/goodput.py's account), in the payload; the start
    # and the restart carry none. The fake reports steps but not when the first was made.
    assert succeeded["goodput"]["restarts"] == 1 and "goodput" not in restarting
    assert set(succeeded["goodput"]["seconds"]) == set(PARTS)
    assert len(succeeded["goodput"]["attempts"]) == 2
    assert not [m for m in said if m.startswith("notify:")]
    # A supervisor taking the run over tells none of them again; `down` of a finished run neither.
    again = RunEvents(store, store.load(), said.append)
    again.seen(final)
    again.ended(final, stopping=False)
    again.stopped()
    again.close()
    assert len(received(tmp_path)) == 3


def test_a_run_given_up_is_told_failed_once(tmp_path: Path) -> None:
    tail = ["ModuleNotFoundError: No module named 'mytools'"]
    backend = FakeBackend(scripts={"a": {0: [exited(1, None, error=tail[0], tail=tail)]}})
    store = RunStore(tmp_path / "state")
    record = start_run(fake_inventory(tmp_path, recording(tmp_path)), store, backend)
    with pytest.raises(JobFailed):
        Supervisor(store, backend, record, interval=0).run()
    assert [e["event"] for e in received(tmp_path)] == ["started", "failed"]
    failed = received(tmp_path)[1]
    assert (
        failed["root_cause"].startswith("a: ")
        and "repeats on every restart" in failed["root_cause"]
    )
    assert failed["hint"].startswith("a module the worker imports is missing")


def test_a_preemption_that_ends_a_run_on_hosts_is_told_preempted(tmp_path: Path) -> None:
    scripts: dict[str, Script] = {name: {0: [running(4), exited(75, 6)]} for name in "ab"}
    backend = FakeBackend(scripts=scripts)  # hosts: nothing resubmits, the run ends stopped
    store = RunStore(tmp_path / "state")
    record = start_run(fake_inventory(tmp_path, recording(tmp_path)), store, backend)
    final = Supervisor(store, backend, record, interval=0).run()
    assert final.state is WorkerState.STOPPED
    assert [e["event"] for e in received(tmp_path)] == ["started", "preempted"]
    assert "preempted" in received(tmp_path)[1]["root_cause"]


def test_a_stall_is_told_then_the_restart_and_preemptions_as_such(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    backend = FakeBackend(scripts={"a": {0: [running(1)]}, "b": {0: [running(1)]}})
    record = start_run(fake_inventory(tmp_path, recording(tmp_path)), store, backend)
    events = RunEvents(store, record, lambda message: None)
    events.seen(status("running", worker(step=1)))
    restart = Restart(1.0, 0, "a", "stalled: no progress for 3 s", 1, "stalled")
    events.failure(Failure("a", FailureKind.STALLED, restart.reason, 1), restart, None, "look")
    preempted = Restart(2.0, 1, "a", "preempted: saved a checkpoint and exited", 4, "preempted")
    events.failure(Failure("a", FailureKind.PREEMPTED, preempted.reason, 4), preempted, None, None)
    events.close()
    names = [(e["event"], e["root_cause"]) for e in received(tmp_path)]
    assert names == [
        ("started", None),
        ("stalled", "a at step 1: stalled: no progress for 3 s"),
        ("restarting", "a at step 1: stalled: no progress for 3 s"),
        ("preempted", "a at step 4: preempted: saved a checkpoint and exited; resubmitting"),
    ]


def test_down_tells_stopped_from_the_last_snapshot(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "state")
    backend = FakeBackend(scripts={"a": {0: [running(1)]}, "b": {0: [running(1)]}})
    target = recording(tmp_path, events=("stopped",))
    record = start_run(fake_inventory(tmp_path, target), store, backend)
    last = status("running", worker(step=7, target_steps=10, steps_per_sec=1.0))
    write_snapshot(store, dataclasses.replace(last, run_id=record.run_id))
    events = RunEvents(store, record, lambda message: None)
    events.stopped()
    events.close()
    (stopped,) = received(tmp_path)
    assert stopped["event"] == "stopped" and stopped["step"] == 7 and stopped["eta_seconds"] == 3.0
    assert stopped["root_cause"] == "stopped by 'orchestrate down'"


def test_a_target_that_does_not_answer_delays_nothing_and_is_said_once(tmp_path: Path) -> None:
    slow = NotifyTarget(command=("sleep", "30"), timeout=1)
    said: list[str] = []
    notifier = Notifier([slow, recording(tmp_path)], str(tmp_path), said.append)
    notifier.emit({"event": "failed", "text": "x"})
    notifier.emit({"event": "stopped", "text": "y"})
    notifier.close(limit=0.3)  # shorter than the slow target's try: it is abandoned
    assert [e["event"] for e in received(tmp_path)] == ["failed", "stopped"]
    assert said == [
        "notify[0] command sleep: 'failed' not delivered: still being tried when orchestrate "
        "stopped waiting",
        "notify[0] command sleep: 'stopped' not delivered: still being tried when orchestrate "
        "stopped waiting",
    ]


def test_a_command_that_fails_or_hangs_is_named_with_why(tmp_path: Path) -> None:
    event = {"event": "failed", "text": "x"}
    failing = NotifyTarget(command=("sh", "-c", "echo nope >&2; exit 4"))
    with pytest.raises(NotDelivered, match="exit 4: nope"):
        deliver(failing, event, str(tmp_path), {})
    with pytest.raises(NotDelivered, match="still running after 1 s"):
        deliver(NotifyTarget(command=("sleep", "5"), timeout=1), event, str(tmp_path), {})
    with pytest.raises(NotDelivered, match="could not start"):
        deliver(NotifyTarget(command=(str(tmp_path / "none"),)), event, str(tmp_path), {})


# Webhook delivery rules, against a real server on loopback.


@pytest.fixture
def server() -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"code": 200, "got": [], "headers": {}}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name
            data = self.rfile.read(int(self.headers["Content-Length"]))
            state["got"].append((dict(self.headers), data))
            self.send_response(state["code"])
            for name, value in state["headers"].items():
                self.send_header(name, value)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"said")

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    yield state
    httpd.shutdown()
    httpd.server_close()


def test_a_signed_post_and_its_answer(server: dict[str, Any], tmp_path: Path) -> None:
    target = NotifyTarget(url=server["url"], secret_env="K", headers={"X-Team": "7"})
    event = {"event": "failed", "text": "x"}
    assert deliver(target, event, str(tmp_path), {"K": "v"}) == "HTTP 200 OK"
    ((headers, data),) = server["got"]
    assert json.loads(data) == event and headers["Content-Type"] == "application/json"
    assert headers["X-Team"] == "7" and headers[SIGNATURE_HEADER] == signature("v", data)
    with pytest.raises(NotDelivered, match="secret_env K is not set"):
        deliver(target, event, str(tmp_path), {})
    assert len(server["got"]) == 1  # never sent unsigned


def test_a_client_error_is_not_tried_again_and_a_redirect_not_followed(
    server: dict[str, Any], tmp_path: Path
) -> None:
    target = NotifyTarget(url=server["url"])
    server["code"] = 404
    with pytest.raises(NotDelivered, match="HTTP 404 Not Found: said"):
        deliver(target, {"event": "x", "text": ""}, str(tmp_path), {})
    assert len(server["got"]) == 1
    server["code"], server["headers"] = 302, {"Location": "http://127.0.0.1:9/elsewhere"}
    with pytest.raises(NotDelivered, match=r"HTTP 302.*redirects are not followed"):
        deliver(target, {"event": "x", "text": ""}, str(tmp_path), {})
    assert len(server["got"]) == 2


# The one ETA.


def test_eta_from_rate_and_remaining_steps() -> None:
    assert eta_seconds(100, 300, 4.0) == 50.0
    assert eta_seconds(300, 300, 4.0) is None
    assert eta_seconds(None, 300, 4.0) is None
    assert eta_seconds(10, None, 4.0) is None
    assert eta_seconds(10, 300, None) is None and eta_seconds(10, 300, 0.0) is None
    assert worker_eta(worker(step=10, target_steps=20, steps_per_sec=2.0)) == 5.0
    assert worker_eta(worker(state="failed", step=10, target_steps=20, steps_per_sec=2.0)) is None


def test_the_run_eta_is_its_slowest_workers_everywhere() -> None:
    fast = worker("a", step=90, target_steps=100, steps_per_sec=2.0)
    slow = worker("b", step=50, target_steps=100, steps_per_sec=2.0)
    now = status("running", fast, slow, worker("c", step=None))
    assert run_eta(now.workers) == 25.0 == now.eta_seconds
    assert now.to_json()["eta_seconds"] == 25.0
    assert run_eta([]) is None and status("running", worker("c")).to_json()["eta_seconds"] is None
    # The dashboard, the live view and a plain progress line show the same estimate.
    assert model.worker_view(slow)["eta_seconds"] == slow.eta_seconds == 25.0
    assert "ETA 25s" in str(status_table(now).title)
    assert progress_line(slow).endswith("ETA 25s")
