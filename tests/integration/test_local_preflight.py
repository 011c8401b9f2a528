"""Preflight for local workers: the same port checks on loopback, and a host whose Python is
missing. Real processes, real sockets."""

from __future__ import annotations

import json
import socket
import textwrap

from tests.conftest import Cli, free_ports


def write(cli: Cli, python: str | None = None) -> list[int]:
    (cli.cwd / "train.py").write_text("print('ok')\n")
    ports = free_ports(2)
    extra = f", python: {python}" if python else ""
    (cli.cwd / "inv.yaml").write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: ./work}}
        hosts:
          - {{name: a, address: localhost, port: {ports[0]}}}
          - {{name: b, address: 127.0.0.1, port: {ports[1]}{extra}}}
        job: {{script: train.py}}
        """)
    )
    return ports


def failures(result: str) -> dict[tuple[str, str], str]:
    return {
        (f["host"], f["check"]): f["detail"] for f in json.loads(result) if f["status"] == "fail"
    }


def test_local_ports_are_checked_on_loopback_and_released(cli: Cli) -> None:
    ports = write(cli)
    result = cli("check", "--json", "inv.yaml")
    assert result.returncode == 0, result.stdout
    reachable = [f for f in json.loads(result.stdout) if f["check"] == "reachable"]
    assert [f["detail"] for f in reachable] == [
        f"port {ports[0]} reachable from b",
        f"port {ports[1]} reachable from a",
    ]
    for port in ports:  # the temporary listeners are gone: the ports bind again at once
        with socket.socket() as probe:
            probe.bind(("0.0.0.0", port))
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", ports[1]))
        holder.listen()
        busy = cli("check", "--json", "inv.yaml")
    assert busy.returncode == 5
    assert failures(busy.stdout)[("b", "port")].startswith(f"port {ports[1]} is busy: pid ")


def test_a_missing_python_is_named(cli: Cli) -> None:
    write(cli, python="/nonexistent/python3")
    result = cli("check", "--json", "inv.yaml")
    assert result.returncode == 5
    assert (
        failures(result.stdout)[("b", "python")] == "cannot run '/nonexistent/python3': not found"
    )
