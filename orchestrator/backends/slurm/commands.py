"""Slurm's commands (sbatch, squeue, scontrol, scancel, sinfo, srun) and their answers, parsed.

The parsers are pure; `Slurm` runs the commands through a Runner on the login node (this
machine, or `slurm.login:` over SSH), with argument lists, never a shell.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.contract import ISOLATED
from orchestrator.errors import HostError
from orchestrator.hostside import withenv
from orchestrator.machines.hostclient import host_program
from orchestrator.machines.runner import CommandResult, Runner

SLURM = "slurm"  # the name errors carry: the scheduler, not one host
WITH_ENV = "withenv.py"  # hostside/withenv.py: a command with environment from stdin
# Job states in which the job's tasks may still run (squeue's long names).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                           "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT"})  # fmt: skip
UNUSABLE_NODE_STATES = ("down", "drain", "fail", "maint", "unk", "futr", "npc", "inval", "boot")


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # RUNNING, COMPLETED, FAILED, CANCELLED, ... ("UNKNOWN": Slurm forgot it)
    reason: str | None = None
    exit_code: int | None = None  # the batch script's
    signal: int | None = None
    nodes: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def parse_sbatch(stdout: str) -> str:
    """`sbatch --parsable` prints 'JOBID' or 'JOBID;CLUSTER'."""
    job_id = stdout.strip().splitlines()[-1].split(";")[0] if stdout.strip() else ""
    if not job_id.isdigit():
        raise ValueError(f"sbatch printed no job id: {stdout!r}")
    return job_id


def parse_scontrol_job(text: str) -> dict[str, str]:
    """`scontrol show job -o ID`: Key=Value pairs on one line."""
    return dict(re.findall(r"(\w[\w/:]*)=(\S*)", text))


def job_state(job_id: str, fields: dict[str, str]) -> JobState:
    code, _, signal = fields.get("ExitCode", "").partition(":")
    reason = fields.get("Reason")
    return JobState(
        job_id,
        fields.get("JobState", "UNKNOWN"),
        None if reason in (None, "None") else reason,
        int(code) if code.isdigit() else None,
        int(signal) if signal.isdigit() and signal != "0" else None,
        fields.get("NodeList") or None,
    )


def parse_node_states(stdout: str) -> dict[str, str]:
    """`sinfo -h -N -o '%N %t'`: node -> short state (idle, mix, alloc, drain*, ...)."""
    states = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def usable(state: str) -> bool:
    return not state.rstrip("*~#!%$@^-").startswith(UNUSABLE_NODE_STATES) and "*" not in state


class Slurm:
    def __init__(self, runner: Runner | Callable[[], Runner]) -> None:
        # A callable: the login node's connection, asked for at each command, so a connection
        # that was dropped after a silent poll is replaced (machines.pool, Machines._forget).
        self._runner = runner

    @property
    def runner(self) -> Runner:
        return self._runner if isinstance(self._runner, Runner) else self._runner()

    def run(self, argv: list[str], timeout: float = 60.0) -> CommandResult:
        return self.runner.run(argv, timeout=timeout)

    def submit(
        self,
        script_path: str,
        export_all: bool = False,
        secrets: Mapping[str, str] | None = None,
        python: str = "python3",
    ) -> str:
        """`export_all`: --export=ALL, so this environment (secrets included) reaches the tasks
        whatever SBATCH_EXPORT says; only variable names ever appear on the command line.
        `secrets`: values for sbatch's environment on the login node (slurm.login), sent on
        the SSH channel's standard input to withenv.py run by `python` there."""
        export = ["--export=ALL"] if export_all else []
        argv = ["sbatch", "--parsable", *export, script_path]
        result = self._run_with_env(argv, secrets, python) if secrets else self.run(argv)
        if not result.ok:
            raise HostError(SLURM, f"sbatch refused the job: {result.tail(3)}",
                            hint="check slurm.partition, slurm.account, slurm.time and "
                            "slurm.sbatch_args ('sinfo' lists the partitions)")  # fmt: skip
        try:
            return parse_sbatch(result.stdout)
        except ValueError as exc:
            raise HostError(SLURM, str(exc)) from exc

    def _run_with_env(
        self, argv: list[str], env: Mapping[str, str], python: str, timeout: float = 60.0
    ) -> CommandResult:
        runner = self.runner
        session = runner.session([python, *ISOLATED, "-c", host_program(WITH_ENV)])
        try:
            request = {withenv.ARGV_KEY: argv, withenv.ENV_KEY: dict(env),
                       withenv.TIMEOUT_KEY: timeout}  # fmt: skip
            answer = session.request(request, timeout=timeout + 30)
        finally:
            session.close()
        if withenv.ERROR_KEY in answer:
            raise HostError(runner.host_name, f"cannot run {argv[0]} with job.secret_env's "
                            f"values: {answer[withenv.ERROR_KEY]}")  # fmt: skip
        return CommandResult(runner.host_name, tuple(argv), int(answer[withenv.RETURNCODE_KEY]),
                             str(answer[withenv.STDOUT_KEY]),
                             str(answer[withenv.STDERR_KEY]))  # fmt: skip

    def state(self, job_id: str) -> JobState:
        result = self.run(["scontrol", "show", "job", "-o", job_id], timeout=30)
        if not result.ok:
            if "Invalid job id" in result.stderr:
                return JobState(job_id, "UNKNOWN", "Slurm no longer knows the job")
            raise HostError(SLURM, f"scontrol show job {job_id}: {result.tail(2)}")
        return job_state(job_id, parse_scontrol_job(result.stdout))

    def signal(self, job_id: str, name: str) -> None:
        # Without --batch/--full the signal goes to the job's steps: srun's tasks, the workers.
        self.run(["scancel", f"--signal={name}", job_id], timeout=30)

    def cancel(self, job_id: str) -> None:
        result = self.run(["scancel", job_id], timeout=30)
        if not result.ok and "already completing or completed" not in result.stderr:
            raise HostError(SLURM, f"scancel {job_id}: {result.tail(2)}")
