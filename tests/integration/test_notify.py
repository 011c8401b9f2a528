"""`notify:` on real runs of local processes: real HTTP and HTTPS servers in this process (on
loopback) and a real command receive the events; servers that fail (500, no answer, nothing
listening) change nothing of the run and are each named once per event in the supervisor's log."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import json
import shutil
import socket
import ssl
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import Cli, free_ports, suspend_workers, wait_for
from tests.integration.test_supervision import stepping
from tests.scripts import STEPPER

SECRET = "s3cret-for-the-test"
SIGNATURE = "X-Orchestrate-Signature-256"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Server:
    """An HTTP(S) server on loopback answering `code` to every POST, keeping what it got."""

    code: int = 200
    context: ssl.SSLContext | None = None
    got: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                length = int(self.headers.get("Content-Length", "0"))
                owner.got.append(Received(self.path, dict(self.headers), self.rfile.read(length)))
                self.send_response(owner.code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.context is not None:
            self.httpd.socket = self.context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def events(self) -> list[str]:
        return [r.json.get("event") for r in self.got]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def throwaway_ca(directory: Path) -> ssl.SSLContext:
    """A CA made for this test (its certificate in ca.pem) and a server context whose
    certificate it signed, for 127.0.0.1."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "orchestrate test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "server.pem")
    return context


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, Any]]:
    good, failing = Server(), Server(code=500)
    tls = Server(context=throwaway_ca(tmp_path))
    silent = socket.socket()  # listens, never accepts: the request waits for an answer
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    yield {
        "good": good,
        "failing": failing,
        "tls": tls,
        "silent": silent.getsockname()[1],
        "refused": free_ports(1)[0],
    }
    for server in (good, failing, tls):
        server.close()
    silent.close()


def write_inventory(cli: Cli, servers: dict[str, Any], *, steps: int, delay: float) -> Path:
    shutil.copyfile(STEPPER, cli.cwd / "train.py")
    (cli.cwd / "hook.py").write_text(
        "import sys\n"
        "with open(sys.argv[1], 'a') as out:\n"
        "    out.write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n"
    )
    ports = free_ports(2)
    job = {
        "name": "demo",
        "script": "train.py",
        "restart_backoff": 0,
        "warm_restarts": False,
        "env": {"STEPS": steps, "DELAY": delay, "REPORT_RATE": 1},
    }
    notify = [
        {
            "webhook": f"http://127.0.0.1:{servers['good'].port}/hook?key=abc",
            "secret_env": "HOOK_SECRET",
            "headers": {"Authorization": "Bearer t0ken"},
            "events": ["started", "restarting", "succeeded", "stopped"],
        },
        {
            "webhook": f"https://127.0.0.1:{servers['tls'].port}/slack",
            "format": "slack",
            "ca_file": "ca.pem",
        },
        {"webhook": f"http://127.0.0.1:{servers['failing'].port}/500", "timeout": 1},
        {"webhook": f"http://127.0.0.1:{servers['silent']}/silent", "timeout": 1},
        {"webhook": f"http://localhost:{servers['refused']}/refused", "timeout": 1},
        {"command": [sys.executable, "hook.py", "command-events.jsonl"]},
    ]
    path = cli.cwd / "inv.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: ./work}}
        hosts:
          - {{name: alpha, address: localhost, port: {ports[0]}}}
          - {{name: beta, address: localhost, port: {ports[1]}}}
        job: {json.dumps(job)}
        notify: {json.dumps(notify)}
        """)
    )
    return path


def signed(received: Received) -> bool:
    expected = hmac.new(SECRET.encode(), received.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(received.headers[SIGNATURE], f"sha256={expected}")


def test_a_restarted_run_is_told_to_every_target_and_failing_ones_change_nothing(
    cli: Cli, reaper: list[str], servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_SECRET", SECRET)  # the CLI's environment is this one's
    write_inventory(cli, servers, steps=120, delay=0.05)
    up = cli.popen("up", "--skip-checks", "inv.yaml")
    try:
        # Both held once they stepped (their own progress files, no status poll in between:
        # a 6 s run can end before one returns on a busy machine), so their pids are theirs.
        alpha, beta = suspend_workers([stepping(cli, name) for name in ("alpha", "beta")])
        # The signing secret stays the controller's: a local worker (started from this very
        # environment) and its supervisor do not inherit it.
        for process in (alpha, *alpha.children(recursive=True)):
            assert "HOOK_SECRET" not in process.environ(), process
        beta.kill()
        alpha.resume()
        out, err = up.communicate(timeout=120)
    finally:
        up.kill()
    reaper.append(cli.record()["run_id"])
    run_id = cli.record()["run_id"]
    # The run is what it would be without notify:.
    assert up.returncode == 0, err
    assert "killed by SIGKILL; restarting the cluster (1/3)" in out
    assert "succeeded at step 120 after 1 restart(s)" in err

    good = servers["good"]
    assert good.events() == ["started", "restarting", "succeeded"]
    assert all(signed(r) for r in good.got)
    assert all(r.headers["Authorization"] == "Bearer t0ken" for r in good.got)
    assert {r.path for r in good.got} == {"/hook?key=abc"}
    started, restarting, succeeded = (r.json for r in good.got)
    assert started["run_id"] == run_id and started["job"] == "demo"
    assert restarting["root_cause"].startswith("beta") and "SIGKILL" in restarting["root_cause"]
    assert restarting["restarts"] == 1 and restarting["hint"]
    # engine/observe/eta.py's estimate: the running worker's steps left at 20 steps/s (alpha's;
    # beta, killed, has none), no more than the slowest worker's step would leave.
    assert 0 < restarting["eta_seconds"] <= (120 - restarting["step"]) / 20
    assert restarting["target_steps"] == 120 and restarting["dashboard"] is None
    assert succeeded["state"] == "succeeded" and succeeded["step"] == 120
    assert succeeded["restarts"] == 1 and succeeded["eta_seconds"] is None

    # HTTPS, its certificate checked against ca_file; Slack's shape; the default events.
    tls = servers["tls"]
    texts = [r.json["text"] for r in tls.got]
    assert [set(r.json) for r in tls.got] == [{"text"}, {"text"}]
    assert "demo" in texts[0] and "is restarting (restart 1): beta" in texts[0]
    assert "succeeded" in texts[1]

    # The command got the very same events (same ids) on its stdin.
    lines = (cli.cwd / "command-events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [restarting, succeeded]

    # Three tries per event for a 500; each failing target named once per event.
    assert len(servers["failing"].got) == 6
    for name, why in (
        (f"http://127.0.0.1:{servers['failing'].port}/...", "HTTP 500"),
        (f"http://127.0.0.1:{servers['silent']}/...", "no answer within 1 s"),
        (f"http://localhost:{servers['refused']}/...", "connection refused"),
    ):
        for event in ("restarting", "succeeded"):
            said = [line for line in out.splitlines() if name in line and f"'{event}'" in line]
            assert len(said) == 1, (name, event, out)
            assert why in said[0]
    assert "abc" not in out and SECRET not in out  # a webhook is named without its path

    # `notify --test` reports each target's answer; failing targets make it exit 3.
    tested = cli("notify", "inv.yaml", "--test", timeout=60)
    assert tested.returncode == 3, tested.stderr
    assert "3 of 6 notify target(s) did not take the test event" in tested.stderr
    answers = tested.stdout.splitlines()
    assert answers[0].endswith(": ok: HTTP 200 OK") and answers[5].endswith(": ok: exit 0")
    assert "FAILED: HTTP 500" in answers[2] and "FAILED: connection refused" in answers[4]
    assert good.got[-1].json["event"] == "test" and signed(good.got[-1])


def test_detached_run_and_down_tell_started_and_stopped(
    cli: Cli, reaper: list[str], servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    path = write_inventory(cli, servers, steps=2000, delay=0.05)
    # Only the targets that answer: this test is about who sends what.
    text = path.read_text()
    notify = json.loads(text.split("notify: ", 1)[1])
    path.write_text(text.split("notify: ", 1)[0] + f"notify: {json.dumps(notify[:2])}\n")
    monkeypatch.delenv("HOOK_SECRET")
    refused = cli("up", "-d", "--skip-checks", "inv.yaml")
    assert refused.returncode == 2 and "HOOK_SECRET" in refused.stderr, refused.stderr
    monkeypatch.setenv("HOOK_SECRET", SECRET)  # the detached supervisor inherits it
    cli("up", "-d", "--skip-checks", "inv.yaml", check=True)
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    good = servers["good"]
    wait_for(lambda: good.events() == ["started"], timeout=30)
    down = cli("down", timeout=60)
    assert down.returncode == 0, down.stderr
    assert good.events() == ["started", "stopped"]
    stopped = good.got[-1].json
    assert stopped["run_id"] == run_id and stopped["root_cause"] == "stopped by 'orchestrate down'"
    assert all(signed(r) for r in good.got)  # the detached supervisor's too: it inherits it
    wait_for(lambda: len(servers["tls"].got) == 1, timeout=10)  # stopped is a default event
    assert "was stopped" in servers["tls"].got[0].json["text"]
    log = (cli.cwd / ".orchestrate" / "runs" / f"{run_id}.log").read_text()
    assert "not delivered" not in log


def test_https_needs_the_servers_ca_and_name(cli: Cli, servers: dict[str, Any]) -> None:
    """ca_file makes the throwaway CA's certificate good; without it (the system's CAs), or for
    a name the certificate does not carry, the event is not sent."""
    port = servers["tls"].port
    (cli.cwd / "train.py").write_text("")
    (cli.cwd / "inv.yaml").write_text(
        textwrap.dedent(f"""\
        hosts: [{{name: a, address: localhost, port: {free_ports(1)[0]}, connection: local}}]
        job: {{script: train.py}}
        notify:
          - {{webhook: "https://127.0.0.1:{port}/a", ca_file: ca.pem, timeout: 2}}
          - {{webhook: "https://127.0.0.1:{port}/b", timeout: 2}}
          - {{webhook: "https://localhost:{port}/c", ca_file: ca.pem, timeout: 2}}
        """)
    )
    tested = cli("notify", "inv.yaml", "--test", timeout=60)
    assert tested.returncode == 3, tested.stderr
    ok, untrusted, wrong_name = tested.stdout.splitlines()
    assert ok.endswith(": ok: HTTP 200 OK")
    assert "FAILED: the server's certificate was refused: unable to get local issuer" in untrusted
    assert "FAILED: the server's certificate was refused" in wrong_name
    assert "mismatch" in wrong_name or "not valid for" in wrong_name
    assert [r.path for r in servers["tls"].got] == ["/a"]
