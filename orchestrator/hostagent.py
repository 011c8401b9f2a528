"""Calls the host-side agent (orchestrator/agent.py) through a Runner: one round trip per verb."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from orchestrator.errors import HostError
from orchestrator.runner import LineSession, Runner


@cache
def host_program(name: str) -> str:
    """The source of a stdlib-only program that runs on hosts (agent.py, hostprobe.py)."""
    return resources.files("orchestrator").joinpath(name).read_text(encoding="utf-8")


def agent_source() -> str:
    return host_program("agent.py")


class HostAgent:
    def __init__(self, runner: Runner, python: str) -> None:
        self.runner = runner
        self.python = python

    def _call(self, verb: str, *args: str, timeout: float = 60.0, program: str = "agent.py") -> Any:
        argv = [self.python, "-c", host_program(program), verb, *args]
        result = self.runner.run(argv, timeout=timeout)
        if not result.ok:
            raise HostError(
                self.runner.host_name,
                f"'{self.python} <agent> {verb}' exited {result.exit_code}: {result.tail(5)}",
                hint=f"check that '{self.python}' is a working Python 3 on that host",
            )
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise HostError(
                self.runner.host_name, f"the agent's '{verb}' answer was not JSON: {result.tail(3)}"
            ) from exc

    def info(self) -> dict[str, Any]:
        return dict(self._call("info", timeout=30))

    def launch(self, spec: dict[str, Any]) -> dict[str, Any]:
        payload = dict(spec, agent_source=agent_source())
        # An argument rather than stdin: every runner call stays a plain argument list.
        return dict(self._call("launch", json.dumps(payload), timeout=60))

    def probe(self, run_dirs: list[str]) -> dict[str, Any]:
        return dict(self._call("probe", *run_dirs, timeout=30))

    def checkpoint(self, directory: str) -> dict[str, Any]:
        return dict(self._call("checkpoint", directory, timeout=30))

    def adopt_checkpoint(self, directory: str, name: str) -> dict[str, Any]:
        return dict(self._call("adopt-checkpoint", directory, name, timeout=30))

    def session(self) -> LineSession:
        """agent.py serving requests until the session closes (see its `session` verb)."""
        return self.runner.session([self.python, "-c", agent_source(), "session"])

    def preflight_session(self) -> LineSession:
        """hostprobe.py serving requests (inspect, connect, cleanup) until the session closes."""
        return self.runner.session([self.python, "-c", host_program("hostprobe.py"), "session"])

    def files(self, directory: str) -> dict[str, Any]:
        return dict(self._call("files", directory, timeout=60))

    def stop(self, run_dirs: list[str], grace: float) -> dict[str, Any]:
        return dict(self._call("stop", "--grace", str(grace), *run_dirs, timeout=grace + 30))
