"""A worker's run directory and a slot's standby directory: the names of their files, and the
records and logs written there, once for the agent (its minder, standbys and verbs), the lease
program and the Slurm launcher. (A TrainJob's pod has no run directory: the pod launcher needs
none of this.)

STANDARD LIBRARY ONLY (shipped with the programs that import it, hostside/bundle.py). The
controller imports the names too (it reads these files through the agent, or, on Slurm, writes
stop_requested itself): a file name is written here and nowhere else
(tests/unit/test_rundir_names.py).

A run directory, {job}/runs/{run_id}/attempt-{n}/{name}:
  spec.json  tf_config.json  agent.py (the agent's copy the minder runs from)  pid (the minder's,
  its process group; the Slurm launcher's)  worker.pid  worker.log (worker.log.1 once rotated)
  progress.json (written by the worker)  exit.json  stop_requested  stacks.txt  stacks.pid
  node (Slurm: where the task ran)
A standby's directory, {job}/standby/{name} (one per job and slot, private like runs/):
  spec.json (claimed.json once claimed)  agent.py  pid  worker.pid  handover (a fifo)  ready
  (written by its child once TensorFlow is imported)  standby.log  stacks.txt  stacks.pid
A run's discard marker: {job}/runs/{run_id}/standbys_discarded (none of its standbys may start
or stay).
"""

import json
import os
import signal
import time

if __package__:  # imported as part of orchestrate: the controller, its tests
    from orchestrator import contract
    from orchestrator.hostside import safefiles
else:  # shipped: hostside/bundle.py carries them in front of the program's source
    import contract  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]

# --- the files of a run directory ---------------------------------------------------------------
SPEC_FILE = "spec.json"
TF_CONFIG_FILE = "tf_config.json"
AGENT_FILE = "agent.py"
PID_FILE = "pid"
WORKER_PID_FILE = "worker.pid"
WORKER_LOG = contract.WORKER_LOG
ROTATED_LOG = WORKER_LOG + ".1"  # the log's older half, past its cap
PROGRESS_FILE = contract.PROGRESS_FILE
HISTORY_FILE = contract.HISTORY_FILE
EXIT_FILE = "exit.json"
STOP_FILE = contract.STOP_REQUEST_FILE
STACKS_FILE = contract.STACKS_FILE
STACKS_PID_FILE = contract.STACKS_PID_FILE
NODE_FILE = "node"
RESTARTS_FILE = "restarts.json"  # a worker its Slurm launcher started again in place
# --- a standby's directory, and a run's marker ---------------------------------------------------
STANDBY_DIR_NAME = "standby"
CLAIMED_FILE = "claimed.json"
HANDOVER_FIFO = "handover"
READY_FILE = "ready"
STANDBY_LOG = "standby.log"
DISCARDED_MARKER = "standbys_discarded"  # in {job}/runs/{run_id}
TAKING_PREFIX = "taking."  # spec.json renamed away while a request rewrites it
NAMES = (SPEC_FILE, TF_CONFIG_FILE, AGENT_FILE, PID_FILE, WORKER_PID_FILE, WORKER_LOG,
         ROTATED_LOG, PROGRESS_FILE, HISTORY_FILE, EXIT_FILE, STOP_FILE, STACKS_FILE,
         STACKS_PID_FILE, NODE_FILE, RESTARTS_FILE, STANDBY_DIR_NAME, CLAIMED_FILE,
         HANDOVER_FIFO, READY_FILE, STANDBY_LOG, DISCARDED_MARKER)  # fmt: skip

LOG_TAIL_LINES = 20
REDACTED = b"[redacted]"
SECRET_MIN_CHARS = 4  # shorter values are left alone (engine/workers/secretenv.scrub's rule too)


def expand(path):
    """A path as the host reads it: `~` expanded, a relative one under the home directory."""
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(os.path.expanduser("~"), path)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def read_int(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


# --- where things are ---------------------------------------------------------------------------


def run_of(run_dir):
    """{job}/runs/{run_id}/attempt-{n}/{name} -> {job}/runs/{run_id}."""
    return os.path.dirname(os.path.dirname(run_dir))


def standby_dir(run_dir):
    """{job}/runs/{run_id}/attempt-{n}/{name} -> {job}/standby/{name}: one per job and slot,
    shared by the job's runs, so that the next run finds what the last one left lingering."""
    job = os.path.dirname(os.path.dirname(run_of(run_dir)))
    return os.path.join(job, STANDBY_DIR_NAME, os.path.basename(run_dir))


def run_chain(run_dir):
    """{job}/runs/{run_id}/attempt-{n}/{name} -> [{job}/runs, ..., run_dir]: the directories
    a run's files are private behind (model/workers.private_dirs, for a request without them)."""
    chain = [run_dir]
    for _ in range(3):
        chain.insert(0, os.path.dirname(chain[0]))
    return chain


def make_private_dirs(directories):
    # The parents keep the user's umask (the job directory holds the shareable checkpoints).
    safefiles.make_private_dirs([expand(path) for path in directories])


def private_chain_made(directories):
    """Whether the directories are (now) this account's private ones; False, with nothing
    written, where one is refused (another user's, a link)."""
    try:
        make_private_dirs(directories)
    except RuntimeError:
        return False
    return True


# --- stop_requested -----------------------------------------------------------------------------


# The stop_requested file (stop_request writes it, stopped_by reads it; the probe's
# protocol.STOPPED_BY_KEY): when, and who asked.
STOP_AT_KEY = "at"
STOP_BY_KEY = "by"


def stop_request(by):
    """The stop_requested file: when, and who asked (so a survivor stopped by its minder does
    not read as stopped by `orchestrate down`)."""
    return json.dumps({STOP_AT_KEY: time.time(), STOP_BY_KEY: by})


def stopped_by(stop_path):
    request = read_json(stop_path)
    by = request.get(STOP_BY_KEY) if isinstance(request, dict) else None  # older files: a bare time
    return by if isinstance(by, str) else None


# --- the worker's log ---------------------------------------------------------------------------


def open_log(log_path):
    return os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def log_line(run_dir, line):
    """One line of orchestrate's own into the run's worker.log."""
    log = open_log(os.path.join(run_dir, WORKER_LOG))
    try:
        os.write(log, (line + "\n").encode())
    finally:
        os.close(log)


def write_log(log_path, chunk, written, max_bytes):
    """Append to the log (fd 1), rotating it first when the chunk would pass max_bytes: once
    (worker.log -> worker.log.1, the older one dropped), so at most twice the cap is on disk and
    `tail -F` follows the new file by its name."""
    if max_bytes and written + len(chunk) > max_bytes:
        os.replace(log_path, log_path + ".1")
        log = open_log(log_path)
        os.dup2(log, 1)  # the minder's own messages follow into the new file
        os.dup2(log, 2)
        os.close(log)
        written = 0
    os.write(1, chunk)
    return written + len(chunk)


class RotatingLog:
    """worker.log written through fd 1 and 2 (a minder's own output is the log), capped."""

    def __init__(self, log_path, max_bytes):
        self.path, self.max_bytes = log_path, max_bytes
        self.written = os.path.getsize(log_path) if os.path.exists(log_path) else 0

    def write(self, chunk):
        self.written = write_log(self.path, chunk, self.written, self.max_bytes)


def copy_output(child, write, secrets=()):
    """Drain the worker's output (child.stdout) through write(chunk) until it ends, or until it
    ended and a process it left behind holds the pipe. With secrets, output goes line by line
    and a secret value a script printed is written as [redacted]."""
    import select

    source = child.stdout.fileno()
    pending = b""
    while True:
        if not select.select([source], [], [], 1.0)[0]:
            if child.poll() is not None:
                break
            continue
        chunk = os.read(source, 65536)
        if not chunk:
            break
        if secrets:
            pending += chunk
            cut = pending.rfind(b"\n") + 1 if len(pending) < 1 << 20 else len(pending)
            chunk, pending = redact(pending[:cut], secrets), pending[cut:]
        write(chunk)
    if pending:
        write(redact(pending, secrets))


def log_tail(run_dir, count=LOG_TAIL_LINES):
    """The log's last non-empty lines (a rotated log's may be in worker.log.1)."""
    text = b""
    for name in (ROTATED_LOG, WORKER_LOG):
        try:
            with open(os.path.join(run_dir, name), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - 64 * 1024))
                text = (text + handle.read())[-64 * 1024 :]
        except OSError:
            continue
    lines = text.decode("utf-8", "replace").splitlines()
    return [line for line in lines if line.strip()][-count:]


# --- secrets a script prints --------------------------------------------------------------------


def secret_values(names, environ):
    """The values of the job's secret variables (in this process's environment, never in a
    file), as bytes, longest first; values under SECRET_MIN_CHARS characters are left alone."""
    values = {environ.get(name, "") for name in names}
    kept = [value.encode() for value in values if len(value) >= SECRET_MIN_CHARS]
    return sorted(kept, key=len, reverse=True)


def redact(data, secrets):
    for value in sorted(secrets, key=len, reverse=True):
        data = data.replace(value, REDACTED)
    return data


# --- exit.json ----------------------------------------------------------------------------------


def signal_name(returncode):
    """SIGTERM for -15; None for an exit that no signal ended."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


# The exit record (exit.json; restarts.json's entries): record_exit and the Slurm launcher write
# it, model/answers.ExitRecord reads it (the probe's protocol.EXIT_KEY).
RETURNCODE_KEY = "returncode"
SIGNAL_KEY = "signal"
STARTED_AT_KEY = "started_at"
FINISHED_AT_KEY = "finished_at"
ERROR_KEY = "error"  # usually the last line of the log
LOG_TAIL_KEY = "log_tail"
JOINED_KEY = "joined"  # JoinWatch's verdict, where it gave one
STEP_KEY = contract.STEP  # restarts.json: the step it had reached


def record_exit(run_dir, returncode, started, error, joined=None, *, secrets=()):
    """exit.json: how the worker ended, with its log's last lines (secret values redacted: it
    is what status and the root-cause report show); `joined`: JoinWatch's verdict, for a worker
    of a multi-worker cluster that loaded TensorFlow."""
    tail = log_tail(run_dir)
    if secrets:
        tail = [redact(line.encode(), secrets).decode("utf-8", "replace") for line in tail]
    if error is None and returncode > 0 and tail:
        error = tail[-1]  # usually the exception line; after a signal it would be noise
    record = {
        RETURNCODE_KEY: returncode,
        SIGNAL_KEY: signal_name(returncode),
        STARTED_AT_KEY: started,
        FINISHED_AT_KEY: time.time(),
        ERROR_KEY: error,
        LOG_TAIL_KEY: tail if returncode != 0 else [],
    }
    if joined is not None:
        record[JOINED_KEY] = joined
    safefiles.write_json(os.path.join(run_dir, EXIT_FILE), record)


def read_exit(run_dir):
    """The exit record, or None while the worker runs (or where there is none)."""
    return read_json(os.path.join(run_dir, EXIT_FILE))


def exited(run_dir):
    return os.path.exists(os.path.join(run_dir, EXIT_FILE))
