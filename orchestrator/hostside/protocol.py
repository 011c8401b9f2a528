"""How the controller speaks to the host programs: every verb's name, what each request carries,
the answer keys both ends read, and the one serve loop.

STANDARD LIBRARY ONLY (shipped with the programs, hostside/bundle.py). A program is started as
`python -c SOURCE`; requests arrive as JSON lines on its standard input, never as arguments (a
launch spec carries the job's environment, and argv is visible to every user of the host in
`ps`), each {"verb": V, ...fields}; each is answered with one JSON line, until end of input. A
verb that fails answers {"error": "..."} and the session goes on.

The agent (agent.py) and its fields:
  info                                  home directory, hostname, Python version
  launch spec                           start a worker under a minder (or hand it to a standby)
  probe run_dirs                        liveness, progress and exit record of each run
  stop run_dirs grace [by]              SIGTERM each run's process group, SIGKILL after grace
  watch run_dirs timeout                answer when one of these runs ends (or a `wake` line)
  stacks run_dirs wait [send offsets mark native]
                                        every thread's Python stack of each worker
  checkpoint directory [companions]     the checkpoints TensorFlow's state file lists there
  adopt-checkpoint directory name checkpoints
                                        make `name` the latest checkpoint there
  set-aside directory stamp             move its contents to DIRECTORY.set-aside-STAMP
  files directory                       every file under it with its size and time
  make-dirs directories private_dirs    create directories, the private ones 0700
  standby specs                         per worker slot, a standby that imported TensorFlow
  discard-standbys run_dirs             stop the run's standbys for good
  linger-standbys run_dirs seconds      the run ended: its standbys stay for the next run
  standbys job_dirs                     the standbys alive in each job directory
The host probe (hostprobe.py), each with the check's spec as its fields:
  inspect  connect  cleanup             the preflight's rounds
  compute  sink  send                   `check --perf`'s
The lease program (leases.py; every key of its requests, answers and files: leasepolicy.py):
  acquire lease_dir run_id job controller idle workers [dry_run ticket]
  release lease_dir run_id   list lease_dir   withdraw lease_dir run_id
A `wake` line is no request and gets no answer: it ends a watch that waits. A request's `id`
comes back in its answer.
"""

import json
import os

if __package__:  # imported as part of orchestrate: the controller, the tests
    from orchestrator import contract
else:  # shipped: hostside/bundle.py carries it in front of the program's source
    import contract  # type: ignore[no-redef]

VERB = "verb"  # the request's field that names its verb
# The request's number, echoed in its answer: a line that answers another request (one answer
# too many, from a damaged or hostile program) is told from the one asked for, never taken for it.
ID = "id"
WAKE = "wake"

# --- the agent ---------------------------------------------------------------------------------
INFO = "info"
LAUNCH = "launch"
PROBE = "probe"
STOP = "stop"
WATCH = "watch"
STACKS = "stacks"
CHECKPOINT = "checkpoint"
ADOPT_CHECKPOINT = "adopt-checkpoint"
SET_ASIDE = "set-aside"
FILES = "files"
MAKE_DIRS = "make-dirs"
STANDBY = "standby"
DISCARD_STANDBYS = "discard-standbys"
LINGER_STANDBYS = "linger-standbys"
STANDBYS = "standbys"

# --- the host probe ----------------------------------------------------------------------------
INSPECT = "inspect"
CONNECT = "connect"
CLEANUP = "cleanup"
COMPUTE = "compute"
SINK = "sink"
SEND = "send"

# --- the lease program -------------------------------------------------------------------------
ACQUIRE = "acquire"
RELEASE = "release"
LIST = "list"
WITHDRAW = "withdraw"

# --- answer keys the programs write and the controller's parsers read ---------------------------
ERROR_KEY = "error"  # any verb: it failed, the session goes on
NOW_KEY = "now"  # the host's clock (probe, standbys, list)
RUNS_KEY = "runs"  # probe: per run directory
PID_KEY = "pid"  # launch: the minder's
OUTCOME_KEY = "outcome"  # stop, discard-standbys, linger-standbys: per run directory
LEFT_KEY = "left"  # stop: pids alive after SIGKILL
STANDBYS_KEY = "standbys"  # standby: per backed run directory; standbys: per job directory
STACKS_KEY = "stacks"  # stacks: per run directory, and each one's dump
NATIVE_KEY = "native"  # stacks: py-spy's dump
OFFSETS_KEY = "offsets"  # stacks with `mark`: the stack files' sizes
CHANGED_KEY = "changed"  # watch: a worker ended
FILES_KEY = "files"  # checkpoint, files: the files found
LATEST_KEY = "latest"  # checkpoint, adopt-checkpoint
CHECKPOINTS_KEY = "checkpoints"  # checkpoint: every one listed, the latest last
DIRECTORY_KEY = "directory"  # checkpoint, set-aside (also set-aside's request)
MOVED_TO_KEY = "moved_to"  # set-aside: where the contents went; None when there were none
COUNT_KEY = "count"  # set-aside: how many files moved
ROOT_KEY = "root"  # files

# probe: each run directory's record (control.probe_runs writes it, model/answers.WorkerProbe
# reads it), PID_KEY its minder's; its EXIT_KEY holds the exit record (rundir.record_exit's keys).
EXISTS_KEY = "exists"
ALIVE_KEY = "alive"
WORKER_PID_KEY = "worker_pid"
PROGRESS_KEY = "progress"  # the worker's progress.json (contract.py's keys)
EXIT_KEY = "exit"
STOP_REQUESTED_KEY = "stop_requested"
STOPPED_BY_KEY = "stopped_by"
USAGE_KEY = "usage"  # the worker's process, where psutil is: the three below
RESTARTS_KEY = "restarts"  # restarts.json: exit records of earlier starts in place
CPU_PERCENT_KEY = "cpu_percent"
RSS_BYTES_KEY = "rss_bytes"  # also each standby's in `standbys`
CREATE_TIME_KEY = "create_time"
# standbys: each standby of a job directory (standbypolicy.listing writes it,
# model/answers.StandbyInfo reads it), with PID_KEY, WORKER_PID_KEY and RSS_BYTES_KEY.
NAME_KEY = "name"  # the worker slot
RUN_ID_KEY = "run_id"
LINGERING_KEY = "lingering"
LEFT_S_KEY = "left_s"
READY_KEY = "ready"

# --- request fields: the controller writes them, the programs read them --------------------------
RUN_DIRS_KEY = "run_dirs"  # probe, stop, watch, stacks, discard-, linger-standbys
GRACE_KEY = "grace"  # stop
TIMEOUT_KEY = "timeout"  # watch; the host probe's connect, compute, sink, send
SECONDS_KEY = "seconds"  # linger-standbys; the host probe's send (and its answers' seconds)
DIRECTORIES_KEY = "directories"  # make-dirs; inspect (and its answer)
STAMP_KEY = "stamp"  # set-aside: the controller's time, the same on every host
# adopt-checkpoint takes NAME_KEY (the checkpoint's), launch its SPEC_KEY: launch's spec is
# model/workers.WorkerSpec.launch_request; agent.cmd_launch keeps it as spec.json, which the
# minder reads; the Slurm plan's tasks (slurm_launcher.py) carry its first five.
SPEC_KEY = "spec"
RUN_DIR_KEY = "run_dir"  # also launch's answer
PRIVATE_DIRS_KEY = "private_dirs"  # also make-dirs'
CWD_KEY = "cwd"
ARGV_KEY = "argv"
ENV_KEY = "env"
SECRET_ENV_KEY = "secret_env"  # the job's secrets: the minder's environment, never a file
TF_CONFIG_KEY = "tf_config"
LOG_MAX_BYTES_KEY = "log_max_bytes"
WARM_KEY = "warm"  # a controller that knows standbys; in launch's answer: a standby took it
WITHHOLD_ENV_KEY = "withhold_env"
# standby: each of its specs (WorkerSpec.standby_request), with CWD_KEY, ENV_KEY, SECRET_ENV_KEY
# and WITHHOLD_ENV_KEY; standbys.py keeps its fields in the standby's state.
BACKS_KEY = "backs"  # the run directory of the attempt it backs
PYTHON_KEY = "python"  # the worker's interpreter; in info's and inspect's answers its version
LINGER_KEY = "linger"
STARTED_AT_KEY = "started_at"  # the standby's state and its listing
# info's answer (model/answers.HostInfo), with PYTHON_KEY
HOME_KEY = "home"
HOSTNAME_KEY = "hostname"

# --- the host probe's requests and answers (backends/hosts/ writes and model/answers.py reads) -
PACKAGES_KEY = "packages"  # inspect: the distributions asked for, and their versions
PORT_KEY = "port"  # inspect, sink, send; connect's peers
LISTEN_SECONDS_KEY = "listen_seconds"  # inspect
TOKEN_KEY = "token"  # inspect, connect, cleanup: the shared-directory check's file
LISTENER_PID_KEY = "listener_pid"  # inspect's answer, cleanup's request
PORT_ERROR_KEY = "port_error"
HOLDER_KEY = "holder"  # the port's holder, with PID_KEY and COMMAND_KEY
COMMAND_KEY = "command"
BOOT_ID_KEY = "boot_id"  # also the lease records' (leasepolicy.py)
# inspect's answer, with HOSTNAME_KEY: the addresses the host's own name resolves to (JAX's gloo
# collectives advertise the first to their peers: a keras: jax job's check reads them)
NAME_ADDRESSES_KEY = "name_addresses"
PATH_KEY = "path"  # each of inspect's directories, with EXISTS_KEY and the three below
WRITABLE_KEY = "writable"
CHECKED_KEY = "checked"
FREE_BYTES_KEY = "free_bytes"
PEERS_KEY = "peers"  # connect: the peers asked, and per peer how it ended
ADDRESS_KEY = "address"  # each peer's, with NAME_KEY and PORT_KEY; send's
STATUS_KEY = "status"  # connect's per peer, send's: ok, refused, unreachable, timeout, error
DETAIL_KEY = "detail"  # why, where it is not ok (connect, compute, send)
TOKEN_VISIBLE_KEY = "token_visible"  # connect
PROBE_KIND_KEY = "probe"  # compute: numpy, tensorflow, or None (not measured)
GFLOPS_KEY = "gflops"  # compute
BYTES_KEY = "bytes"  # send: what the peer's sink received
SENT_KEY = "sent"  # send
RATE_KEY = "rate"  # send: bytes per second

# --- the agent's own command lines (argv: no job value is ever in one) ----------------------------
SUPERVISE = "supervise"  # agent.py supervise RUN_DIR [--adopt PID IN OUT]: the run's minder
ADOPT = "--adopt"  # a standby's child, inherited across its exec
STANDBY_ARGV = "standby"  # agent.py standby STANDBY_DIR: a standby's minder-to-be


def minder_argv(python, agent_path, run_dir, adopt=()):
    """The command line of a run's minder: the agent's copy in the run directory, which names
    the directory (how a probe tells the minder's pid from a reused one). `adopt`: (pid, stdin
    fd, stdout fd) of a standby's child that this minder takes over."""
    argv = [python, *contract.ISOLATED, agent_path, SUPERVISE, run_dir]
    return [*argv, ADOPT, *map(str, adopt)] if adopt else argv


def standby_argv(python, agent_path, standby_dir):
    return [python, *contract.ISOLATED, agent_path, STANDBY_ARGV, standby_dir]


class Refused(Exception):
    """A request a host program will not carry out, for a reason its user can act on (a lease
    directory another account owns): answered with the message alone, no exception's name."""


def answer(handlers, request):
    """`request` answered by its verb's handler; a failure, or an unknown verb, is an answer
    too ({"error": ...}): one failed request never ends the session."""
    verb = request.get(VERB)
    if verb not in handlers:
        return {ERROR_KEY: f"unknown verb {verb!r}; known: {', '.join(handlers)}"}
    try:
        return handlers[verb](request)
    except Refused as exc:
        return {ERROR_KEY: str(exc)}
    except Exception as exc:
        return {ERROR_KEY: f"{verb}: {type(exc).__name__}: {exc}"}


def serve(lines, out, handlers):
    """One JSON answer per JSON request line until end of input: a controller polling every
    second pays for one Python start, not one per poll. A `wake` line gets no answer: it only
    ends a watch that waits (it may come just after the watch ended by itself)."""
    for line in lines:
        if line.strip():
            request = json.loads(line)
            if request.get(VERB) == WAKE:
                continue
            said = answer(handlers, request)
            if ID in request:
                said[ID] = request[ID]
            out.write(json.dumps(said) + "\n")
            out.flush()


class RequestLines:
    """The session's request lines, read straight from its file descriptor (no hidden buffer),
    so that a verb can select on it: a line the controller writes while a watch waits wakes it."""

    serving: "RequestLines | None" = None  # the session's, while agent.main serves one

    def __init__(self, fd):
        self.fd = fd
        self._buffer = b""

    def pending(self):
        return b"\n" in self._buffer

    def __iter__(self):
        while True:
            while b"\n" not in self._buffer:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    if self._buffer.strip():
                        yield self._buffer.decode("utf-8", "replace")
                    return
                self._buffer += chunk
            line, self._buffer = self._buffer.split(b"\n", 1)
            yield line.decode("utf-8", "replace")
