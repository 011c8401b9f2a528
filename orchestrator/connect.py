"""One runner per machine: workers that share a machine share a connection."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.errors import HostError
from orchestrator.hostagent import HostAgent
from orchestrator.inventory import Host
from orchestrator.runner import LineSession, LocalRunner, Runner

MachineKey = tuple[str, ...]


def machine_key(host: Host) -> MachineKey:
    if host.connection == "local":
        return ("local",)
    return ("ssh", host.address, str(host.ssh_port or ""), host.ssh_user or "")


def runner_for(host: Host) -> Runner:
    if host.connection == "local":
        return LocalRunner("localhost")
    from orchestrator.ssh import SshRunner  # Fabric/paramiko load only when a host needs them

    return SshRunner(host)


class Machines:
    """Lazily opened runners for the machines of some hosts; close() releases them all."""

    def __init__(self, factory: Callable[[Host], Runner] = runner_for) -> None:
        self._factory = factory
        self._runners: dict[MachineKey, Runner] = {}
        self._lock = threading.Lock()  # fan-out threads ask for runners at the same time
        self._sessions: dict[MachineKey, LineSession] = {}

    def agent(self, host: Host) -> HostAgent:
        key = machine_key(host)
        with self._lock:
            if key not in self._runners:
                self._runners[key] = self._factory(host)
            return HostAgent(self._runners[key], host.python)

    def runner(self, host: Host) -> Runner:
        return self.agent(host).runner

    def probe(self, host: Host, run_dirs: list[str]) -> dict[str, Any]:
        """The agent's probe through a session kept open per machine: repeated polls do not
        start a Python each time. A broken session is dropped and the call made afresh."""
        key = machine_key(host)
        agent = self.agent(host)
        session = self._sessions.pop(key, None)
        try:
            session = session or agent.session()
            answer = session.request({"verb": "probe", "args": run_dirs}, timeout=30)
        except HostError:
            if session is not None:
                session.close()
            return agent.probe(run_dirs)
        self._sessions[key] = session
        return answer

    @staticmethod
    def group(hosts: Iterable[Host]) -> dict[MachineKey, list[Host]]:
        groups: dict[MachineKey, list[Host]] = {}
        for host in hosts:
            groups.setdefault(machine_key(host), []).append(host)
        return groups

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()

    def __enter__(self) -> Machines:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
