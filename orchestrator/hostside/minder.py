"""The per-worker minder: a detached daemon that starts one worker, copies its output into
worker.log and records its exit.

STANDARD LIBRARY ONLY (part of the agent, shipped with it: hostside/bundle.py). The agent's
`launch` starts it as `agent.py supervise RUN_DIR` from the agent's copy in the run directory
(spawn_daemon: its own session, so it survives the SSH connection and the controller's terminal
closing); a standby becomes one by exec'ing `agent.py supervise RUN_DIR --adopt PID IN OUT`,
taking over the child that already imported TensorFlow (standbys.py). Its pid is the run's
process group (the `pid` file), which `stop` signals; its command line names the run directory,
which is how a probe tells it from a process that reused its pid. The spec's secret values live
in its environment only, and reach the worker from it.
"""

import contextlib
import json
import os
import signal
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator import contract
    from orchestrator.hostside import procwatch, protocol, rundir, safefiles
else:  # shipped: hostside/bundle.py carries them in front of the agent's source
    import contract  # type: ignore[no-redef]
    import procwatch  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import rundir  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]


def withhold(spec):
    """Drop the controller-only variables (notify's signing secrets) from this agent's own
    environment, which every minder, standby and worker it starts inherits: on a local host
    that environment is the controller's. Names the job sets itself (env, secret_env) stay."""
    for name in spec.pop(protocol.WITHHOLD_ENV_KEY, None) or ():
        os.environ.pop(name, None)


def spawn_daemon(argv, env, log_path):
    """Start argv detached and return its pid once it has exec'd. Forked twice, so that it is
    no child of this agent, which may serve a controller for a long time (its exit would leave
    a zombie here); and answered only after the exec (the pipe is close-on-exec), so that a
    probe right after the launch finds the minder's own command line, not this agent's."""
    read_end, write_end = os.pipe()  # both close-on-exec
    middle = os.fork()
    if middle == 0:
        status = 127
        try:
            os.close(read_end)
            daemon = os.fork()
            if daemon == 0:
                _become_daemon(log_path)
                os.execve(argv[0], argv, env)  # the callers' spawn points: a minder, a standby
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
    # and its own process group so `stop` can signal the minder and worker together.
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    log = rundir.open_log(log_path)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)


def supervise(run_dir, adopt=None):
    """Run the worker and record its exit. `adopt` (pid, stdin fd, stdout fd): a standby's
    child that already imported TensorFlow, told here what to run instead of a new process."""
    spec = rundir.read_json(os.path.join(run_dir, rundir.SPEC_FILE))
    with open(os.path.join(run_dir, rundir.TF_CONFIG_FILE), encoding="utf-8") as handle:
        tf_config = handle.read()
    env = dict(os.environ)
    env.update(spec[protocol.ENV_KEY])
    if json.loads(tf_config or "{}"):
        env[contract.TF_CONFIG_ENV] = tf_config
    else:  # a JAX cluster (job.keras: jax): no TF_CONFIG, not even one the host's shell set
        env.pop(contract.TF_CONFIG_ENV, None)
    secrets = rundir.secret_values(spec.get("secret_names", ()), os.environ)
    started = time.time()
    if adopt is not None:
        child = _adopted(run_dir, spec, env, adopt)
    else:
        child = _start_worker(run_dir, spec, env, started, secrets)
        if child is None:
            return None
    safefiles.write_text(os.path.join(run_dir, rundir.WORKER_PID_FILE), str(child.pid))
    watch = procwatch.JoinWatch(child.pid, tf_config)

    def forward(signum, _frame):
        # The worker shares our process group and usually got the signal too; forwarding covers
        # a signal sent to the minder alone. The minder stays to record the exit.
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log = rundir.RotatingLog(os.path.join(run_dir, rundir.WORKER_LOG),
                             int(spec.get(protocol.LOG_MAX_BYTES_KEY) or 0))  # fmt: skip
    rundir.copy_output(child, log.write, secrets)
    returncode = child.wait()
    rundir.record_exit(run_dir, returncode, started, None, watch.joined(), secrets=secrets)
    return None


def _start_worker(run_dir, spec, env, started, secrets):
    """The worker, writing into a pipe this minder drains into worker.log (so the log can be
    capped: a long run would otherwise fill the disk with it); None, with exit.json written,
    when it cannot start."""
    import subprocess

    try:
        return subprocess.Popen(  # spawn point: the worker
            spec[protocol.ARGV_KEY], cwd=rundir.expand(spec[protocol.CWD_KEY]), env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
    except OSError as exc:
        error = f"cannot start {spec[protocol.ARGV_KEY][0]}: {exc}"
        rundir.record_exit(run_dir, 127, started, error, secrets=secrets)
        return None


def _adopted(run_dir, spec, env, adopt):
    pid, stdin_fd, stdout_fd = adopt
    log = rundir.open_log(os.path.join(run_dir, rundir.WORKER_LOG))
    os.dup2(log, 1)  # this process still wrote into the standby's log
    os.dup2(log, 2)
    os.close(log)
    imported = rundir.read_json(os.path.join(rundir.standby_dir(run_dir), rundir.READY_FILE))
    how = (f"imported TensorFlow {time.time() - imported[contract.READY_AT]:.0f} s ago" if imported
           else "is still importing TensorFlow")  # fmt: skip
    os.write(1, f"orchestrate: warm start: this worker's Python (pid {pid}) {how} as a standby\n"
             .encode())  # fmt: skip
    request = {contract.REQUEST_ARGV: spec[protocol.ARGV_KEY],
               contract.REQUEST_CWD: rundir.expand(spec[protocol.CWD_KEY]),
               contract.REQUEST_ENV: env}  # fmt: skip
    try:
        with os.fdopen(stdin_fd, "wb") as stdin:  # one line, then end of input
            stdin.write(json.dumps(request).encode() + b"\n")
    except BrokenPipeError:
        pass  # the child died meanwhile: its exit is recorded like any worker's
    return AdoptedChild(pid, stdout_fd)


class AdoptedChild:
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
