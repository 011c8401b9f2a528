"""The host client: calls the host-side programs (hostside/agent.py, hostprobe.py, leases.py)
through a Runner and parses their answers.

The programs read requests as JSON lines on standard input and answer each with one line, so a
call is: start `python -c SOURCE`, send the request, read the answer. Nothing of a request is ever
on a command line. A long-lived session serves many requests for one process start.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from orchestrator.contract import CHECKPOINT_COMPANIONS, ISOLATED
from orchestrator.errors import HostError
from orchestrator.hostside import protocol
from orchestrator.hostside.bundle import shipped_program
from orchestrator.machines.runner import LineSession, Runner
from orchestrator.model.answers import (
    BY_DOWN,
    CheckpointListing,
    FileListing,
    HostInfo,
    SetAside,
    StackAnswer,
    StandbyInfo,
    StopAnswer,
    WorkerProbe,
    parse_probe,
    parse_stacks,
    parse_standbys,
    parse_stop,
    parsed,
)

T = TypeVar("T")
# The host programs, by their file in orchestrator/hostside/.
AGENT = "agent.py"
HOSTPROBE = "hostprobe.py"
LEASES = "leases.py"
STACKS_ANSWER_MARGIN = 0.5  # seconds of a stacks request left for the answer's way back


@cache
def host_program(name: str) -> str:
    """A stdlib-only program that runs on hosts (agent.py, hostprobe.py) as it is sent: with
    the modules it imports (bundle.py)."""
    return shipped_program(name)


def agent_source() -> str:
    return host_program(AGENT)


def request(session: LineSession, verb: str, wait: float, /, **fields: Any) -> dict[str, Any]:
    """One request on an open session, answered within `wait` seconds; an {"error": ...}
    answer becomes a HostError."""
    return ask(session, "agent", verb, wait, fields)


def ask(
    session: LineSession, program: str, verb: str, wait: float, fields: dict[str, Any]
) -> dict[str, Any]:
    """`request` of a named program: its refusal says which program refused."""
    answer = session.request({protocol.VERB: verb, **fields}, timeout=wait)
    if protocol.ERROR_KEY in answer:
        error = answer[protocol.ERROR_KEY]
        raise HostError(session.host_name, f"the {program} could not {verb}: {error}")
    return answer


Ask = Callable[[str, float, dict[str, Any]], dict[str, Any]]  # verb, timeout, fields -> answer


class HostAgent:
    """The agent's verbs, typed. `ask` sends one request: by default through a session of its
    own (a Python start per call); Machines passes one that uses the machine's kept session."""

    def __init__(self, runner: Runner, python: str, ask: Ask | None = None) -> None:
        self.runner = runner
        self.python = python
        self._ask = ask or self._ask_once

    def session(self, program: str = AGENT) -> LineSession:
        """The program serving requests until the session closes."""
        return self.runner.session([self.python, *ISOLATED, "-c", host_program(program)])

    def _ask_once(self, verb: str, timeout: float, fields: dict[str, Any]) -> dict[str, Any]:
        session = self.session()
        try:
            return request(session, verb, timeout, **fields)
        finally:
            session.close()

    def _call(self, verb: str, parse: Callable[[dict[str, Any]], T], timeout: float = 60.0,
              **fields: Any) -> T:  # fmt: skip
        return parsed(self.runner.host_name, parse, self._ask(verb, timeout, fields))

    def info(self) -> HostInfo:
        return self._call(protocol.INFO, HostInfo.parse, timeout=30)

    def launch(self, spec: dict[str, Any]) -> int:
        spec = dict(spec, agent_source=agent_source())
        return self._call(protocol.LAUNCH, lambda answer: int(answer[protocol.PID_KEY]), spec=spec)

    def probe(self, run_dirs: list[str]) -> dict[str, WorkerProbe]:
        return self._call(protocol.PROBE, parse_probe, timeout=30, run_dirs=run_dirs)

    def checkpoint(self, directory: str) -> CheckpointListing:
        return self._call(protocol.CHECKPOINT, CheckpointListing.parse, timeout=30,
                          directory=directory, companions=list(CHECKPOINT_COMPANIONS))  # fmt: skip

    def adopt_checkpoint(self, directory: str, name: str, checkpoints: list[str]) -> None:
        self._call(protocol.ADOPT_CHECKPOINT, dict, timeout=30, directory=directory, name=name,
                   checkpoints=checkpoints)  # fmt: skip

    def set_aside(self, directory: str, stamp: str) -> SetAside:
        return self._call(protocol.SET_ASIDE, SetAside.parse, timeout=60, directory=directory,
                          stamp=stamp)  # fmt: skip

    def files(self, directory: str) -> FileListing:
        return self._call(protocol.FILES, FileListing.parse, directory=directory)

    def make_dirs(self, directories: list[str], private: list[str]) -> None:
        """Create `directories` (parents too) and the run's `private` ones (0700)."""
        self._call(protocol.MAKE_DIRS, dict, timeout=30, directories=directories,
                   private_dirs=private)  # fmt: skip

    def standby(self, specs: list[dict[str, Any]]) -> dict[str, str]:
        """Start (or keep) a standby per spec; what happened, by the run directory it backs."""
        specs = [dict(spec, agent_source=agent_source()) for spec in specs]
        return self._call(protocol.STANDBY, _string_map(protocol.STANDBYS_KEY), specs=specs)

    def discard_standbys(self, run_dirs: list[str]) -> dict[str, str]:
        return self._call(protocol.DISCARD_STANDBYS, _string_map(protocol.OUTCOME_KEY),
                          timeout=30, run_dirs=run_dirs)  # fmt: skip

    def linger_standbys(self, run_dirs: list[str], seconds: float) -> dict[str, str]:
        """The run ended: its slots' standbys stay `seconds` for the job's next run."""
        return self._call(protocol.LINGER_STANDBYS, _string_map(protocol.OUTCOME_KEY),
                          timeout=30, run_dirs=run_dirs, seconds=seconds)  # fmt: skip

    def standbys(self, job_dirs: list[str]) -> dict[str, list[StandbyInfo]]:
        """The standbys alive in each job directory (lingering or waiting for a restart)."""
        return self._call(protocol.STANDBYS, parse_standbys, timeout=30, job_dirs=job_dirs)

    def leases(self, verb: str, timeout: float = 60.0, **fields: Any) -> dict[str, Any]:
        """One request to the lease program (leases.py: acquire, release, list), in a session
        of its own: the claims it takes pass to a keeper that outlives the session."""
        session = self.session(LEASES)
        try:
            return ask(session, "lease program", verb, timeout, fields)
        finally:
            session.close()

    def stop(self, run_dirs: list[str], grace: float, by: str = BY_DOWN) -> dict[str, StopAnswer]:
        return self._call(protocol.STOP, parse_stop, timeout=grace + 30, run_dirs=run_dirs,
                          grace=grace, by=by)  # fmt: skip

    def stacks(
        self,
        run_dirs: list[str],
        wait: float,
        *,
        native: bool = False,
        send: bool = True,
        offsets: dict[str, int] | None = None,
    ) -> dict[str, StackAnswer]:
        """Each worker's stacks (SIGUSR2, then its stacks.txt), the answer within `wait`
        seconds (the agent waits for the dumps a little less, to answer in time); without
        `send`, what was appended past `offsets` (stack_offsets') after a signal sent else.
        `native` (py-spy) may take longer: its own few seconds."""
        waits = max(wait - STACKS_ANSWER_MARGIN, 0.5)
        timeout = max(wait, waits + 0.2) + (10.0 if native else 0.0)
        return self._call(protocol.STACKS, parse_stacks, timeout, run_dirs=run_dirs, wait=waits,
                          native=native, send=send, offsets=offsets or {})  # fmt: skip

    def stack_offsets(self, run_dirs: list[str]) -> dict[str, int]:
        def parse(answer: dict[str, Any]) -> dict[str, int]:
            return {str(k): int(v) for k, v in answer[protocol.OFFSETS_KEY].items()}

        return self._call(protocol.STACKS, parse, 30, run_dirs=run_dirs, mark=True)


def _string_map(key: str) -> Callable[[dict[str, Any]], dict[str, str]]:
    def parse(answer: dict[str, Any]) -> dict[str, str]:
        return {str(k): str(v) for k, v in answer[key].items()}

    return parse
