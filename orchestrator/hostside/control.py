"""The agent's process control: which processes are a run's (its minder's process group), and
the verbs that look at them or signal them: probe, stop, stacks, watch.

STANDARD LIBRARY ONLY (part of the agent, shipped with it: hostside/bundle.py); psutil only
where a host happens to have it, for the probe's CPU and memory figures. Only this account's
processes count as a run's minder (pid reuse, or another user's job, is ignored), and only they
are ever signalled.
"""

import contextlib
import os
import signal
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator.hostside import protocol, rundir, safefiles
else:  # shipped: hostside/bundle.py carries them in front of the agent's source
    import protocol  # type: ignore[no-redef]
    import rundir  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]

# --- a run's processes, from /proc ---------------------------------------------------------------


def process_group_members(pgid):
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


def is_our_minder(pid, run_dir):
    # Guards against pid reuse: the minder's command line names its run directory, and it runs
    # as this account (another user's process is never taken for ours, nor signalled).
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


def minder_alive(path):
    """Whether the run (or standby) directory's minder runs."""
    pid = rundir.read_int(os.path.join(path, rundir.PID_FILE))
    return pid is not None and is_our_minder(pid, path)


def signal_group(pgid, signum):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def in_group(pid, pgid):
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
    return any(in_group(pid, pgid) for pid in known if pid) or bool(process_group_members(pgid))


def _process_state(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


# --- probe --------------------------------------------------------------------------------------
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
                    percent = average_percent(times.user + times.system, time.time() - created)
                usage[pid] = {
                    protocol.CPU_PERCENT_KEY: percent,
                    protocol.RSS_BYTES_KEY: process.memory_info().rss,
                    protocol.CREATE_TIME_KEY: created,
                }
        except psutil.Error:
            continue
    return usage


def average_percent(cpu_seconds, age):
    """A process's CPU% over its whole life. Pure."""
    return round(100.0 * cpu_seconds / age, 1) if age > 0 else 0.0


def cmd_probe(request):
    probes = {}
    for run_dir in request[protocol.RUN_DIRS_KEY]:
        path = rundir.expand(run_dir)
        pid = rundir.read_int(os.path.join(path, rundir.PID_FILE))
        stop_path = os.path.join(path, rundir.STOP_FILE)
        stopped = os.path.exists(stop_path)
        probes[run_dir] = {
            protocol.EXISTS_KEY: os.path.isdir(path),
            protocol.PID_KEY: pid,
            protocol.ALIVE_KEY: bool(pid) and is_our_minder(pid, path),
            protocol.WORKER_PID_KEY: rundir.read_int(os.path.join(path, rundir.WORKER_PID_FILE)),
            protocol.PROGRESS_KEY: rundir.read_json(os.path.join(path, rundir.PROGRESS_FILE)),
            protocol.EXIT_KEY: rundir.read_exit(path),
            protocol.STOP_REQUESTED_KEY: stopped,
            # Only when there is a stop request.
            protocol.STOPPED_BY_KEY: rundir.stopped_by(stop_path) if stopped else None,
            protocol.RESTARTS_KEY: rundir.read_json(os.path.join(path, rundir.RESTARTS_FILE)),
        }
    live_workers = [
        p[protocol.WORKER_PID_KEY]
        for p in probes.values()
        if p[protocol.ALIVE_KEY] and p[protocol.WORKER_PID_KEY]
    ]
    usage = _usage(live_workers)
    for probe in probes.values():
        probe[protocol.USAGE_KEY] = usage.get(probe[protocol.WORKER_PID_KEY])
    return {protocol.NOW_KEY: time.time(), protocol.RUNS_KEY: probes}


# --- stop ---------------------------------------------------------------------------------------


def cmd_stop(request):
    """SIGTERM each run's process group (its minder and worker), SIGKILL what is left after
    `grace`; a run not started yet gets its stop_requested, so a launch still on its way is
    refused when it arrives."""
    grace = float(request.get(protocol.GRACE_KEY, 10.0))
    by = str(request.get("by") or "by orchestrate down")
    run_dirs = request[protocol.RUN_DIRS_KEY]
    groups, known = {}, {}
    for run_dir in run_dirs:
        path = rundir.expand(run_dir)
        pid = rundir.read_int(os.path.join(path, rundir.PID_FILE))
        if pid and is_our_minder(pid, path):
            # Only a worker still running is "stopped"; one that already ended keeps its verdict
            # (its minder lives on for a moment after writing exit.json).
            if not rundir.exited(path):
                safefiles.write_text(os.path.join(path, rundir.STOP_FILE), rundir.stop_request(by))
            groups[run_dir] = pid
            known[run_dir] = (pid, rundir.read_int(os.path.join(path, rundir.WORKER_PID_FILE)))
            signal_group(pid, signal.SIGTERM)
            # A stopped (SIGSTOP) process would hold SIGTERM pending until the grace runs out.
            signal_group(pid, signal.SIGCONT)
        elif pid is None and rundir.private_chain_made(rundir.run_chain(path)):
            # Never started: a launch still on its way is refused when it arrives. (Where
            # {job}/runs is not safely ours, a launch is refused anyway: nothing written.)
            safefiles.write_text(os.path.join(path, rundir.STOP_FILE), rundir.stop_request(by))
    return _ended(run_dirs, groups, known, grace)


def _ended(run_dirs, groups, known, grace):
    """Wait `grace` for the signalled groups to end, SIGKILL the rest; the stop's answer."""

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
        signal_group(pgid, signal.SIGKILL)
    kill_deadline = time.monotonic() + 5
    while alive and time.monotonic() < kill_deadline:
        alive = still_alive(alive)
        if alive:
            time.sleep(0.05)
    left = {run_dir: process_group_members(pgid) for run_dir, pgid in alive.items()}
    return {protocol.OUTCOME_KEY: outcome, protocol.LEFT_KEY: {k: v for k, v in left.items() if v}}


# --- stacks on request (issue 26) ----------------------------------------------------------------
STACKS_SETTLE = 0.15  # seconds a dump must stop growing before it counts as complete


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _stack_pid(path):
    """The pid that registered the stack dump in this run directory, if it is one of the run's
    live processes (pid reuse, another user's process: never signalled); or why not."""
    pgid = rundir.read_int(os.path.join(path, rundir.PID_FILE))
    if not pgid or not is_our_minder(pgid, path):
        return None, "its worker is not running"
    pid = rundir.read_int(os.path.join(path, rundir.STACKS_PID_FILE))
    if not pid:
        return None, "its worker registered no stack dump (still starting, or not a Python worker)"
    if not in_group(pid, pgid):
        return None, "the process that registered its stack dump is gone"
    if _process_state(pid) in ("T", "t"):  # it would write them only once continued
        return None, "it is stopped (SIGSTOP or a debugger): it cannot write its stacks"
    return pid, None


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
    run_dirs = request[protocol.RUN_DIRS_KEY]
    files = {r: os.path.join(rundir.expand(r), rundir.STACKS_FILE) for r in run_dirs}
    if request.get("mark"):
        return {protocol.OFFSETS_KEY: {r: _size(f) for r, f in files.items()}}
    wait = float(request.get("wait", 5.0))
    deadline = time.monotonic() + wait
    offsets = request.get("offsets") or {}
    answers, pending, pids = {}, {}, {}
    for run_dir in run_dirs:
        offset = int(offsets.get(run_dir, _size(files[run_dir])))
        if request.get("send", True):
            pid, why = _signal_stacks(run_dir)
            if why is not None:
                answers[run_dir] = {protocol.ERROR_KEY: why}
                continue
            pids[run_dir] = pid
        pending[run_dir] = [offset, -1, 0.0]  # offset, size seen, since when unchanged
    answers.update(_dumps(files, pending, deadline))
    for run_dir in pending:
        answers[run_dir] = {protocol.ERROR_KEY: f"it wrote no stacks within {wait:g} s"}
    if request.get("native"):
        for run_dir, pid in pids.items():
            native = _py_spy(pid, max(deadline - time.monotonic(), 2.0))
            answers[run_dir][protocol.NATIVE_KEY] = native
    return {protocol.STACKS_KEY: answers}


def _signal_stacks(run_dir):
    """SIGUSR2 to the run's registered process: (its pid, None) or (None, why not)."""
    pid, why = _stack_pid(rundir.expand(run_dir))
    if why is not None:
        return None, why
    try:
        os.kill(pid, signal.SIGUSR2)
    except OSError as exc:
        return None, f"cannot signal pid {pid}: {exc.strerror}"
    return pid, None


def _dumps(files, pending, deadline):
    """What each pending stacks file grew by once it stopped growing, until the deadline; the
    ones read are taken out of `pending`."""
    answers = {}
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
                answers[run_dir] = {protocol.STACKS_KEY: text}
                del pending[run_dir]
        time.sleep(0.02)
    return answers


# --- watch: an exit told the moment it happens ---------------------------------------------------
WATCH_TICK = 0.25  # seconds between looks at the files (a backstop where a pidfd sees the exit)
WATCH_TICK_NO_PIDFD = 0.02  # where os.pidfd_open is missing (not Linux >= 5.3, Python < 3.9)
EXIT_RECORD_WAIT = 2.0  # seconds from a worker's exit to its minder's exit record, at most


def _running(path):
    pid = rundir.read_int(os.path.join(path, rundir.PID_FILE))
    return not rundir.exited(path) and bool(pid) and is_our_minder(pid, path)


def _pidfd(pid):
    try:
        return os.pidfd_open(pid) if pid else None
    except (AttributeError, OSError):  # no pidfds here, or the process is gone already
        return None


def cmd_watch(request):
    """Wait until one of the run directories (whose workers the controller saw running) ends,
    at most `timeout`; at once if one has ended already.
    A pidfd per worker and minder wakes this at its exit (the minder is the worker's parent and
    writes exit.json right after its waitpid); the files are looked at every tick too, for what
    no pidfd covers. Served in a session, the next line on its input (a `wake`, or the end of
    input) ends the wait at once with {"changed": false, "woken": true}: the controller's stop
    request does not wait out a long watch."""
    deadline = time.monotonic() + min(float(request.get(protocol.TIMEOUT_KEY) or 0), 60.0)
    # the ones the controller saw running
    running = list(map(rundir.expand, request[protocol.RUN_DIRS_KEY]))
    if not all(map(_running, running)):
        return {protocol.CHANGED_KEY: True}  # ended since the controller last looked
    lines = protocol.RequestLines.serving
    if lines is not None and lines.pending():
        return {protocol.CHANGED_KEY: False, "woken": True}
    fds = []
    for path in running:
        for name in (rundir.WORKER_PID_FILE, rundir.PID_FILE):
            fd = _pidfd(rundir.read_int(os.path.join(path, name)))
            if fd is not None:
                fds.append(fd)
    try:
        return _wait_for_exit(running, fds, lines, deadline)
    finally:
        for fd in fds:
            os.close(fd)


def _wait_for_exit(running, fds, lines, deadline):
    import select

    tick = WATCH_TICK if fds else WATCH_TICK_NO_PIDFD
    waits = fds + ([lines.fd] if lines is not None else [])
    while (left := deadline - time.monotonic()) > 0:
        ready = select.select(waits, [], [], min(left, tick))[0] if waits else []
        if not waits:
            time.sleep(min(left, tick))
        if lines is not None and lines.fd in ready:
            # the controller wrote again: its next line is for later
            return {protocol.CHANGED_KEY: False, "woken": True}
        if ready:
            break  # a process ended: its exit record follows within moments
        if any(not _running(path) for path in running):
            return {protocol.CHANGED_KEY: True}
    else:
        return {protocol.CHANGED_KEY: False}
    settle = time.monotonic() + EXIT_RECORD_WAIT
    while time.monotonic() < settle and all(_running(path) for path in running):
        time.sleep(0.002)
    return {protocol.CHANGED_KEY: True}
