"""The Backend for workers that Slurm places: one batch job per attempt.

`start` writes the attempt's batch script (script.py) into the attempt directory on the shared
filesystem and submits it; the job id goes beside it (and into the run record). The workers'
files are read where they are, through the login node, so probing, logs and checkpoints use the
host backend's file operations; whether a task may still be running comes from Slurm
(scontrol), not from a process id. `stop` sends SIGTERM to the job's tasks (the built-in loop
saves a checkpoint and exits) and cancels the job after the grace.

The login node is this machine, or `slurm.login:`'s machine: then one SSH connection (the SSH
kind's runner, the same host-key checks) carries every Slurm command and every file operation,
and each task's host stands for that machine here.
"""

from __future__ import annotations

import posixpath
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.backends.base import Backend, Scheduler
from orchestrator.backends.slurm.commands import SLURM, JobState, Slurm
from orchestrator.backends.slurm.script import batch_script, exports_all
from orchestrator.errors import HostError
from orchestrator.fanout import GroupResult
from orchestrator.hostside import rundir
from orchestrator.machines.kinds import kind_of
from orchestrator.machines.pool import Machines, expand_uploads
from orchestrator.machines.runner import LocalRunner, Runner
from orchestrator.model.answers import (
    BY_DOWN,
    CheckpointListing,
    ExitRecord,
    FileListing,
    SetAside,
    StackAnswer,
    StopAnswer,
    WorkerProbe,
)
from orchestrator.model.findings import CHECK, Finding, PreflightOptions, PreflightReport, Status
from orchestrator.model.inventory import DEFAULT_CONNECTION, WorkerSlot
from orchestrator.model.records import SchedulerState
from orchestrator.model.slurm import SlurmSpec
from orchestrator.model.workers import Started

if TYPE_CHECKING:
    from orchestrator.model.inventory import Inventory, Job, LoginDetails
    from orchestrator.model.records import RunRecord, WorkerRecord
    from orchestrator.model.workers import WorkerSpec

JOB_ID_FILE = "slurm-job-id"
SCRIPT_FILE = "batch.sh"


def attempt_dir(run_dir: str) -> str:
    """Every task's run directory is {attempt}/{task}: the job's files sit in {attempt}."""
    return posixpath.dirname(run_dir)


def login_host(spec: SlurmSpec) -> WorkerSlot | None:
    """The login node of `slurm.login:` as a host of the SSH kind (None: this machine)."""
    login = spec.login
    if login is None:
        return None
    return WorkerSlot(name=login.name, address=login.address, port=spec.port,
                      connection=DEFAULT_CONNECTION, python=login.python, workdir=spec.workdir,
                      settings=login.settings)  # fmt: skip


class SlurmBackend(Backend, Scheduler):
    resubmits_preempted = True
    shared_checkpoints = True
    restarts_in_place = True  # a task's launcher: the allocation stays, so do its address

    @classmethod
    def for_inventory(cls, inventory: Inventory | None) -> SlurmBackend:
        spec = inventory.source_settings if inventory is not None else None
        if inventory is None or not isinstance(spec, SlurmSpec):
            raise ValueError("a Slurm backend serves an inventory with its `slurm:` block")
        return cls(spec, inventory.job)

    @property
    def scheduler(self) -> Scheduler:
        return self

    def __init__(self, spec: SlurmSpec, job: Job, runner: Runner | None = None) -> None:
        self.spec = spec
        self.job = job
        self.files = Machines()  # the shared filesystem, as the login node sees it
        self.login = login_host(spec)
        login = self.login
        if runner is None and login is not None:
            self.slurm = Slurm(lambda: self.files.runner(login))  # one connection for all
        else:
            self.slurm = Slurm(runner or LocalRunner(SLURM))

    def close(self) -> None:
        self.files.close()
        if self.login is None:
            self.slurm.runner.close()

    def _at(self, host: WorkerSlot) -> WorkerSlot:
        """Where a task's files are read: the login node (a task's host stands for it)."""
        return self.login or host

    def _seen(self, worker: WorkerRecord) -> WorkerRecord:
        return replace(worker, host=self.login) if self.login else worker

    # --- an attempt's workers ------------------------------------------------------------------
    def workdirs(self, hosts: Sequence[WorkerSlot]) -> GroupResult[str, str]:
        if self.login is None:
            return self.files.workdirs(hosts)
        found = self.files.workdirs([self.login])
        if found.failed:
            error = found.failed[self.login.name]
            return GroupResult(failed={host.name: error for host in hosts})
        workdir = found.ok[self.login.name]  # slurm.workdir, resolved on the login node
        return GroupResult(ok={host.name: workdir for host in hosts})

    def start(self, specs: Sequence[WorkerSpec]) -> GroupResult[str, Started]:
        directory = attempt_dir(specs[0].run_dir)
        script = batch_script(self.spec, self.job, specs,
                              output=posixpath.join(directory, "slurm-%j.out"))  # fmt: skip
        chief = self._at(specs[0].host)
        # runs/ down to the attempt directory: private before the script (the job's env) lands,
        # checked by the agent (this account's, no link, 0700) as on hosts, else exit 3.
        self.files.agent(chief).make_dirs([], list(specs[0].private_dirs[:-1]))
        for spec in specs:  # a script and job.files, when the login node is another machine
            if spec.uploads:
                self.files.agent(chief).make_dirs([], list(spec.private_dirs))
                self.files.upload(chief, expand_uploads(spec.uploads))
        self._write(chief, posixpath.join(directory, SCRIPT_FILE), script)
        export_all = bool(self.job.secret_env) and exports_all(self.spec)
        # Through a login node, sbatch runs in its SSH session: the secrets go to sbatch's
        # environment on the channel's standard input. Here they are in this environment.
        secrets = dict(specs[0].secrets) if self.login else None
        python = self.login.python if self.login else "python3"
        job_id = self.slurm.submit(posixpath.join(directory, SCRIPT_FILE), export_all, secrets,
                                   python)  # fmt: skip
        self._write(chief, posixpath.join(directory, JOB_ID_FILE), job_id + "\n")
        return GroupResult(ok={spec.name: Started(job_id=job_id) for spec in specs})

    def _write(self, host: WorkerSlot, path: str, text: str) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".tmp", delete=False) as handle:
            handle.write(text)
        try:
            self.files.upload(self._at(host), [(handle.name, path)])
        finally:
            Path(handle.name).unlink(missing_ok=True)

    def job_of(self, worker: WorkerRecord) -> str | None:
        text = self.read_text(worker.host, posixpath.join(attempt_dir(worker.run_dir),
                                                          JOB_ID_FILE))  # fmt: skip
        return text.strip() if text and text.strip().isdigit() else None

    def _states(self, workers: Sequence[WorkerRecord]) -> dict[str, JobState | None]:
        """The Slurm job of each worker's attempt (None: never submitted)."""
        jobs: dict[str, str | None] = {w.name: self.job_of(w) for w in workers}
        states = {job: self.slurm.state(job) for job in set(jobs.values()) if job}
        return {name: states[job] if job else None for name, job in jobs.items()}

    def probe(self, workers: Sequence[WorkerRecord]) -> GroupResult[str, WorkerProbe]:
        # Slurm first, the files after: a task that wrote its exit record just before its job
        # completed is then never read as "ended without one" (seen: files, then COMPLETED).
        try:
            states = self._states(workers)
        except HostError as error:
            return GroupResult(failed={w.name: error for w in workers})
        files = self.files.probe([self._seen(w) for w in workers])
        ok: dict[str, WorkerProbe] = {}
        for worker in workers:
            if worker.name in files.ok:
                node = self.read_text(worker.host,
                                      posixpath.join(worker.run_dir, rundir.NODE_FILE))  # fmt: skip
                ok[worker.name] = task_probe(files.ok[worker.name], states[worker.name],
                                             node.strip() if node else None)  # fmt: skip
        return GroupResult(ok=ok, failed=files.failed)

    def stop(
        self, workers: Sequence[WorkerRecord], grace: float, by: str = BY_DOWN
    ) -> GroupResult[str, StopAnswer]:
        states = self._states(workers)
        for worker in workers:  # so the workers' ending reads as stopped, not failed
            state = states[worker.name]
            if state is not None and state.active:
                self._write(worker.host, posixpath.join(worker.run_dir, rundir.STOP_FILE),
                            rundir.stop_request(by))  # fmt: skip
        outcome: dict[str, StopAnswer] = {}
        for job in {s.job_id for s in states.values() if s is not None and s.active}:
            outcome_of_job = self._stop_job(job, grace)
            for name, state in states.items():
                if state is not None and state.job_id == job:
                    outcome[name] = outcome_of_job
        return GroupResult(ok={w.name: outcome.get(w.name, StopAnswer("not running"))
                               for w in workers})  # fmt: skip

    def _stop_job(self, job: str, grace: float) -> StopAnswer:
        if self.slurm.state(job).state == "PENDING":
            self.slurm.cancel(job)
            return StopAnswer("stopped")
        self.slurm.signal(job, "TERM")  # the workers save a checkpoint at one step and exit
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not self.slurm.state(job).active:
                return StopAnswer("stopped")
            time.sleep(0.3)
        self.slurm.cancel(job)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.slurm.state(job).active:
            time.sleep(0.3)
        return StopAnswer("killed")

    def stacks(
        self, workers: Sequence[WorkerRecord], wait: float, native: bool = False
    ) -> GroupResult[str, StackAnswer]:
        """`scancel --signal=USR2` reaches every task (the launcher passes it on to the worker
        too); the dumps are read from the shared filesystem through the login node, past the
        sizes its files had before the signal."""
        deadline = time.monotonic() + wait
        try:
            states = self._states(workers)
        except HostError as error:
            return GroupResult(failed={w.name: error for w in workers})
        running = [w for w in workers if (s := states[w.name]) is not None and s.state == "RUNNING"]
        answers = {w.name: StackAnswer(error="its Slurm job is not running") for w in workers
                   if w not in running}  # fmt: skip
        if running:
            agent = self.files.agent(self._at(running[0].host))
            run_dirs = [w.run_dir for w in running]
            offsets = agent.stack_offsets(run_dirs)
            for job in {states[w.name].job_id for w in running if states[w.name]}:  # type: ignore[union-attr]
                self.slurm.signal(job, "USR2")
            left = max(deadline - time.monotonic(), 0.5)
            found = agent.stacks(run_dirs, left, send=False, offsets=offsets)
            why_not = ("py-spy would have to run on the task's node; orchestrate reaches only "
                       "the login node on Slurm") if native else None  # fmt: skip
            for worker in running:
                answer = found.get(worker.run_dir, StackAnswer(error="it did not answer"))
                answers[worker.name] = replace(answer, native=why_not)
        return GroupResult(ok=answers)

    def log_lines(self, worker: WorkerRecord, lines: int) -> list[str]:
        return self.files.log_lines(self._seen(worker), lines)

    def follow_log(self, worker: WorkerRecord, lines: int) -> Iterator[str]:
        return self.files.follow_log(self._seen(worker), lines)

    def scheduler_state(self, record: RunRecord) -> SchedulerState | None:
        if not record.workers:
            return None
        where = SchedulerState("slurm", "NOT SUBMITTED", jobs=record.scheduler_jobs,
                               login=self.login.name if self.login else None)  # fmt: skip
        try:
            state = self._states(record.workers[:1])[record.workers[0].name]
        except HostError as error:  # the workers show as unknown; say why here too
            return replace(where, state="UNKNOWN", reason=error.message)
        if state is None:
            return where
        return replace(where, job_id=state.job_id, state=state.state, reason=state.reason,
                       exit_code=state.exit_code, signal=state.signal,
                       nodes=state.nodes)  # fmt: skip

    # --- files on the shared filesystem --------------------------------------------------------
    def checkpoint(self, host: WorkerSlot, directory: str) -> CheckpointListing:
        return self.files.checkpoint(self._at(host), directory)

    def adopt_checkpoint(
        self, host: WorkerSlot, directory: str, name: str, checkpoints: Sequence[str]
    ) -> None:
        self.files.adopt_checkpoint(self._at(host), directory, name, checkpoints)

    def set_aside(self, host: WorkerSlot, directory: str, stamp: str) -> SetAside:
        return self.files.set_aside(self._at(host), directory, stamp)

    def list_files(self, host: WorkerSlot, directory: str) -> FileListing:
        return self.files.list_files(self._at(host), directory)

    def read_text(self, host: WorkerSlot, path: str) -> str | None:
        return self.files.read_text(self._at(host), path)

    def download(self, host: WorkerSlot, remote: str, local: str) -> None:
        self.files.download(self._at(host), remote, local)

    def upload(self, host: WorkerSlot, files: Sequence[tuple[str, str]]) -> None:
        self.files.upload(self._at(host), files)

    # --- reaching hosts ------------------------------------------------------------------------
    def unreachable(self, hosts: Sequence[WorkerSlot]) -> dict[str, str]:
        return {}  # Slurm places every attempt on nodes that answer; there is no host to lose

    def reads_in_place(self, host: WorkerSlot) -> bool:
        return self.login is None  # the files are on this machine when it is the login node

    def login_details(self, host: WorkerSlot) -> LoginDetails | None:
        return kind_of(host).login_details(host)  # a task's host stands for the login node

    def preflight(self, inventory: Inventory, options: PreflightOptions = CHECK) -> PreflightReport:
        """Slurm's own checks (checks.py): its nodes are not known before the job runs."""
        from orchestrator.backends.slurm.checks import slurm_preflight

        report = slurm_preflight(inventory, self.slurm, self.files, options.probe_timeout,
                                 self.login)  # fmt: skip
        if not options.perf:
            return report
        # The check's srun lands on whichever nodes are free now, not the job's: their speed
        # would say nothing about the nodes a later sbatch gets.
        skipped = Finding(SLURM, "compute", Status.OK, "performance round not measured on "
                          "Slurm: the job's nodes are not known before it starts")  # fmt: skip
        return PreflightReport((*report.findings, skipped))


def task_probe(files: WorkerProbe, job: JobState | None, node: str | None) -> WorkerProbe:
    """A task's files, with liveness from Slurm: running while its job is active and it has not
    recorded an exit; a job that ended without the task's exit record is the task's failure."""
    if job is not None and job.state == "PENDING" and files.exit is None:
        return replace(files, alive=False, usage=None, node=node, queued=job.reason or "PENDING")
    alive = job is not None and job.active and files.exit is None
    probe = replace(files, alive=alive, usage=None, node=node)
    if files.exit is None and not alive:
        if job is None:
            error = "its batch job was never submitted"
        else:
            why = f" ({job.reason})" if job.reason else ""
            error = f"Slurm job {job.job_id} ended {job.state}{why} before the task's exit"
        code = -(job.signal) if job and job.signal else (job.exit_code if job else None) or 1
        exit_record = ExitRecord(returncode=code, finished_at=files.now, error=error)
        probe = replace(probe, exists=True, pid=probe.pid or 0, exit=exit_record)
    return probe
