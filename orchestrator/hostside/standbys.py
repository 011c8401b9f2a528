"""Warm restarts: per worker slot, a standby whose child has imported TensorFlow
(worker/standby.py) and waits to be told what to run, so that the slot's next attempt skips the
import. Start, take, hand over, linger, discard, and the standby's own loop.

STANDARD LIBRARY ONLY (part of the agent, shipped with it: hostside/bundle.py). Which standby
may serve which attempt is decided in standbypolicy.py; this module acts on its verdicts.

A launch whose slot has a standby hands the attempt to it when the standby may serve it
(standby_refusal: alive, the same interpreter, the same environment at TensorFlow's import but
for the per-attempt values; one still importing serves too, it reads the hand-over after the
import); otherwise the standby is discarded and the worker starts cold. The hand-over: the
launcher claims the standby (renames its spec.json), writes the run directory into its fifo, and
the standby's process execs `agent.py supervise RUN_DIR --adopt PID IN OUT`: the same process
(the process group `stop` signals), its child still its child, now the run's minder exactly like
a cold one's. A standby that is never claimed exits by itself `linger` seconds after the attempt
it backs ended (or, backing one not started yet, `linger` seconds after it started itself), at
the `until` a run that ended set (linger-standbys), when its run's discard marker appears, or
when its directory is removed.
Between runs (job.linger): a standby lives per job and slot, not per run, so the next run of
the job finds the ones the last run left lingering; its `standby` request takes one
(standby_verdict: the same interpreter, environment and agent) by renaming its spec.json away
and writing it back re-pointed at the new run's attempt (one request wins the rename); a stale
one is discarded and the reason goes into the new worker's log.
"""

import contextlib
import errno
import json
import os
import signal
import sys
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator import contract
    from orchestrator.hostside import control, minder, protocol, rundir, safefiles
    from orchestrator.hostside import standbypolicy as policy
else:  # shipped: hostside/bundle.py carries them in front of the agent's source
    import contract  # type: ignore[no-redef]
    import control  # type: ignore[no-redef]
    import minder  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import rundir  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]
    import standbypolicy as policy  # type: ignore[no-redef]

STANDBY_MODULE = "worker.standby"
HANDOVER_WAIT = 5.0  # seconds a launch waits for a claimed standby to take the attempt


def standby_state(sdir):
    """The standby's spec.json with what is seen of it now (standbypolicy's input), or None."""
    spec = rundir.read_json(os.path.join(sdir, rundir.SPEC_FILE))
    if spec is None:
        return None
    pid = rundir.read_int(os.path.join(sdir, rundir.PID_FILE))
    ready = os.path.join(sdir, rundir.READY_FILE)
    return dict(spec, pid=pid, alive=bool(pid) and control.is_our_minder(pid, sdir),
                backing_alive=control.minder_alive(spec.get(protocol.BACKS_KEY) or "/"),
                worker_pid=rundir.read_int(os.path.join(sdir, rundir.WORKER_PID_FILE)),
                ready=os.path.exists(ready), packages_changed=packages_changed(ready))  # fmt: skip


def packages_changed(ready):
    """A package directory the standby imported from that changed since (worker.standby
    records their modification times once TensorFlow is imported), or None."""
    recorded = (rundir.read_json(ready) or {}).get(contract.READY_PACKAGE_DIRS) or {}
    for path, mtime in sorted(recorded.items()):
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except OSError:
            return path
    return None


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
        root = os.path.join(rundir.expand(job), rundir.STANDBY_DIR_NAME)
        found = []
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(root)):
                state = standby_state(os.path.join(root, name))
                if state is not None and state["alive"]:
                    rss = _rss_bytes([state[protocol.PID_KEY], state.get(protocol.WORKER_PID_KEY)])
                    found.append(policy.standby_summary(name, state, now, rss))
        listing[job] = found
    return {protocol.NOW_KEY: now, protocol.STANDBYS_KEY: listing}


def cmd_linger_standbys(request):
    """The run ended: each of its slots' standbys stays `seconds` from now (job.linger) for the
    next run of the job, whose `standby` request takes it; then it exits by itself."""
    seconds = float(request[protocol.SECONDS_KEY])
    outcome = {}
    for run_dir in request[protocol.RUN_DIRS_KEY]:
        path = rundir.expand(run_dir)
        sdir = rundir.standby_dir(path)
        state = standby_state(sdir)
        outcome[run_dir] = "none"
        if os.path.exists(os.path.join(rundir.run_of(path), rundir.DISCARDED_MARKER)):
            continue  # `down` discarded them
        if state is None or not state["alive"] or not _backs_run(state, rundir.run_of(path)):
            continue
        if _rewrite_spec(sdir, lambda record: record.update(until=time.time() + seconds)):
            outcome[run_dir] = "lingering"
    return {protocol.OUTCOME_KEY: outcome}


def _backs_run(state, run):
    return rundir.run_of(state.get(protocol.BACKS_KEY) or "") == run


def _rewrite_spec(sdir, change):
    """Change the standby's spec.json in place; False if it is gone (claimed or taken). The
    rename is the claim: of two requests at once, one finds spec.json gone and changes
    nothing. The standby re-reads its spec when the file changes."""
    spec_path = os.path.join(sdir, rundir.SPEC_FILE)
    taking = os.path.join(sdir, f"{rundir.TAKING_PREFIX}{os.getpid()}")
    try:
        os.rename(spec_path, taking)
    except FileNotFoundError:
        return False
    record = rundir.read_json(taking) or {}
    change(record)
    safefiles.write_json(spec_path, record)
    os.remove(taking)
    return True


def _take_standby(sdir, backs, linger):
    """Re-point the slot's standby at `backs` (a lingering one: for a new run)."""

    def repoint(record):
        previous = rundir.run_of(record.get(protocol.BACKS_KEY) or "")
        if previous != rundir.run_of(backs):
            record["taken_from"] = os.path.basename(previous)
        record.update(backs=backs, linger=linger)
        record.pop("until", None)

    return _rewrite_spec(sdir, repoint)


def _kill_standby(sdir, wait=5.0):
    """SIGKILL a standby's process group (nothing of it is worth saving) and wait for it."""
    pid = rundir.read_int(os.path.join(sdir, rundir.PID_FILE))
    if not pid or not control.is_our_minder(pid, sdir):
        return False
    control.signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and control.process_group_members(pid):
        time.sleep(0.02)
    return True


# --- the hand-over: a launch whose slot has a standby -------------------------------------------


def hand_to_standby(run_dir, spec, secrets):
    """The minder pid that now runs this attempt's worker, or None and why not."""
    sdir = rundir.standby_dir(run_dir)
    standby = standby_state(sdir)
    foreign = policy.foreign_standby(standby, run_dir)
    if foreign:
        return None, foreign  # another live run's: left alone
    if not spec.get(protocol.WARM_KEY):
        _kill_standby(sdir)
        return None, "warm restarts are off"
    env = policy.import_env(os.environ, spec[protocol.ENV_KEY], secrets)
    why = policy.standby_refusal(standby, spec[protocol.ARGV_KEY], env)
    if why is not None:
        _kill_standby(sdir)
        return None, why
    pid = standby[protocol.PID_KEY]
    try:  # the claim: exactly one launch gets a standby
        os.replace(os.path.join(sdir, rundir.SPEC_FILE), os.path.join(sdir, rundir.CLAIMED_FILE))
        fifo = _open_handover(os.path.join(sdir, rundir.HANDOVER_FIFO))
    except OSError as exc:
        _kill_standby(sdir)
        return None, f"the standby could not be reached ({exc.strerror})"
    # Before the hand-over: the adopting minder writes the log's next lines.
    if standby.get("replaced"):
        rundir.log_line(run_dir, "orchestrate: " + standby["replaced"])
    if standby.get("taken_from"):
        rundir.log_line(run_dir, "orchestrate: this worker's Python is the standby run "
                                 f"{standby['taken_from']} left lingering")  # fmt: skip
    try:
        connection = {k: os.environ[k] for k in policy.PER_CONNECTION_ENV if k in os.environ}
        message = json.dumps({protocol.RUN_DIR_KEY: run_dir, "connection_env": connection}).encode()
        os.write(fifo, message + b"\n")  # under PIPE_BUF (4 KiB): written at once
    finally:
        os.close(fifo)
    deadline = time.monotonic() + HANDOVER_WAIT
    while time.monotonic() < deadline:
        if control.is_our_minder(pid, run_dir):  # it exec'd `supervise RUN_DIR --adopt`
            return pid, None
        if not control.process_group_members(pid):
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


# --- standby, discard-standbys ------------------------------------------------------------------


def cmd_standby(request):
    """Start (or keep) one standby per spec; the answer per backed run directory."""
    answers = {}
    for spec in request["specs"]:
        backs = rundir.expand(spec[protocol.BACKS_KEY])
        try:
            answers[spec[protocol.BACKS_KEY]] = _start_standby(backs, spec)
        except Exception as exc:  # one slot's failure must not hide the others' answers
            answers[spec[protocol.BACKS_KEY]] = f"error: {type(exc).__name__}: {exc}"
    return {protocol.STANDBYS_KEY: answers}


def _start_standby(backs, spec):
    spec = dict(spec)
    minder.withhold(spec)
    secrets = spec.pop(protocol.SECRET_ENV_KEY, None) or {}
    source = spec.pop("agent_source")
    sdir = rundir.standby_dir(backs)
    run = rundir.run_of(backs)
    if os.path.exists(os.path.join(run, rundir.DISCARDED_MARKER)):
        return "not started: the run's standbys were discarded"
    env = policy.import_env(os.environ, spec[protocol.ENV_KEY], secrets)
    current = standby_state(sdir)
    linger = float(spec.get(protocol.LINGER_KEY, 120))
    verdict, why = policy.standby_verdict(current, backs, spec[protocol.PYTHON_KEY], env,
                                          policy.agent_digest(source), now=time.time())  # fmt: skip
    if verdict == "leave":
        return f"not started: {why}"
    if verdict == "keep":
        return "kept"
    if verdict == "take":
        previous = os.path.basename(rundir.run_of(current.get(protocol.BACKS_KEY) or ""))
        if _take_standby(sdir, backs, linger):
            return "kept" if previous == os.path.basename(run) else f"taken from run {previous}"
        return "not started: another request took the slot's standby"
    _kill_standby(sdir)
    replaced = None
    if current is not None and why and not _backs_run(current, run):
        left_by = os.path.basename(rundir.run_of(current[protocol.BACKS_KEY]))
        replaced = (f"not the standby run {left_by} left lingering: {why}; this run's standby "
                    "imports TensorFlow afresh")  # fmt: skip
    # {job}/runs and the run's directory private too (the discard marker goes there)
    rundir.make_private_dirs([os.path.dirname(run), run, os.path.dirname(sdir), sdir])
    _empty_standby_dir(sdir, source)
    record = _standby_record(backs, spec, env, linger, source)
    if replaced:
        record["replaced"] = replaced
    safefiles.write_json(os.path.join(sdir, rundir.SPEC_FILE), record)
    child_env = dict(os.environ, **spec[protocol.ENV_KEY], **secrets)
    agent_path = os.path.join(sdir, rundir.AGENT_FILE)
    argv = protocol.standby_argv(sys.executable, agent_path, sdir)
    # spawn point: a standby, `agent.py standby STANDBY_DIR`, detached
    pid = minder.spawn_daemon(argv, child_env, os.path.join(sdir, rundir.STANDBY_LOG))
    safefiles.write_text(os.path.join(sdir, rundir.PID_FILE), str(pid))
    return f"started ({why})" if replaced else "started"


def _empty_standby_dir(sdir, source):
    """The slot's standby directory emptied of the last one's files, with a new fifo and the
    agent's copy."""
    for name in (rundir.SPEC_FILE, rundir.CLAIMED_FILE, rundir.READY_FILE, rundir.PID_FILE,
                 rundir.WORKER_PID_FILE, rundir.HANDOVER_FIFO, rundir.STANDBY_LOG):  # fmt: skip
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(sdir, name))
    os.mkfifo(os.path.join(sdir, rundir.HANDOVER_FIFO), 0o600)
    safefiles.write_text(os.path.join(sdir, rundir.AGENT_FILE), source)


def _standby_record(backs, spec, env, linger, source):
    """A new standby's spec.json: what it backs, and what standby_verdict compares."""
    salt = os.urandom(16).hex()
    return {
        protocol.BACKS_KEY: backs,
        protocol.PYTHON_KEY: spec[protocol.PYTHON_KEY],
        protocol.CWD_KEY: spec[protocol.CWD_KEY],
        protocol.LINGER_KEY: linger,
        "salt": salt,
        "digest": policy.env_digest(salt, spec[protocol.PYTHON_KEY], env),
        "agent": policy.agent_digest(source),
        protocol.STARTED_AT_KEY: time.time(),
    }


def cmd_discard_standbys(request):
    """The run is over (down, its end, a failed start): no standby of its slots may stay, and
    none may start after this (a marker in the run's directory). A slot's standby that another
    run took meanwhile is that run's and stays."""
    outcome = {}
    for run_dir in request[protocol.RUN_DIRS_KEY]:
        path = rundir.expand(run_dir)
        run = rundir.run_of(path)
        # The marker only behind this account's private {job}/runs/{run_id}: nothing is
        # written into a runs/ another user made or linked (issue 25).
        if os.path.isdir(run) and rundir.private_chain_made([os.path.dirname(run), run]):
            safefiles.write_text(os.path.join(run, rundir.DISCARDED_MARKER), str(time.time()))
        sdir = rundir.standby_dir(path)
        state = standby_state(sdir)
        ours = state is not None and _backs_run(state, run)
        outcome[run_dir] = "stopped" if ours and _kill_standby(sdir) else "none"
    return {protocol.OUTCOME_KEY: outcome}


# --- the standby itself: `agent.py standby STANDBY_DIR` -----------------------------------------


def run_standby(sdir):
    """The standby's process: its child imports TensorFlow and waits on its stdin; this process
    waits for a hand-over on the fifo, copying the child's output into standby.log."""
    import subprocess

    spec = _read_standby_spec(sdir)
    ready = os.path.join(sdir, rundir.READY_FILE)
    child = subprocess.Popen(  # spawn point: the standby's Python, which imports TensorFlow
        [spec[protocol.PYTHON_KEY], "-m", STANDBY_MODULE, ready],
        cwd=rundir.expand(spec[protocol.CWD_KEY]),
        # The safe path (3.11+): a worker.py in that directory cannot replace orchestrate's
        # package (contract.SAFE_PATH_ENV); the worker it becomes puts the directory back.
        env=dict(os.environ, **{contract.SAFE_PATH_ENV: "1"}),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    safefiles.write_text(os.path.join(sdir, rundir.WORKER_PID_FILE), str(child.pid))

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
    _wait_for_handover(sdir, spec, child)
    leave()


def _wait_for_handover(sdir, spec, child):
    """Copy the child's output until a hand-over arrives on the fifo (then exec, returning only
    if that failed), the child ends, or the standby's time is up."""
    import select

    fifo_path = os.path.join(sdir, rundir.HANDOVER_FIFO)
    fifo = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)
    keep_open = os.open(fifo_path, os.O_WRONLY | os.O_NONBLOCK)  # no EOF when a writer leaves
    output = child.stdout.fileno()
    pending = b""
    ended_at = None
    spec_path = os.path.join(sdir, rundir.SPEC_FILE)
    seen = _file_identity(spec_path)
    while True:
        ready_fds = select.select([output, fifo], [], [], 0.5)[0]
        if output in ready_fds:
            chunk = os.read(output, 65536)
            if not chunk:
                return  # the child ended
            os.write(1, chunk)
        if fifo in ready_fds:
            pending += os.read(fifo, 4096)
            if b"\n" in pending:
                line = pending.split(b"\n", 1)[0]
                _adopt_run(child, json.loads(line), keep_open)  # returns only on failure
                return
        if child.poll() is not None or not os.path.isdir(sdir):
            return
        identity = _file_identity(spec_path)
        if identity is not None and identity != seen:  # released, or taken by the next run
            seen, spec, ended_at = identity, rundir.read_json(spec_path) or spec, None
        ended_at = _standby_done(spec, ended_at)
        if ended_at is True:
            return


def _read_standby_spec(sdir):
    """Its spec.json; or claimed.json: a launch right after the start (`up --skip-checks`) may
    claim it before this process has read it; or, a moment later, a take's rewrite."""
    deadline = time.monotonic() + 2.0
    while True:
        for name in (rundir.SPEC_FILE, rundir.CLAIMED_FILE):
            spec = rundir.read_json(os.path.join(sdir, name))
            if spec is not None:
                return spec
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no spec.json in {sdir}")
        time.sleep(0.01)


def _standby_done(spec, ended_at):
    """True when the standby should leave; else since when the attempt it backs has ended."""
    if os.path.exists(
        os.path.join(rundir.run_of(spec[protocol.BACKS_KEY]), rundir.DISCARDED_MARKER)
    ):
        return True
    if spec.get("until") is not None:  # its run ended and left it lingering
        return True if time.time() >= spec["until"] else None
    if control.minder_alive(spec[protocol.BACKS_KEY]):
        return None
    # The attempt it backs ended: a restart claims it soon, or nobody ever will.
    ended_at = ended_at or time.monotonic()
    return True if time.monotonic() - ended_at > spec[protocol.LINGER_KEY] else ended_at


def _file_identity(path):
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns)


def _adopt_run(child, message, keep_open):
    """Become the run directory's minder: exec `supervise RUN_DIR --adopt` in this same
    process, handing it the child and both ends of its pipes. Returns only if that failed."""
    run_dir = message[protocol.RUN_DIR_KEY]
    os.close(keep_open)
    pipes = (child.stdin.fileno(), child.stdout.fileno())
    for fd in pipes:
        os.set_inheritable(fd, True)
    spec = rundir.read_json(os.path.join(run_dir, rundir.SPEC_FILE))
    if spec is None or os.path.exists(os.path.join(run_dir, rundir.STOP_FILE)):
        return
    # A cold minder's environment: the launching agent's connection variables, then the run's
    # variables (the rest is equal: standby_refusal checked it).
    env = {k: v for k, v in os.environ.items() if k not in policy.PER_CONNECTION_ENV}
    env.update(message.get("connection_env") or {})
    env.update(spec[protocol.ENV_KEY])
    agent_path = os.path.join(run_dir, rundir.AGENT_FILE)
    argv = protocol.minder_argv(sys.executable, agent_path, run_dir, (child.pid, *pipes))
    with contextlib.suppress(OSError):
        os.execve(sys.executable, argv, env)  # spawn point: the standby becomes the run's minder
