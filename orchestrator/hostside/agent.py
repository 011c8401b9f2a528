"""The host-side agent: the only orchestrate code on a training host besides the worker.

STANDARD LIBRARY ONLY. The controller sends this file's source with every call
(`python -c SOURCE`), so a host needs nothing but a Python interpreter. Requests arrive as JSON
lines on standard input, never as arguments (a launch spec carries the job's environment, and
argv is visible to every user of the host in `ps`); each is answered with one JSON line, until
end of input. The request shape is the one hostprobe.py reads too: {"verb": V, ...fields}.
A verb that fails answers {"error": "..."} and the session goes on.

Verbs and their fields:
  info                        the host's home directory, hostname and Python version
  launch spec                 create the run directory, write TF_CONFIG to a file, and start a
                              detached supervisor (its own session: it survives the SSH
                              connection and the controller's terminal closing). The spec's
                              secret_env values go to the supervisor's environment only, never
                              into spec.json or any other file
  probe run_dirs              liveness, progress and exit record of each run directory
  stop run_dirs grace         SIGTERM each run's process group, SIGKILL what is left after grace
  checkpoint directory        the checkpoints TensorFlow's state file lists there (latest last),
                              with their files' sizes
  adopt-checkpoint directory name checkpoints
                              make `name` (files already copied in) the latest checkpoint there,
                              with `checkpoints` the ones listed before it
  files directory             every file under it with its size and modification time
  make-dirs directories private_dirs
                              create the directories (parents too) and the private ones (0700)
                              before files are copied in: no shell command per host
  standby specs               per worker slot, a standby: a second supervisor whose child has
                              imported TensorFlow (worker/standby.py) and waits to be told what
                              to run, so that the slot's next attempt skips the import
  discard-standbys run_dirs   stop the standbys of these workers' slots for good (the run ended)
  linger-standbys run_dirs seconds
                              the run ended: its slots' standbys stay `seconds` for the next
                              run of the job (job.linger), which takes them
  standbys job_dirs           the standbys alive in each job directory, with their memory
  stacks run_dirs wait [send offsets mark native]
                              every thread's Python stack of each worker: SIGUSR2 to the
                              process that registered faulthandler (stacks.pid), then what it
                              appended to stacks.txt (a file of its own: a dump never mixes
                              with worker.log); `mark` answers the files' sizes, for a
                              scheduler that delivers the signal itself; `native`: py-spy's
  watch run_dirs timeout      answer as soon as one of these workers (the controller saw them
                              running) ends: its exit record is written or its supervisor is
                              gone (at once if one has already), or after timeout: the
                              controller's wait between two polls, told of an exit at once
The supervisor itself is started as `agent.py supervise RUN_DIR` (internal; no job values), a
standby's as `agent.py standby STANDBY_DIR`.

Warm restarts: a launch whose slot has a standby hands the attempt to it when the standby may
serve it (standby_refusal: alive, the same interpreter, the same environment at TensorFlow's
import but for the per-attempt values; one still importing serves too, it reads the hand-over
after the import); otherwise the standby is discarded and the worker starts cold. The
hand-over: the launcher claims the standby (renames its spec.json), writes the run directory
into its fifo, and the standby supervisor execs `agent.py supervise RUN_DIR --adopt
PID IN OUT`: the same process (the process group `stop` signals), its child still its child,
now supervised for the new run directory exactly like a cold one. A standby that is never
claimed exits by itself `linger` seconds after the attempt it backs ended (or, backing one not
started yet, `linger` seconds after it started itself), at the `until` a run that ended set
(linger-standbys), when its run's discard marker appears, or when its directory is removed.
Between runs (job.linger): a standby lives per job and slot, not per run, so the next run of
the job finds the ones the last run left lingering; its `standby` request takes one
(standby_verdict: the same interpreter, environment and agent) by renaming its spec.json away
and writing it back re-pointed at the new run's attempt (one request wins the rename); a stale
one is discarded and the reason goes into the new worker's log.
Privacy: the spec's private_dirs ({job}/runs down to the run directory) are made 0700 and every
file written here is 0600, so another account on the host reads nothing of a run. Only this
account's processes count as a run's supervisor (pid reuse, or another user's job, is ignored).

Files in a run directory:
  spec.json  tf_config.json  agent.py  pid (supervisor = process group)  worker.pid
  worker.log  progress.json (written by the worker)  exit.json  stop_requested
A standby's directory ({job}/standby/{name}, one per job and slot, 0700 like runs/):
  stacks.txt stacks.pid (the worker's stack dumps on SIGUSR2, and the pid that registered it)
  spec.json (claimed.json once claimed)  agent.py  pid  worker.pid  handover (a fifo)
  ready (written by the child once TensorFlow is imported)  standby.log
A run's discard marker: {job}/runs/{run_id}/standbys_discarded (none of its may start or stay).
"""

import contextlib
import errno
import hashlib
import json
import os
import signal
import socket
import sys
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator import contract
    from orchestrator.hostside import procwatch, safefiles
else:  # shipped: machines/bundle.py carries them in front of this file's source
    import contract  # type: ignore[no-redef]
    import procwatch  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]

LOG_TAIL_LINES = 20
STANDBY_DIR_NAME = "standby"
DISCARDED_MARKER = "standbys_discarded"  # in {job}/runs/{run_id}
STANDBY_MODULE = "worker.standby"
HANDOVER_WAIT = 5.0  # seconds a launch waits for a claimed standby to take the attempt
# What differs between two attempts of one slot and is read only after TensorFlow's import:
# not part of the environment a standby must share with the attempt it serves.
# CUDA_VISIBLE_DEVICES too: read when a device is first used (the strategy), not at the import,
# and a GPU lease may give the next run other devices.
PER_ATTEMPT_ENV = (contract.TF_CONFIG_ENV, contract.RUN_DIR_ENV, contract.PROGRESS_FILE_ENV,
                   "CUDA_VISIBLE_DEVICES")  # fmt: skip
# What differs between two runs of a job (a lingering standby serves the next run), read only
# by orchestrate's worker, after the import.
PER_RUN_ENV = (contract.RUN_ID_ENV,)
# Set per SSH connection, never read by TensorFlow: a warm worker gets the launching agent's.
PER_CONNECTION_ENV = ("SSH_CLIENT", "SSH_CONNECTION", "SSH_AUTH_SOCK", "XDG_SESSION_ID")


# The safe-file helpers are shared with the lease program and the Slurm launcher (safefiles.py).
_private_open = safefiles.private_open
_write_json = safefiles.write_json
_write_text = safefiles.write_text
_private_dir = safefiles.private_dir
_temp_beside = safefiles.temp_beside


def _make_private_dirs(directories):
    # The parents keep the user's umask (the job directory holds the shareable checkpoints).
    safefiles.make_private_dirs([_expand(path) for path in directories])


def _run_chain(run_dir):
    """{job}/runs/{run_id}/attempt-{n}/{name} -> [{job}/runs, ..., run_dir]: the directories
    a run's files are private behind (model/workers.private_dirs, for a request without them)."""
    chain = [run_dir]
    for _ in range(3):
        chain.insert(0, os.path.dirname(chain[0]))
    return chain


def _private_chain_made(directories):
    """Whether the directories are (now) this account's private ones; False, with nothing
    written, where one is refused (another user's, a link)."""
    try:
        _make_private_dirs(directories)
    except RuntimeError:
        return False
    return True


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _read_int(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def _expand(path):
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(os.path.expanduser("~"), path)


def cmd_info(_request):
    return {
        "home": os.path.expanduser("~"),
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
    }


def _withhold(spec):
    """Drop the controller-only variables (notify's signing secrets) from this agent's own
    environment, which every supervisor, standby and worker it starts inherits: on a local host
    that environment is the controller's. Names the job sets itself (env, secret_env) stay."""
    for name in spec.pop("withhold_env", None) or ():
        os.environ.pop(name, None)


def cmd_launch(request):
    spec = dict(request["spec"])
    _withhold(spec)
    secrets = spec.pop("secret_env", None) or {}
    spec["secret_names"] = sorted(secrets)  # names only, to scrub their values from exit.json
    run_dir = _expand(spec["run_dir"])
    _make_private_dirs(spec.get("private_dirs") or [run_dir])
    if os.path.exists(os.path.join(run_dir, "stop_requested")):
        # A launch that arrives after its run was stopped (its controller died mid-launch and
        # the attempt was stopped meanwhile) must not start a worker nobody waits for.
        raise RuntimeError(f"{run_dir} was stopped before this launch arrived")
    _write_json(os.path.join(run_dir, "tf_config.json"), spec["tf_config"])
    _write_json(os.path.join(run_dir, "spec.json"), spec)
    agent_path = os.path.join(run_dir, "agent.py")
    _write_text(agent_path, spec["agent_source"])
    cold_reason = None
    if "warm" in spec:  # a controller that knows standbys; older ones send no such field
        pid, cold_reason = _hand_to_standby(run_dir, spec, secrets)
        if pid is not None:
            _write_text(os.path.join(run_dir, "pid"), str(pid))
            return {"pid": pid, "run_dir": run_dir, "warm": True}
        if cold_reason not in (None, "no standby", "warm restarts are off"):
            _log_line(run_dir, f"orchestrate: cold start: {cold_reason}")
    # The supervisor carries the run's variables too, so every process of a run is findable.
    # The secrets live here, in its environment (readable by this account only), and reach
    # the worker from it: no file on the host ever holds them.
    env = dict(os.environ, **spec["env"], **secrets)
    argv = [sys.executable, agent_path, "supervise", run_dir]
    pid = _spawn_daemon(argv, env, os.path.join(run_dir, "worker.log"))
    _write_text(os.path.join(run_dir, "pid"), str(pid))
    return {"pid": pid, "run_dir": run_dir, "warm": False, "cold_reason": cold_reason}


def _open_log(run_dir):
    return os.open(
        os.path.join(run_dir, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )


def _log_line(run_dir, line):
    log = _open_log(run_dir)
    try:
        os.write(log, (line + "\n").encode())
    finally:
        os.close(log)


# --- standbys (warm restarts) -----------------------------------------------------------------


def standby_dir(run_dir):
    """{job}/runs/{run_id}/attempt-{n}/{name} -> {job}/standby/{name}: one per job and slot,
    shared by the job's runs, so that the next run finds what the last one left lingering."""
    job = os.path.dirname(os.path.dirname(run_of(run_dir)))
    return os.path.join(job, STANDBY_DIR_NAME, os.path.basename(run_dir))


def run_of(run_dir):
    """{job}/runs/{run_id}/attempt-{n}/{name} -> {job}/runs/{run_id}."""
    return os.path.dirname(os.path.dirname(run_dir))


def import_env(base, spec_env, secrets):
    """The environment a worker of this spec has when it imports TensorFlow, without the values
    that change from attempt to attempt (read only later). Cold: the supervisor's environment
    (this agent's, the spec's variables, the secrets), which the worker inherits."""
    env = dict(base)
    env.update(spec_env)
    env.update(secrets)
    skip = PER_ATTEMPT_ENV + PER_RUN_ENV + PER_CONNECTION_ENV
    return {key: value for key, value in env.items() if key not in skip}


def env_digest(salt, python, env):
    """A salted digest: the standby's spec.json (0600) holds no secret value in the clear."""
    text = json.dumps([python, sorted(env.items())], separators=(",", ":"))
    return hashlib.sha256((salt + text).encode()).hexdigest()


def runnable_argv(argv):
    """What a standby can run of a worker command line: `PYTHON -m MODULE ARGS...`, `PYTHON
    SCRIPT ARGS...` or a script behind orchestrate's stacks boot (`PYTHON -c BOOT SCRIPT ARGS`,
    contract.SCRIPT_BOOT); no other interpreter options, which would have applied before the
    import."""
    if len(argv) >= 3 and argv[1] == "-m":
        return ("module", argv[2], list(argv[3:]))
    if len(argv) >= 4 and argv[1] == "-c" and argv[2].startswith(contract.BOOT_MARKER):
        return ("script", argv[3], list(argv[4:]))
    if len(argv) >= 2 and not argv[1].startswith("-"):
        return ("script", argv[1], list(argv[2:]))
    return None


def standby_refusal(standby, argv, env):
    """Why this standby may not serve a launch of `argv` with `env` (import_env's), or None.
    `standby`: its spec.json fields with `alive` (its supervisor runs). Pure."""
    if standby is None:
        return "no standby"
    if not standby.get("alive"):
        return "the standby is gone"
    # One still importing TensorFlow serves too: it reads the hand-over once the import is done,
    # which is sooner than a cold start's (`up` starts the first attempt's before its checks).
    if runnable_argv(argv) is None:
        return f"a standby cannot run {argv[:2]}"
    if standby.get("python") != argv[0]:
        return f"the standby runs {standby.get('python')}, this attempt {argv[0]}"
    if standby.get("digest") != env_digest(standby.get("salt", ""), argv[0], env):
        return "the standby's environment differs from this attempt's"
    if standby.get("packages_changed"):
        return f"packages changed in {standby['packages_changed']} since the standby's import"
    return None


# --- standbys between runs (job.linger): which standby may serve which slot of which run ------


def foreign_standby(standby, run_dir):
    """Why the slot's standby is not this run's to use or discard, or None: it backs an attempt
    of another run of the job that still runs (never released by that run's end). Pure."""
    if standby is None or not standby.get("alive"):
        return None
    other = run_of(standby.get("backs") or "")
    if other == run_of(run_dir) or standby.get("until") is not None:
        return None
    if standby.get("backing_alive"):
        return f"the slot's standby serves run {os.path.basename(other)}, which still runs"
    return None


def standby_verdict(standby, backs, python, env, agent, *, now):
    """What a request for a standby backing `backs` (interpreter `python`, import_env `env`,
    agent digest `agent`) does with the slot's current standby, and why: "keep" (it backs
    `backs` already), "take" (re-pointed at `backs`: one of this run's, or one another run of
    the job left lingering), "leave" (foreign_standby: not ours to touch) or "replace" (none,
    gone, expired or stale: discarded and a new one started). Pure."""
    if standby is None or not standby.get("alive"):
        return "replace", None
    foreign = foreign_standby(standby, backs)
    if foreign:
        return "leave", foreign
    until = standby.get("until")
    if until is not None and now >= until:
        return "replace", "its linger ran out"
    if standby.get("python") != python:
        return "replace", f"the standby runs {standby.get('python')}, this run {python}"
    if standby.get("digest") != env_digest(standby.get("salt", ""), python, env):
        return "replace", "the standby's environment differs from this run's"
    if standby.get("agent") != agent:
        return "replace", "another version of orchestrate started the standby"
    if standby.get("packages_changed"):
        return "replace", (f"packages changed in {standby['packages_changed']} since the "
                           "standby's import")  # fmt: skip
    if standby.get("backs") == backs and until is None:
        return "keep", None
    return "take", None


def standby_summary(name, standby, now, rss_bytes):
    """One line of the `standbys` listing. Pure."""
    until = standby.get("until")
    return {
        "name": name,
        "pid": standby.get("pid"),
        "worker_pid": standby.get("worker_pid"),
        "run_id": os.path.basename(run_of(standby.get("backs") or "")),
        "backs": standby.get("backs"),
        "lingering": until is not None,
        "left_s": None if until is None else max(0.0, until - now),
        "ready": bool(standby.get("ready")),
        "rss_bytes": rss_bytes,
        "started_at": standby.get("started_at"),
    }


def _standby_state(sdir):
    spec = _read_json(os.path.join(sdir, "spec.json"))
    if spec is None:
        return None
    pid = _read_int(os.path.join(sdir, "pid"))
    return dict(spec, pid=pid, alive=bool(pid) and _is_our_supervisor(pid, sdir),
                backing_alive=_attempt_alive(spec.get("backs") or "/"),
                worker_pid=_read_int(os.path.join(sdir, "worker.pid")),
                ready=os.path.exists(os.path.join(sdir, "ready")),
                packages_changed=_packages_changed(os.path.join(sdir, "ready")))  # fmt: skip


def _packages_changed(ready):
    """A package directory the standby imported from that changed since (worker.standby
    records their modification times once TensorFlow is imported), or None."""
    recorded = (_read_json(ready) or {}).get("package_dirs") or {}
    for path, mtime in sorted(recorded.items()):
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except OSError:
            return path
    return None


def _agent_digest(source):
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _rss_bytes(pids):
    """Resident memory of these processes, from /proc (no psutil on a bare host)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", encoding="utf-8") as handle:
                total += int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


def cmd_standbys(request):
    """The standbys alive in each job directory ({job}/standby/*): lingering ones (a run that
    ended left them for the next) and those waiting for a restart, with their memory."""
    now = time.time()
    listing = {}
    for job in request["job_dirs"]:
        root = os.path.join(_expand(job), STANDBY_DIR_NAME)
        found = []
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(root)):
                state = _standby_state(os.path.join(root, name))
                if state is not None and state["alive"]:
                    rss = _rss_bytes([state["pid"], state.get("worker_pid")])
                    found.append(standby_summary(name, state, now, rss))
        listing[job] = found
    return {"now": now, "standbys": listing}


def cmd_linger_standbys(request):
    """The run ended: each of its slots' standbys stays `seconds` from now (job.linger) for the
    next run of the job, whose `standby` request takes it; then it exits by itself."""
    seconds = float(request["seconds"])
    outcome = {}
    for run_dir in request["run_dirs"]:
        path = _expand(run_dir)
        sdir = standby_dir(path)
        state = _standby_state(sdir)
        outcome[run_dir] = "none"
        if os.path.exists(os.path.join(run_of(path), DISCARDED_MARKER)):
            continue  # `down` discarded them
        if state is None or not state["alive"] or run_of(state.get("backs") or "") != run_of(path):
            continue
        if _rewrite_spec(sdir, lambda record: record.update(until=time.time() + seconds)):
            outcome[run_dir] = "lingering"
    return {"outcome": outcome}


def _rewrite_spec(sdir, change):
    """Change the standby's spec.json in place; False if it is gone (claimed or taken). The
    rename is the claim: of two requests at once, one finds spec.json gone and changes
    nothing. The standby re-reads its spec when the file changes."""
    spec_path = os.path.join(sdir, "spec.json")
    taking = os.path.join(sdir, f"taking.{os.getpid()}")
    try:
        os.rename(spec_path, taking)
    except FileNotFoundError:
        return False
    record = _read_json(taking) or {}
    change(record)
    _write_json(spec_path, record)
    os.remove(taking)
    return True


def _take_standby(sdir, backs, linger):
    """Re-point the slot's standby at `backs` (a lingering one: for a new run)."""

    def repoint(record):
        previous = run_of(record.get("backs") or "")
        if previous != run_of(backs):
            record["taken_from"] = os.path.basename(previous)
        record.update(backs=backs, linger=linger)
        record.pop("until", None)

    return _rewrite_spec(sdir, repoint)


def _kill_standby(sdir, wait=5.0):
    """SIGKILL a standby's process group (nothing of it is worth saving) and wait for it."""
    pid = _read_int(os.path.join(sdir, "pid"))
    if not pid or not _is_our_supervisor(pid, sdir):
        return False
    _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and _process_group_members(pid):
        time.sleep(0.02)
    return True


def _hand_to_standby(run_dir, spec, secrets):
    """The supervisor pid that now runs this attempt's worker, or None and why not."""
    sdir = standby_dir(run_dir)
    standby = _standby_state(sdir)
    foreign = foreign_standby(standby, run_dir)
    if foreign:
        return None, foreign  # another live run's: left alone
    if not spec.get("warm"):
        _kill_standby(sdir)
        return None, "warm restarts are off"
    why = standby_refusal(standby, spec["argv"], import_env(os.environ, spec["env"], secrets))
    if why is not None:
        _kill_standby(sdir)
        return None, why
    pid = standby["pid"]
    try:  # the claim: exactly one launch gets a standby
        os.replace(os.path.join(sdir, "spec.json"), os.path.join(sdir, "claimed.json"))
        fifo = _open_handover(os.path.join(sdir, "handover"))
    except OSError as exc:
        _kill_standby(sdir)
        return None, f"the standby could not be reached ({exc.strerror})"
    # Before the hand-over: the adopting supervisor writes the log's next lines.
    if standby.get("replaced"):
        _log_line(run_dir, "orchestrate: " + standby["replaced"])
    if standby.get("taken_from"):
        _log_line(run_dir, "orchestrate: this worker's Python is the standby run "
                           f"{standby['taken_from']} left lingering")  # fmt: skip
    try:
        connection = {k: os.environ[k] for k in PER_CONNECTION_ENV if k in os.environ}
        message = json.dumps({"run_dir": run_dir, "connection_env": connection}).encode()
        os.write(fifo, message + b"\n")  # under PIPE_BUF (4 KiB): written at once
    finally:
        os.close(fifo)
    deadline = time.monotonic() + HANDOVER_WAIT
    while time.monotonic() < deadline:
        if _is_our_supervisor(pid, run_dir):  # it exec'd `supervise RUN_DIR --adopt`
            return pid, None
        if not _process_group_members(pid):
            break
        time.sleep(0.005)
    _kill_standby(sdir)
    return None, "the standby did not take the attempt"


def _open_handover(path):
    """The standby's fifo, for writing. A standby started a moment ago may not have opened its
    end yet (ENXIO): `up --skip-checks` launches right after starting them."""
    deadline = time.monotonic() + HANDOVER_WAIT
    while True:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def cmd_standby(request):
    """Start (or keep) one standby per spec; the answer per backed run directory."""
    answers = {}
    for spec in request["specs"]:
        backs = _expand(spec["backs"])
        try:
            answers[spec["backs"]] = _start_standby(backs, spec)
        except Exception as exc:  # one slot's failure must not hide the others' answers
            answers[spec["backs"]] = f"error: {type(exc).__name__}: {exc}"
    return {"standbys": answers}


def _start_standby(backs, spec):
    spec = dict(spec)
    _withhold(spec)
    secrets = spec.pop("secret_env", None) or {}
    source = spec.pop("agent_source")
    sdir = standby_dir(backs)
    run = run_of(backs)
    if os.path.exists(os.path.join(run, DISCARDED_MARKER)):
        return "not started: the run's standbys were discarded"
    env = import_env(os.environ, spec["env"], secrets)
    current = _standby_state(sdir)
    linger = float(spec.get("linger", 120))
    verdict, why = standby_verdict(current, backs, spec["python"], env, _agent_digest(source),
                                   now=time.time())  # fmt: skip
    if verdict == "leave":
        return f"not started: {why}"
    if verdict == "keep":
        return "kept"
    if verdict == "take":
        previous = os.path.basename(run_of(current.get("backs") or ""))
        if _take_standby(sdir, backs, linger):
            return "kept" if previous == os.path.basename(run) else f"taken from run {previous}"
        return "not started: another request took the slot's standby"
    _kill_standby(sdir)
    replaced = None
    if current is not None and why and run_of(current.get("backs") or "") != run:
        replaced = (f"not the standby run {os.path.basename(run_of(current['backs']))} left "
                    f"lingering: {why}; this run's standby imports TensorFlow afresh")  # fmt: skip
    # {job}/runs and the run's directory private too (the discard marker goes there)
    _make_private_dirs([os.path.dirname(run), run, os.path.dirname(sdir), sdir])
    for name in ("spec.json", "claimed.json", "ready", "pid", "worker.pid", "handover",
                 "standby.log"):  # fmt: skip
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(sdir, name))
    os.mkfifo(os.path.join(sdir, "handover"), 0o600)
    agent_path = os.path.join(sdir, "agent.py")
    _write_text(agent_path, source)
    salt = os.urandom(16).hex()
    record = {
        "backs": backs,
        "python": spec["python"],
        "cwd": spec["cwd"],
        "linger": linger,
        "salt": salt,
        "digest": env_digest(salt, spec["python"], env),
        "agent": _agent_digest(source),
        "started_at": time.time(),
    }
    if replaced:
        record["replaced"] = replaced
    _write_json(os.path.join(sdir, "spec.json"), record)
    child_env = dict(os.environ, **spec["env"], **secrets)
    argv = [sys.executable, agent_path, "standby", sdir]
    pid = _spawn_daemon(argv, child_env, os.path.join(sdir, "standby.log"))
    _write_text(os.path.join(sdir, "pid"), str(pid))
    return f"started ({why})" if replaced else "started"


def cmd_discard_standbys(request):
    """The run is over (down, its end, a failed start): no standby of its slots may stay, and
    none may start after this (a marker in the run's directory). A slot's standby that another
    run took meanwhile is that run's and stays."""
    outcome = {}
    for run_dir in request["run_dirs"]:
        path = _expand(run_dir)
        run = run_of(path)
        # The marker only behind this account's private {job}/runs/{run_id}: nothing is
        # written into a runs/ another user made or linked (issue 25).
        if os.path.isdir(run) and _private_chain_made([os.path.dirname(run), run]):
            _write_text(os.path.join(run, DISCARDED_MARKER), str(time.time()))
        sdir = standby_dir(path)
        state = _standby_state(sdir)
        ours = state is not None and run_of(state.get("backs") or "") == run
        outcome[run_dir] = "stopped" if ours and _kill_standby(sdir) else "none"
    return {"outcome": outcome}


def _attempt_alive(run_dir):
    """Whether the attempt a standby backs runs. One not started yet counts as ended: a
    standby `up` started before its checks leaves `linger` after nobody launched it."""
    pid = _read_int(os.path.join(run_dir, "pid"))
    return pid is not None and _is_our_supervisor(pid, run_dir)


def run_standby(sdir):
    """The standby's supervisor: its child imports TensorFlow and waits on its stdin; this
    process waits for a hand-over on the fifo, copying the child's output into standby.log."""
    import select
    import subprocess

    spec = _read_standby_spec(sdir)
    ready = os.path.join(sdir, "ready")
    child = subprocess.Popen(
        [spec["python"], "-m", STANDBY_MODULE, ready], cwd=_expand(spec["cwd"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    _write_text(os.path.join(sdir, "worker.pid"), str(child.pid))

    def leave(_signum=None, _frame=None):
        if child.poll() is None:
            child.kill()
            child.wait()
        with contextlib.suppress(OSError):
            os.remove(ready)
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    fifo_path = os.path.join(sdir, "handover")
    fifo = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)
    keep_open = os.open(fifo_path, os.O_WRONLY | os.O_NONBLOCK)  # no EOF when a writer leaves
    output = child.stdout.fileno()
    pending = b""
    ended_at = None
    spec_path = os.path.join(sdir, "spec.json")
    seen = _file_identity(spec_path)
    while True:
        ready_fds = select.select([output, fifo], [], [], 0.5)[0]
        if output in ready_fds:
            chunk = os.read(output, 65536)
            if not chunk:
                break  # the child ended
            os.write(1, chunk)
        if fifo in ready_fds:
            pending += os.read(fifo, 4096)
            if b"\n" in pending:
                line = pending.split(b"\n", 1)[0]
                _adopt_run(child, json.loads(line), keep_open)  # returns only on failure
                break
        if child.poll() is not None or not os.path.isdir(sdir):
            break
        identity = _file_identity(spec_path)
        if identity is not None and identity != seen:  # released, or taken by the next run
            seen, spec, ended_at = identity, _read_json(spec_path) or spec, None
        ended_at = _standby_done(spec, ended_at)
        if ended_at is True:
            break
    leave()


def _read_standby_spec(sdir):
    """Its spec.json; or claimed.json: a launch right after the start (`up --skip-checks`) may
    claim it before this process has read it; or, a moment later, a take's rewrite."""
    deadline = time.monotonic() + 2.0
    while True:
        for name in ("spec.json", "claimed.json"):
            spec = _read_json(os.path.join(sdir, name))
            if spec is not None:
                return spec
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no spec.json in {sdir}")
        time.sleep(0.01)


def _standby_done(spec, ended_at):
    """True when the standby should leave; else since when the attempt it backs has ended."""
    if os.path.exists(os.path.join(run_of(spec["backs"]), DISCARDED_MARKER)):
        return True
    if spec.get("until") is not None:  # its run ended and left it lingering
        return True if time.time() >= spec["until"] else None
    if _attempt_alive(spec["backs"]):
        return None
    # The attempt it backs ended: a restart claims it soon, or nobody ever will.
    ended_at = ended_at or time.monotonic()
    return True if time.monotonic() - ended_at > spec["linger"] else ended_at


def _file_identity(path):
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns)


def _adopt_run(child, message, keep_open):
    """Become the run directory's supervisor: exec `supervise RUN_DIR --adopt` in this same
    process, handing it the child and both ends of its pipes. Returns only if that failed."""
    run_dir = message["run_dir"]
    os.close(keep_open)
    pipes = (child.stdin.fileno(), child.stdout.fileno())
    for fd in pipes:
        os.set_inheritable(fd, True)
    spec = _read_json(os.path.join(run_dir, "spec.json"))
    if spec is None or os.path.exists(os.path.join(run_dir, "stop_requested")):
        return
    # A cold supervisor's environment: the launching agent's connection variables, then the
    # run's variables (the rest is equal: standby_refusal checked it).
    env = {k: v for k, v in os.environ.items() if k not in PER_CONNECTION_ENV}
    env.update(message.get("connection_env") or {})
    env.update(spec["env"])
    argv = [sys.executable, os.path.join(run_dir, "agent.py"), "supervise", run_dir, "--adopt",
            str(child.pid), *map(str, pipes)]  # fmt: skip
    with contextlib.suppress(OSError):
        os.execve(sys.executable, argv, env)


class _AdoptedChild:
    """The Popen surface supervise() uses, for a child inherited across an exec."""

    def __init__(self, pid, stdout_fd):
        self.pid = pid
        self.stdout = os.fdopen(stdout_fd, "rb", buffering=0)
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


def _spawn_daemon(argv, env, log_path):
    """Start argv detached and return its pid once it has exec'd. Forked twice, so that it is
    no child of this agent, which may serve a controller for a long time (its exit would leave
    a zombie here); and answered only after the exec (the pipe is close-on-exec), so that a
    probe right after the launch finds the supervisor's own command line, not this agent's."""
    read_end, write_end = os.pipe()  # both close-on-exec
    middle = os.fork()
    if middle == 0:
        status = 127
        try:
            os.close(read_end)
            daemon = os.fork()
            if daemon == 0:
                _become_daemon(log_path)
                os.execve(argv[0], argv, env)  # returns only by raising
            os.write(write_end, f"{daemon}\n".encode())
            status = 0
        finally:
            os._exit(status)  # neither child ever returns into this agent's serving loop
    os.close(write_end)
    os.waitpid(middle, 0)
    answer = b""
    while chunk := os.read(read_end, 64):  # end of file: the daemon exec'd (or died)
        answer += chunk
    os.close(read_end)
    return int(answer.split()[0])


def _become_daemon(log_path):
    # A new session: no controlling terminal, no SIGHUP when the SSH channel or terminal closes,
    # and its own process group so `stop` can signal the supervisor and worker together.
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)


def supervise(run_dir, adopt=None):
    """Run the worker and record its exit. `adopt` (pid, stdin fd, stdout fd): a standby's
    child that already imported TensorFlow, told here what to run instead of a new process."""
    import subprocess

    spec = _read_json(os.path.join(run_dir, "spec.json"))
    with open(os.path.join(run_dir, "tf_config.json"), encoding="utf-8") as handle:
        tf_config = handle.read()
    env = dict(os.environ)
    env.update(spec["env"])
    env[contract.TF_CONFIG_ENV] = tf_config
    started = time.time()
    if adopt is not None:
        child = _adopted(run_dir, spec, env, adopt)
    else:
        try:
            # The worker writes into a pipe this supervisor drains into worker.log, so the log
            # can be capped: a long run would otherwise fill the disk with it.
            child = subprocess.Popen(
                spec["argv"], cwd=_expand(spec["cwd"]), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
        except OSError as exc:
            _record_exit(run_dir, 127, started, f"cannot start {spec['argv'][0]}: {exc}")
            return None
    _write_text(os.path.join(run_dir, "worker.pid"), str(child.pid))
    watch = procwatch.JoinWatch(child.pid, tf_config)

    def forward(signum, _frame):
        # The worker shares our process group and usually got the signal too; forwarding covers
        # a signal sent to the supervisor alone. The supervisor stays to record the exit.
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    secrets = [os.environ.get(name, "") for name in spec.get("secret_names", ())]
    _copy_output(
        child,
        os.path.join(run_dir, "worker.log"),
        int(spec.get("log_max_bytes") or 0),
        [value.encode() for value in secrets if len(value) >= 4],
    )
    returncode = child.wait()
    _record_exit(run_dir, returncode, started, None, watch.joined())
    return None


def _adopted(run_dir, spec, env, adopt):
    pid, stdin_fd, stdout_fd = adopt
    log = _open_log(run_dir)
    os.dup2(log, 1)  # this process still wrote into the standby's log
    os.dup2(log, 2)
    os.close(log)
    imported = _read_json(os.path.join(standby_dir(run_dir), "ready"))
    how = (f"imported TensorFlow {time.time() - imported['at']:.0f} s ago" if imported
           else "is still importing TensorFlow")  # fmt: skip
    os.write(1, f"orchestrate: warm start: this worker's Python (pid {pid}) {how} as a standby\n"
             .encode())  # fmt: skip
    request = {"argv": spec["argv"], "cwd": _expand(spec["cwd"]), "env": env}
    try:
        with os.fdopen(stdin_fd, "wb") as stdin:  # one line, then end of input
            stdin.write(json.dumps(request).encode() + b"\n")
    except BrokenPipeError:
        pass  # the child died meanwhile: its exit is recorded like any worker's
    return _AdoptedChild(pid, stdout_fd)


def _copy_output(child, log_path, max_bytes, secrets=()):
    """Drain the worker's output into the log until it ends. Past max_bytes the log is rotated
    once (worker.log -> worker.log.1, the older one dropped): at most twice the cap on disk,
    and `tail -F` follows the new file by its name. With secrets, output goes line by line and
    a secret value a script printed is written as [redacted]."""
    import select

    source = child.stdout.fileno()
    written = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    pending = b""
    while True:
        ready = select.select([source], [], [], 1.0)[0]
        if not ready:
            if child.poll() is not None:
                break  # ended, but a process it left behind holds the pipe open
            continue
        chunk = os.read(source, 65536)
        if not chunk:
            break
        if secrets:
            pending += chunk
            cut = pending.rfind(b"\n") + 1 if len(pending) < 1 << 20 else len(pending)
            chunk, pending = _redact(pending[:cut], secrets), pending[cut:]
        written = _write_log(log_path, chunk, written, max_bytes)
    if pending:
        _write_log(log_path, _redact(pending, secrets), written, max_bytes)


def _redact(data, secrets):
    for value in sorted(secrets, key=len, reverse=True):
        data = data.replace(value, b"[redacted]")
    return data


def _write_log(log_path, chunk, written, max_bytes):
    """Append to the log (fd 1), rotating it first when the chunk would pass max_bytes."""
    if max_bytes and written + len(chunk) > max_bytes:
        os.replace(log_path, log_path + ".1")
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)  # the supervisor's own messages follow into the new file
        os.dup2(log, 2)
        os.close(log)
        written = 0
    os.write(1, chunk)
    return written + len(chunk)


def _log_tail(run_dir, count=LOG_TAIL_LINES):
    text = b""
    for name in ("worker.log.1", "worker.log"):  # a rotated log's last lines may be in .1
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


def _scrub_secrets(run_dir, lines):
    # A script that printed a secret: its value stays out of exit.json (and so out of status
    # and the root-cause report). The values are in this supervisor's environment.
    spec = _read_json(os.path.join(run_dir, "spec.json")) or {}
    values = [os.environ.get(name, "") for name in spec.get("secret_names", ())]
    values = [value for value in values if len(value) >= 4]
    for value in sorted(values, key=len, reverse=True):
        lines = [line.replace(value, "[redacted]") for line in lines]
    return lines


def _record_exit(run_dir, returncode, started, error, joined=None):
    signal_name = None
    if returncode < 0:
        try:
            signal_name = signal.Signals(-returncode).name
        except ValueError:
            signal_name = f"signal {-returncode}"
    tail = _scrub_secrets(run_dir, _log_tail(run_dir))
    if error is None and returncode > 0 and tail:
        error = tail[-1]  # usually the exception line; after a signal it would be noise
    record = {
        "returncode": returncode,
        "signal": signal_name,
        "started_at": started,
        "finished_at": time.time(),
        "error": error,
        "log_tail": tail if returncode != 0 else [],
    }
    if joined is not None:  # JoinWatch's verdict: a multi-worker worker that loaded TensorFlow
        record["joined"] = joined
    _write_json(os.path.join(run_dir, "exit.json"), record)


def _process_group_members(pgid):
    """Live (non-zombie) processes of a process group, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _is_our_supervisor(pid, run_dir):
    # Guards against pid reuse: the supervisor's command line names its run directory, and it
    # runs as this account (another user's process is never taken for ours, nor signalled).
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and run_dir.encode() in argv


_WATCHED: dict = {}  # pid -> psutil.Process, kept between the probes of one session


def _usage(pids):
    """CPU% and resident memory of the worker processes (psutil if present). CPU% is measured
    since the previous probe of the same session; for a process seen first, since it started
    (its CPU time over its age: no sample to wait for, so the probe that follows a worker's
    exit, or a restart, answers at once instead of 0.2 s later)."""
    try:
        import psutil
    except ImportError:
        return {}
    usage = {}
    for pid in pids:
        try:
            known = pid in _WATCHED and _WATCHED[pid].is_running()
            process = _WATCHED[pid] if known else psutil.Process(pid)
            _WATCHED[pid] = process
            with process.oneshot():
                percent = process.cpu_percent(None)  # since the last call (0.0 on the first)
                created = process.create_time()
                if not known:
                    times = process.cpu_times()
                    percent = _average_percent(times.user + times.system, time.time() - created)
                usage[pid] = {
                    "cpu_percent": percent,
                    "rss_bytes": process.memory_info().rss,
                    "create_time": created,
                }
        except psutil.Error:
            continue
    return usage


def _average_percent(cpu_seconds, age):
    """A process's CPU% over its whole life. Pure."""
    return round(100.0 * cpu_seconds / age, 1) if age > 0 else 0.0


def cmd_probe(request):
    probes = {}
    for run_dir in request["run_dirs"]:
        path = _expand(run_dir)
        pid = _read_int(os.path.join(path, "pid"))
        stop_path = os.path.join(path, "stop_requested")
        stopped = os.path.exists(stop_path)
        probes[run_dir] = {
            "exists": os.path.isdir(path),
            "pid": pid,
            "alive": bool(pid) and _is_our_supervisor(pid, path),
            "worker_pid": _read_int(os.path.join(path, "worker.pid")),
            "progress": _read_json(os.path.join(path, "progress.json")),
            "exit": _read_json(os.path.join(path, "exit.json")),
            "stop_requested": stopped,
            "stopped_by": _stopped_by(stop_path) if stopped else None,  # read only when there
        }
    live_workers = [p["worker_pid"] for p in probes.values() if p["alive"] and p["worker_pid"]]
    usage = _usage(live_workers)
    for probe in probes.values():
        probe["usage"] = usage.get(probe["worker_pid"])
    return {"now": time.time(), "runs": probes}


def _signal_group(pgid, signum):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _in_group(pid, pgid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            stat = handle.read()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0] != "Z" and int(fields[2]) == pgid


def _group_alive(pgid, known):
    """Whether any process of the group lives: its known members first (two reads), the whole
    of /proc only once they are gone (a scan reads every process's stat: hundreds of files on
    a busy host, and it ran every 0.1 s while a worker saved)."""
    return any(_in_group(pid, pgid) for pid in known if pid) or bool(_process_group_members(pgid))


def _stop_request(by):
    """The stop_requested file: when, and who asked (so a survivor stopped by its supervisor
    does not read as stopped by `orchestrate down`)."""
    return json.dumps({"at": time.time(), "by": by})


def _stopped_by(stop_path):
    request = _read_json(stop_path)
    by = request.get("by") if isinstance(request, dict) else None  # older files: a bare time
    return by if isinstance(by, str) else None


def cmd_stop(request):
    grace = float(request.get("grace", 10.0))
    by = str(request.get("by") or "by orchestrate down")
    run_dirs = request["run_dirs"]
    groups, known = {}, {}
    for run_dir in run_dirs:
        path = _expand(run_dir)
        pid = _read_int(os.path.join(path, "pid"))
        if pid and _is_our_supervisor(pid, path):
            # Only a worker still running is "stopped"; one that already ended keeps its verdict
            # (its supervisor lives on for a moment after writing exit.json).
            if not os.path.exists(os.path.join(path, "exit.json")):
                _write_text(os.path.join(path, "stop_requested"), _stop_request(by))
            groups[run_dir] = pid
            known[run_dir] = (pid, _read_int(os.path.join(path, "worker.pid")))
            _signal_group(pid, signal.SIGTERM)
            # A stopped (SIGSTOP) process would hold SIGTERM pending until the grace runs out.
            _signal_group(pid, signal.SIGCONT)
        elif pid is None and _private_chain_made(_run_chain(path)):
            # Never started: a launch still on its way is refused when it arrives. (Where
            # {job}/runs is not safely ours, a launch is refused anyway: nothing written.)
            _write_text(os.path.join(path, "stop_requested"), _stop_request(by))

    def still_alive(alive):
        return {r: g for r, g in alive.items() if _group_alive(g, known[r])}

    alive = dict(groups)
    deadline = time.monotonic() + grace
    nap = 0.005  # most workers end within milliseconds of SIGTERM: look again soon, then less
    while alive and time.monotonic() < deadline:
        alive = still_alive(alive)
        if alive:
            time.sleep(nap)
            nap = min(nap * 2, 0.1)
    outcome = {run_dir: "not running" for run_dir in run_dirs}
    for run_dir in groups:
        outcome[run_dir] = "killed" if run_dir in alive else "stopped"
    for pgid in alive.values():
        _signal_group(pgid, signal.SIGKILL)
    kill_deadline = time.monotonic() + 5
    while alive and time.monotonic() < kill_deadline:
        alive = still_alive(alive)
        if alive:
            time.sleep(0.05)
    left = {run_dir: _process_group_members(pgid) for run_dir, pgid in alive.items()}
    return {"outcome": outcome, "left": {k: v for k, v in left.items() if v}}


def _checkpoint_names(directory):
    """The checkpoints TensorFlow's state file lists, oldest first, the latest last."""
    latest, listed = None, []
    try:
        with open(os.path.join(directory, "checkpoint"), encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                name = os.path.basename(value.strip().strip('"'))
                if key == "model_checkpoint_path":
                    latest = name
                elif key == "all_model_checkpoint_paths" and name not in listed:
                    listed.append(name)
    except OSError:
        return []
    if latest is None:
        return []
    return [name for name in listed if name != latest] + [latest]


def cmd_checkpoint(request):
    """The latest checkpoint and the earlier ones the state file keeps, with their files: a
    host that resumes needs all of them, so that it can fall back to the same earlier one as
    the chief when the latest cannot be loaded."""
    directory = _expand(request["directory"])
    names = _checkpoint_names(directory)
    files, present = {}, []
    try:
        entries = os.listdir(directory)
    except OSError:
        entries = []
    for name in names:
        mine = [e for e in entries if e.startswith(name + ".")]
        if mine:
            present.append(name)
        for entry in mine:
            files[entry] = os.path.getsize(os.path.join(directory, entry))
    for extra in request.get("companions", []):  # files that travel with the checkpoints
        if present and extra in entries:
            files[extra] = os.path.getsize(os.path.join(directory, extra))
    latest = names[-1] if names and names[-1] in present else None
    return {"directory": directory, "latest": latest, "checkpoints": present, "files": files}


def cmd_adopt_checkpoint(request):
    directory, name = _expand(request["directory"]), request["name"]
    names = [n for n in request.get("checkpoints", [name]) if n != name] + [name]
    state = os.path.join(directory, "checkpoint")
    umask = os.umask(0)
    os.umask(umask)  # the state file keeps the user's umask, like the checkpoints beside it
    fd, tmp = _temp_beside(state, 0o666 & ~umask)
    with open(fd, "w", encoding="utf-8") as handle:
        # Relative paths: TensorFlow resolves them against this directory on this host.
        handle.write(f'model_checkpoint_path: "{name}"\n')
        handle.writelines(f'all_model_checkpoint_paths: "{n}"\n' for n in names)
    os.replace(tmp, state)  # last, so a half-copied checkpoint is never the latest
    return {"directory": directory, "latest": name}


def cmd_files(request):
    root = _expand(request["directory"])
    found = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                stat = os.stat(path)
                found[os.path.relpath(path, root)] = [stat.st_size, stat.st_mtime]
    return {"root": root, "files": found}


def cmd_make_dirs(request):
    _make_private_dirs(request.get("private_dirs", []))  # first: checked before any is used
    for path in request.get("directories", []):
        os.makedirs(_expand(path), exist_ok=True)
    return {"made": True}


# --- stacks on request (issue 26) --------------------------------------------------------------
STACKS_FILE = contract.STACKS_FILE  # the worker's faulthandler appends here
STACKS_PID_FILE = contract.STACKS_PID_FILE  # the process that registered it
STACKS_SETTLE = 0.15  # seconds a dump must stop growing before it counts as complete


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _stack_pid(path):
    """The pid that registered the stack dump in this run directory, if it is one of the run's
    live processes (pid reuse, another user's process: never signalled); or why not."""
    pgid = _read_int(os.path.join(path, "pid"))
    if not pgid or not _is_our_supervisor(pgid, path):
        return None, "its worker is not running"
    pid = _read_int(os.path.join(path, STACKS_PID_FILE))
    if not pid:
        return None, "its worker registered no stack dump (still starting, or not a Python worker)"
    if not _in_group(pid, pgid):
        return None, "the process that registered its stack dump is gone"
    if _process_state(pid) in ("T", "t"):  # it would write them only once continued
        return None, "it is stopped (SIGSTOP or a debugger): it cannot write its stacks"
    return pid, None


def _process_state(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _py_spy(pid, wait):
    import shutil
    import subprocess

    tool = shutil.which("py-spy")
    if tool is None:
        return "py-spy is not installed on this host (pip install py-spy for native frames)"
    try:
        done = subprocess.run([tool, "dump", "--native", "--pid", str(pid)], check=False,
                              capture_output=True, text=True, timeout=max(wait, 1.0))  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy could not run: {exc}"
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"py-spy is not allowed here ({detail[0]}; ptrace may need CAP_SYS_PTRACE)"
    return done.stdout


def cmd_stacks(request):
    """Every thread's Python stack of each run directory's worker: SIGUSR2 to the process that
    registered faulthandler (`send`, the default), then what it appended to stacks.txt, read
    once it stopped growing. Without `send` nothing is signalled (a scheduler delivered the
    signal): `offsets` are the sizes before it, from a request with `mark`. Per run directory
    {"stacks": TEXT} (and "native" with `native`, py-spy's), or {"error": WHY}: all within
    `wait` seconds together."""
    run_dirs = request["run_dirs"]
    files = {r: os.path.join(_expand(r), STACKS_FILE) for r in run_dirs}
    if request.get("mark"):
        return {"offsets": {r: _size(f) for r, f in files.items()}}
    wait = float(request.get("wait", 5.0))
    deadline = time.monotonic() + wait
    offsets = request.get("offsets") or {}
    answers, pending, pids = {}, {}, {}
    for run_dir in run_dirs:
        offset = int(offsets.get(run_dir, _size(files[run_dir])))
        if request.get("send", True):
            pid, why = _stack_pid(_expand(run_dir))
            if why is not None:
                answers[run_dir] = {"error": why}
                continue
            try:
                os.kill(pid, signal.SIGUSR2)
            except OSError as exc:
                answers[run_dir] = {"error": f"cannot signal pid {pid}: {exc.strerror}"}
                continue
            pids[run_dir] = pid
        pending[run_dir] = [offset, -1, 0.0]  # offset, size seen, since when unchanged
    while pending and time.monotonic() < deadline:
        now = time.monotonic()
        for run_dir, seen in list(pending.items()):
            size = _size(files[run_dir])
            if size != seen[1]:
                seen[1], seen[2] = size, now
            elif size > seen[0] and now - seen[2] >= STACKS_SETTLE:
                with open(files[run_dir], "rb") as handle:
                    handle.seek(seen[0])
                    text = handle.read(size - seen[0]).decode("utf-8", "replace")
                answers[run_dir] = {"stacks": text}
                del pending[run_dir]
        time.sleep(0.02)
    for run_dir in pending:
        answers[run_dir] = {"error": f"it wrote no stacks within {wait:g} s"}
    if request.get("native"):
        for run_dir, pid in pids.items():
            native = _py_spy(pid, max(deadline - time.monotonic(), 2.0))
            answers[run_dir]["native"] = native
    return {"stacks": answers}


# --- watch: an exit told the moment it happens ------------------------------------------------
WATCH_TICK = 0.25  # seconds between looks at the files (a backstop where a pidfd sees the exit)
WATCH_TICK_NO_PIDFD = 0.02  # where os.pidfd_open is missing (not Linux >= 5.3, Python < 3.9)
EXIT_RECORD_WAIT = 2.0  # seconds from a worker's exit to its supervisor's exit record, at most


def _running(path):
    pid = _read_int(os.path.join(path, "pid"))
    return (not os.path.exists(os.path.join(path, "exit.json"))
            and bool(pid) and _is_our_supervisor(pid, path))  # fmt: skip


def _pidfd(pid):
    try:
        return os.pidfd_open(pid) if pid else None
    except (AttributeError, OSError):  # no pidfds here, or the process is gone already
        return None


def cmd_watch(request):
    """Wait until one of the run directories (whose workers the controller saw running) ends,
    at most `timeout`; at once if one has ended already.
    A pidfd per worker and supervisor wakes this at its exit (the supervisor is the worker's
    parent and writes exit.json right after its waitpid); the files are looked at every tick
    too, for what no pidfd covers. Served in a session, the next line on its input (a `wake`,
    or the end of input) ends the wait at once with {"changed": false, "woken": true}: the
    controller's stop request does not wait out a long watch."""
    import select

    deadline = time.monotonic() + min(float(request.get("timeout") or 0), 60.0)
    running = list(map(_expand, request["run_dirs"]))  # the ones the controller saw running
    if not all(map(_running, running)):
        return {"changed": True}  # ended since the controller last looked
    woken = {"changed": False, "woken": True}
    lines = _Input.serving
    if lines is not None and lines.pending():
        return woken
    fds = []
    for path in running:
        for name in ("worker.pid", "pid"):
            fd = _pidfd(_read_int(os.path.join(path, name)))
            if fd is not None:
                fds.append(fd)
    tick = WATCH_TICK if fds else WATCH_TICK_NO_PIDFD
    waits = fds + ([lines.fd] if lines is not None else [])
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready = select.select(waits, [], [], min(left, tick))[0] if waits else []
            if not waits:
                time.sleep(min(left, tick))
            if lines is not None and lines.fd in ready:
                return woken  # the controller wrote again: its next line is for later
            if ready:
                break  # a process ended: its exit record follows within moments
            if any(not _running(path) for path in running):
                return {"changed": True}
        else:
            return {"changed": False}
        settle = time.monotonic() + EXIT_RECORD_WAIT
        while time.monotonic() < settle and all(_running(path) for path in running):
            time.sleep(0.002)
        return {"changed": True}
    finally:
        for fd in fds:
            os.close(fd)


VERBS = {
    "files": cmd_files,
    "make-dirs": cmd_make_dirs,
    "checkpoint": cmd_checkpoint,
    "adopt-checkpoint": cmd_adopt_checkpoint,
    "info": cmd_info,
    "launch": cmd_launch,
    "probe": cmd_probe,
    "stop": cmd_stop,
    "standby": cmd_standby,
    "discard-standbys": cmd_discard_standbys,
    "linger-standbys": cmd_linger_standbys,
    "standbys": cmd_standbys,
    "stacks": cmd_stacks,
    "watch": cmd_watch,
}


def answer(request):
    verb = request.get("verb")
    if verb not in VERBS:
        return {"error": f"unknown verb {verb!r}; known: {', '.join(VERBS)}"}
    try:
        return VERBS[verb](request)
    except Exception as exc:  # one failed request must not end the session
        return {"error": f"{verb}: {type(exc).__name__}: {exc}"}


class _Input:
    """The session's request lines, read straight from its file descriptor (no hidden buffer),
    so that `watch` can select on it: a line the controller writes while a watch waits wakes it."""

    serving: "_Input | None" = None  # the session's _Input, while main() serves one

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


def serve(lines, out):
    """One JSON answer per JSON request line until end of input: a supervisor polling every
    second pays for one Python start, not one per poll. A `wake` line gets no answer: it only
    ends a watch that waits (it may come just after the watch ended by itself)."""
    for line in lines:
        if line.strip():
            request = json.loads(line)
            if request.get("verb") == "wake":
                continue
            out.write(json.dumps(answer(request)) + "\n")
            out.flush()


def main(argv):
    if argv[:1] == ["supervise"] and len(argv) == 2:
        supervise(argv[1])
        return 0
    if argv[:1] == ["supervise"] and len(argv) == 6 and argv[2] == "--adopt":
        supervise(argv[1], adopt=tuple(int(value) for value in argv[3:]))
        return 0
    if argv[:1] == ["standby"] and len(argv) == 2:
        run_standby(argv[1])
        return 0
    if argv:
        sys.stderr.write("usage: agent.py (requests as JSON lines on stdin)\n")
        return 2
    _Input.serving = _Input(sys.stdin.fileno())
    serve(_Input.serving, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
