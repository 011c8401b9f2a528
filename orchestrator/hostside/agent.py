"""The host-side agent: the only orchestrate code on a training host besides the worker.

STANDARD LIBRARY ONLY. The controller sends this file's source with every call
(`python -c SOURCE`), the modules it imports carried in front of it (hostside/bundle.py), so a
host needs nothing but a Python interpreter (3.7 or newer). It serves the verbs of protocol.py
(its table lists them and their fields) as JSON lines on standard input until end of input:
  info, launch                 here
  probe, stop, stacks, watch   control.py: process control
  checkpoint, adopt-checkpoint, files, make-dirs
                               files.py
  standby, discard-standbys, linger-standbys, standbys
                               standbys.py: warm restarts
`launch` creates the run directory, writes TF_CONFIG to a file, and starts a detached minder
(minder.py) that runs the worker; or hands the attempt to the slot's standby. The spec's
secret_env values go to the minder's environment only, never into spec.json or any other file.
The agent starts itself in two more forms (its copy in a run or standby directory, never with a
job value in argv): `agent.py supervise RUN_DIR [--adopt PID IN OUT]`, a run's minder, and
`agent.py standby STANDBY_DIR`, a standby.
Privacy: the spec's private_dirs ({job}/runs down to the run directory) are made 0700 and every
file written here is 0600, so another account on the host reads nothing of a run. The files of a
run directory and a standby's: rundir.py.
"""

import os
import socket
import sys

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator.hostside import (
        control,
        files,
        minder,
        protocol,
        rundir,
        safefiles,
        standbys,
    )
else:  # shipped: hostside/bundle.py carries them in front of this file's source
    import control  # type: ignore[no-redef]
    import files  # type: ignore[no-redef]
    import minder  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import rundir  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]
    import standbys  # type: ignore[no-redef]


def cmd_info(_request):
    return {
        protocol.HOME_KEY: os.path.expanduser("~"),
        protocol.HOSTNAME_KEY: socket.gethostname(),
        protocol.PYTHON_KEY: sys.version.split()[0],
        "executable": sys.executable,
    }


def cmd_launch(request):
    """Create the run directory and start the worker: warm (the slot's standby takes it) or
    cold (a new minder)."""
    spec = dict(request[protocol.SPEC_KEY])
    minder.withhold(spec)
    secrets = spec.pop(protocol.SECRET_ENV_KEY, None) or {}
    spec["secret_names"] = sorted(secrets)  # names only, to scrub their values from exit.json
    run_dir = rundir.expand(spec[protocol.RUN_DIR_KEY])
    rundir.make_private_dirs(spec.get(protocol.PRIVATE_DIRS_KEY) or [run_dir])
    if os.path.exists(os.path.join(run_dir, rundir.STOP_FILE)):
        # A launch that arrives after its run was stopped (its controller died mid-launch and
        # the attempt was stopped meanwhile) must not start a worker nobody waits for.
        raise RuntimeError(f"{run_dir} was stopped before this launch arrived")
    safefiles.write_json(os.path.join(run_dir, rundir.TF_CONFIG_FILE), spec[protocol.TF_CONFIG_KEY])
    safefiles.write_json(os.path.join(run_dir, rundir.SPEC_FILE), spec)
    agent_path = os.path.join(run_dir, rundir.AGENT_FILE)
    safefiles.write_text(agent_path, spec["agent_source"])
    cold_reason = None
    if "warm" in spec:  # a controller that knows standbys; older ones send no such field
        pid, cold_reason = standbys.hand_to_standby(run_dir, spec, secrets)
        if pid is not None:
            safefiles.write_text(os.path.join(run_dir, rundir.PID_FILE), str(pid))
            return {protocol.PID_KEY: pid, protocol.RUN_DIR_KEY: run_dir, protocol.WARM_KEY: True}
        if cold_reason not in (None, "no standby", "warm restarts are off"):
            rundir.log_line(run_dir, f"orchestrate: cold start: {cold_reason}")
    # The minder carries the run's variables too, so every process of a run is findable.
    # The secrets live here, in its environment (readable by this account only), and reach
    # the worker from it: no file on the host ever holds them.
    env = dict(os.environ, **spec[protocol.ENV_KEY], **secrets)
    argv = protocol.minder_argv(sys.executable, agent_path, run_dir)
    # spawn point: the run's minder, `agent.py supervise RUN_DIR`, detached
    pid = minder.spawn_daemon(argv, env, os.path.join(run_dir, rundir.WORKER_LOG))
    safefiles.write_text(os.path.join(run_dir, rundir.PID_FILE), str(pid))
    return {
        protocol.PID_KEY: pid,
        protocol.RUN_DIR_KEY: run_dir,
        protocol.WARM_KEY: False,
        "cold_reason": cold_reason,
    }


VERBS = {
    protocol.FILES: files.cmd_files,
    protocol.MAKE_DIRS: files.cmd_make_dirs,
    protocol.CHECKPOINT: files.cmd_checkpoint,
    protocol.ADOPT_CHECKPOINT: files.cmd_adopt_checkpoint,
    protocol.SET_ASIDE: files.cmd_set_aside,
    protocol.INFO: cmd_info,
    protocol.LAUNCH: cmd_launch,
    protocol.PROBE: control.cmd_probe,
    protocol.STOP: control.cmd_stop,
    protocol.STANDBY: standbys.cmd_standby,
    protocol.DISCARD_STANDBYS: standbys.cmd_discard_standbys,
    protocol.LINGER_STANDBYS: standbys.cmd_linger_standbys,
    protocol.STANDBYS: standbys.cmd_standbys,
    protocol.STACKS: control.cmd_stacks,
    protocol.WATCH: control.cmd_watch,
}


def main(argv):
    if argv[:1] == [protocol.SUPERVISE] and len(argv) == 2:
        minder.supervise(argv[1])
        return 0
    if argv[:1] == [protocol.SUPERVISE] and len(argv) == 6 and argv[2] == protocol.ADOPT:
        minder.supervise(argv[1], adopt=tuple(int(value) for value in argv[3:]))
        return 0
    if argv[:1] == [protocol.STANDBY_ARGV] and len(argv) == 2:
        standbys.run_standby(argv[1])
        return 0
    if argv:
        sys.stderr.write("usage: agent.py (requests as JSON lines on stdin)\n")
        return 2
    protocol.RequestLines.serving = protocol.RequestLines(sys.stdin.fileno())
    protocol.serve(protocol.RequestLines.serving, sys.stdout, VERBS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
