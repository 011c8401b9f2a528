"""The one failure classification: from what a worker left behind to a kind, a signature and
whether a restart can help. Pure.

Supervision, the root-cause report and (later) the Slurm backend all read failures through here;
none keeps its own rules. A kind is decided from the exit record (code, signal) and the last lines
of the log, where TensorFlow and Python name the cause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchestrator.contract import EXIT_PREEMPTED, EXIT_USAGE, install_hint
from orchestrator.model.vocabulary import FailureKind

# What each kind means, for people: the manual's failure reference is generated from this and
# HINTS (docs/hooks/reference.py), so a new kind arrives with its entry.
MEANINGS: dict[FailureKind, str] = {
    FailureKind.KILLED: "a signal, usually SIGKILL from a person or the OOM killer",
    FailureKind.PREEMPTED: "saved a checkpoint on SIGTERM and exited 75",
    FailureKind.STALLED: (
        "no first step within start_timeout, or no new step for stall_timeout after it"
    ),
    FailureKind.NOT_STARTED: "its supervisor never came up",
    FailureKind.UNREACHABLE: "its host stopped answering",
    FailureKind.VANISHED: "its process disappeared without an exit record",
    FailureKind.USAGE: "the worker refused its flags, TF_CONFIG or task (exit 2)",
    FailureKind.IMPORT_ERROR: "a module the script needs is missing on the host",
    FailureKind.KERAS_API: "Keras 2 code under Keras 3",
    FailureKind.OUT_OF_MEMORY: "the worker ran out of memory (ResourceExhaustedError, MemoryError)",
    FailureKind.DISK_FULL: "a write failed for lack of space (No space left on device, a quota)",
    FailureKind.PORT_BUSY: "the gRPC server could not bind its port",
    FailureKind.PEER_LOST: "a collective failed because another worker went away",
    FailureKind.COORDINATOR_UNREACHABLE: (
        "a JAX process (job.keras: jax) timed out registering with the coordinator on the "
        "chief's host:port: the coordinator unreachable, or a peer that never registered"
    ),
    FailureKind.COLLECTIVES_UNREACHABLE: (
        "a JAX process's gloo collectives (job.keras: jax) could not connect to a peer at the "
        "address the peer announced: its host name resolving to loopback, or a firewall "
        "closing the ports gloo listens on"
    ),
    FailureKind.EARLY_EXIT: "exit 0 below the target step",
    FailureKind.LEFT_EARLY: (
        "exited 0 while its peers still waited for it in a collective, or never joined the "
        "cluster (it never listened on its TensorFlow port)"
    ),
    FailureKind.STOPPED_SHORT: "a script exited 0 below the job's steps: target",
    FailureKind.BAD_PROGRESS: (
        "exited 0 with a progress whose step is no step number (NaN, a string): no success "
        "can be shown"
    ),
    FailureKind.CRASHED: "any other non-zero exit",
}


# A worker of a multi-worker job that exited 0 without ever listening on its TensorFlow port.
NEVER_JOINED = (
    "never joined the cluster: does the script create MultiWorkerMirroredStrategy before any "
    "other TensorFlow op?"
)


# Failures that a restart cannot heal: the same code on the same host fails the same way.
# (Usage errors are also exit code 2, which the job lists as permanent by default; listing the
# kind here keeps them permanent when a job empties permanent_exit_codes.)
DETERMINISTIC = frozenset(
    {FailureKind.IMPORT_ERROR, FailureKind.KERAS_API, FailureKind.USAGE, FailureKind.LEFT_EARLY,
     FailureKind.STOPPED_SHORT, FailureKind.BAD_PROGRESS}
)  # fmt: skip

# What to do about each kind, for people: `up`'s root cause, `status`, the dashboard.
HINTS: dict[FailureKind, str] = {
    FailureKind.KERAS_API: (
        "this is tf.keras 2 code (Keras 2 APIs, or model.fit under MultiWorkerMirroredStrategy) "
        "running on Keras 3: set job.keras: legacy in the inventory, and install tf-keras of "
        f"TensorFlow's version on every host ({install_hint('legacy-keras', 'there')})"
    ),
    FailureKind.IMPORT_ERROR: (
        "a module the worker imports is missing on its host: a module of your own goes under "
        "job.files: (uploaded next to the script); a package must be installed into the Python "
        "named by python: on every host"
    ),
    FailureKind.PORT_BUSY: (
        "another process holds the worker's TensorFlow port: 'orchestrate check INVENTORY' "
        "names it; stop it, or give the host another port:"
    ),
    FailureKind.PEER_LOST: (
        "its collective was aborted because a peer went away; the worker that failed first is "
        "the cause: read its log ('orchestrate tail NAME')"
    ),
    FailureKind.COORDINATOR_UNREACHABLE: (
        "the JAX cluster did not form within jax.distributed.initialize's timeout (300 s; the "
        "coordinator and its peers print the same): a worker that failed earlier is the cause; "
        "otherwise the chief's host:port must be open to every host (a firewall, a proxy "
        "variable in the workers' environment): 'orchestrate check INVENTORY'"
    ),
    FailureKind.COLLECTIVES_UNREACHABLE: (
        "gloo tells each peer the address its host's own name resolves to: every host's name "
        "must resolve there to an address the other hosts reach, not 127.0.x.x ('orchestrate "
        "check INVENTORY': the gloo check), and the hosts must accept connections from each "
        "other on gloo's own ports too, besides the inventory's"
    ),
    FailureKind.OUT_OF_MEMORY: (
        "the worker ran out of memory: lower job.batch_size or the model's size; on GPUs set "
        "gpu_memory_growth: true or gpu_memory_limit_mb (a script sets its own tf.config), and "
        "keep other programs off the host"
    ),
    FailureKind.KILLED: (
        "killed by a signal: by a person, or (SIGKILL, exit 137) by the kernel's OOM killer when "
        "the host ran out of memory ('dmesg' on the host says so): then lower job.batch_size, "
        "or on GPUs set gpu_memory_growth or gpu_memory_limit_mb"
    ),
    FailureKind.DISK_FULL: "free space on the host, or point checkpoint_dir at a larger disk",
    FailureKind.EARLY_EXIT: (
        "the worker exited 0 before the target step it reported: check the script's loop and "
        "its step count (target_steps in its progress), or that it resumes at the right step"
    ),
    FailureKind.LEFT_EARLY: (
        "every worker must create the same tf.distribute.MultiWorkerMirroredStrategy first and "
        "run to the end together: a script that exits, or skips the strategy, on one worker "
        "leaves its peers waiting for it in their collectives; one that never creates it "
        "trains alone and never joins the cluster"
    ),
    FailureKind.STOPPED_SHORT: (
        "the script exited 0 before the job's steps: (its target, in ORCHESTRATE_TARGET_STEPS "
        "and worker.target_steps()): make its loop run to that step and report it "
        "(worker.report(step=...)), resume at the checkpoint's step, or lower steps:"
    ),
    FailureKind.BAD_PROGRESS: (
        "the script reported a step that is no number: report an integer step "
        "(worker.report(step=...)), or none at all"
    ),
    FailureKind.STALLED: (
        "no first step within start_timeout, or no new step for stall_timeout after it (the "
        "reason names the limit): a peer that never joined or hangs blocks every worker; "
        "raise start_timeout if starting (the import, the cluster forming, the first step) "
        "really takes that long, stall_timeout if a step does"
    ),
    FailureKind.NOT_STARTED: "its host could not start the worker: 'orchestrate check INVENTORY'",
    FailureKind.UNREACHABLE: "its host stopped answering: check the machine and its network",
    FailureKind.USAGE: "the worker refused its flags, TF_CONFIG or task: fix what its log names",
    FailureKind.PREEMPTED: (
        "SIGTERM (a cloud VM or a scheduler taking its machine back, or 'orchestrate down') made "
        "every worker save a checkpoint at one step: on hosts 'orchestrate up' resumes from it, "
        "on Slurm the next job is submitted at once; a preemption spends no restart (list 75 in "
        "job.permanent_exit_codes to end the run at one instead)"
    ),
    FailureKind.VANISHED: (
        "its process disappeared without an exit record (killed with its supervisor, the host "
        "rebooted, its run directory removed): 'dmesg' and the uptime of the host say which; "
        "a restart starts it again from the latest checkpoint"
    ),
    FailureKind.CRASHED: (
        "the worker exited non-zero: the last lines of its log ('orchestrate tail NAME') name "
        "the error; once fixed, 'orchestrate up' resumes from the latest checkpoint"
    ),
}

# What TensorFlow prints in a worker whose collective, coordination service or barrier gave up
# because another worker went away (strings of TensorFlow 2.x's runtime): a worker whose tail
# shows one of these is a consequence of another's failure, not a cause of its own.
_ABORT_SIGNATURES = (
    r"Collective ops is aborted",
    r"could be from a previous operation",  # the next collective after an abort
    r"\[Op:Collective\w*\]",
    r"remote task has failed",  # the coordination service's heartbeat timeout
    r"error polling",  # the coordination service handing a peer's error to every task
    r"Shutdown barrier (in coordination service )?has failed",
    r"[Uu]nhealthy",
    r"UnavailableError",
    r"Socket closed",
    r"Connection reset by peer",
    r"failed to connect to all addresses",
    # JAX (job.keras: jax): gloo's CPU collectives when a peer's socket closed ("Gloo AllGather
    # failed ... Connection reset by peer"), the coordination service's verdict that a task
    # died, and the coordinator's registration barrier that a peer never reached.
    r"Gloo [\w-]+ failed",
    r"JAX distributed service detected fatal errors",
    r"cluster registration failed",
    r"Wait_for_all_tasks_to_register",
)

# Checked in order against the log tail: the first match names the kind.
_LOG_PATTERNS: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    (FailureKind.DISK_FULL, re.compile(r"No space left on device|ENOSPC|Disk quota exceeded")),
    (FailureKind.OUT_OF_MEMORY,
     re.compile(r"ResourceExhaustedError|OOM when allocating|MemoryError|[Oo]ut of memory")),
    (FailureKind.PORT_BUSY,
     re.compile(r"Could not start gRPC server|Address already in use|Failed to add port")),
    (FailureKind.IMPORT_ERROR, re.compile(r"do not have the tf_keras package")),
    (FailureKind.KERAS_API,
     re.compile(r"has no attribute '(reset_states|_distribution_strategy|reset_metrics|"
                r"experimental_distribute_dataset)'|"
                r"unsupported type \(<class '[\w.]*PerReplica'>\)|"
                r"is not available with Keras 3")),
    (FailureKind.IMPORT_ERROR, re.compile(r"\b(ModuleNotFoundError|ImportError)\b")),
    # A JAX process whose registration with the coordinator (its RegisterTask call) timed out
    # or found no one, before it could lose any peer; the coordinator's own timeout is an
    # abort signature above (it waited for the others).
    (FailureKind.COORDINATOR_UNREACHABLE,
     re.compile(r"(DEADLINE_EXCEEDED|UNAVAILABLE)[\s\S]{0,400}?/RegisterTask\b|"
                r"unknown_target_for_coordination_leader|"
                r"[Ff]ailed to connect to (the )?coordination service")),
    # gloo's context (JAX's CPU collectives) never connected: measured with host names at
    # 127.0.0.1 ("timed out connecting ... remote=[127.0.0.1]:PORT", "Connect timeout").
    (FailureKind.COLLECTIVES_UNREACHABLE, re.compile(r"Gloo context initialization failed")),
    (FailureKind.PEER_LOST, re.compile("|".join(_ABORT_SIGNATURES))),
)  # fmt: skip

# Signals sent from outside the worker: its log holds nothing of the kill, so an abort it
# printed earlier is not why it ended (TensorFlow's own aborts end by SIGABRT, and are read).
_EXTERNAL_SIGNALS = frozenset({-9, -15, 137, 143})


def classify_exit(returncode: int | None, log_tail: Sequence[str]) -> FailureKind:
    """The kind of a worker's failed exit (negative: killed by that signal)."""
    if returncode == 0:
        return FailureKind.EARLY_EXIT
    if returncode == EXIT_PREEMPTED:
        return FailureKind.PREEMPTED
    if returncode == EXIT_USAGE:
        return FailureKind.USAGE
    text = "\n".join(log_tail)
    external = returncode in _EXTERNAL_SIGNALS
    for kind, pattern in _LOG_PATTERNS:
        if pattern.search(text) and not (external and kind is FailureKind.PEER_LOST):
            return kind
    if returncode is not None and (returncode < 0 or returncode > 128):
        return FailureKind.KILLED
    return FailureKind.CRASHED


_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def explain(kind: FailureKind, log_tail: Sequence[str] = ()) -> str | None:
    """What to do about a failure of this kind, made specific by its log where that helps."""
    text = "\n".join(log_tail)
    if kind is FailureKind.IMPORT_ERROR:
        if re.search(r"do not have the tf_keras package|No module named 'tf_keras'", text):
            return "job.keras is legacy but tf_keras is missing on the host: " + install_hint(
                "legacy-keras", "there"
            )
        found = _MISSING_MODULE.findall(text)
        if found:
            module = found[-1]
            top = module.split(".")[0]
            return (
                f"the worker cannot import '{module}': if it is your own module, list "
                f"{top}.py (or the {top}/ directory) under job.files: so it is uploaded "
                f"next to the script; if it is a package, install it into the Python named "
                f"by python: on every host"
            )
    return HINTS.get(kind)


def with_consequences(cause: Failure, aborted: Sequence[str]) -> Failure:
    """The cause, its reason naming the peers that aborted because of it: the user reads one
    line, and it says both which machine to look at and why the others failed too."""
    if not aborted:
        return cause
    names = ", ".join(aborted[:-1]) + (" and " if len(aborted) > 1 else "") + aborted[-1]
    reason = f"{cause.reason} ({names} aborted because {cause.worker} died)"
    return replace(cause, reason=reason, consequences=tuple(aborted))


def early_exit(failure: Failure, exited_ok: Sequence[str]) -> Failure:
    """A worker that waits for a peer (stalled, or its collective aborted) while another worker
    already exited 0: in MultiWorkerMirroredStrategy every worker runs the same steps and ends
    together, so the one that left is the cause, not the one left waiting."""
    waiting = failure.kind is FailureKind.PEER_LOST or (
        # Stalled before its first step: still waiting for the cluster to form. A worker that
        # stalls mid-training while another finished is stuck on its own (workers that share
        # collectives cannot finish without it).
        failure.kind is FailureKind.STALLED and failure.step is None
    )
    if not waiting or not exited_ok:
        return failure
    return Failure(
        exited_ok[0],
        FailureKind.LEFT_EARLY,
        f"it exited (code 0) while {failure.worker} still waited for it "
        f"({failure.kind.value}: {failure.reason}): the script never created the strategy "
        "or exited before its peers joined",
        None,
        0,
    )


@dataclass(frozen=True)
class Failure:
    worker: str
    kind: FailureKind
    reason: str  # for people: may carry varying details (temp file names, times)
    step: int | None
    exit_code: int | None = None
    # Peers whose collective aborted because of this failure (their own exits say peer lost).
    consequences: tuple[str, ...] = ()

    @property
    def signature(self) -> tuple[str, str, int | None]:
        """Who failed how and where, as restarts record it (`same_failure` compares two)."""
        return (self.worker, self.kind.value, self.step)


def permanent_reason(
    failure: Failure,
    previous: tuple[str, str, int | None] | None,
    permanent_exit_codes: Sequence[int],
) -> str | None:
    """Why restarting would not help, or None when a restart is worth it."""
    if failure.exit_code is not None and failure.exit_code in permanent_exit_codes:
        return f"exit code {failure.exit_code} is marked permanent"
    if failure.kind in DETERMINISTIC:
        return f"a {failure.kind.value} failure repeats on every restart"
    if previous is not None and same_failure(failure.signature, previous):
        return "it failed the same way at the same step twice in a row"
    return None


# Kinds that say something about one machine (a signal, a stall, a host gone, its port): they
# repeat only on the same worker. The others are the code's or the data's, and fail whichever
# worker reaches the step first (under MultiWorkerMirroredStrategy every worker raises alike).
MACHINE_KINDS = frozenset(
    {FailureKind.KILLED, FailureKind.STALLED, FailureKind.NOT_STARTED, FailureKind.UNREACHABLE,
     FailureKind.VANISHED, FailureKind.PEER_LOST, FailureKind.PORT_BUSY, FailureKind.PREEMPTED}
)  # fmt: skip


def same_failure(this: tuple[str, str, int | None], previous: tuple[str, str, int | None]) -> bool:
    """Whether two failures' (worker, kind, step) are "the same failure": the same kind at the
    same step, on the same worker where the kind is about a machine (MACHINE_KINDS)."""
    worker, kind, step = this
    if (kind, step) != previous[1:]:
        return False
    code_or_data = kind in {k.value for k in FailureKind} and FailureKind(kind) not in MACHINE_KINDS
    return worker == previous[0] or code_or_data
