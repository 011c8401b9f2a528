"""Which standby may serve which attempt: the pure decisions of warm restarts (standbys.py acts
on them).

STANDARD LIBRARY ONLY (part of the agent, shipped with it: hostside/bundle.py). Every function
here is pure: a standby is its spec.json's fields with what the agent saw of it (`alive`: its
minder runs; `backing_alive`: the attempt it backs runs; `ready`, `packages_changed`).
"""

import hashlib
import json
import os

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator import contract
    from orchestrator.hostside import protocol, rundir
else:  # shipped: hostside/bundle.py carries them in front of the agent's source
    import contract  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import rundir  # type: ignore[no-redef]

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


def import_env(base, spec_env, secrets):
    """The environment a worker of this spec has when it imports TensorFlow, without the values
    that change from attempt to attempt (read only later). Cold: the minder's environment (this
    agent's, the spec's variables, the secrets), which the worker inherits."""
    env = dict(base)
    env.update(spec_env)
    env.update(secrets)
    skip = PER_ATTEMPT_ENV + PER_RUN_ENV + PER_CONNECTION_ENV
    return {key: value for key, value in env.items() if key not in skip}


def env_digest(salt, python, env):
    """A salted digest: the standby's spec.json (0600) holds no secret value in the clear."""
    text = json.dumps([python, sorted(env.items())], separators=(",", ":"))
    return hashlib.sha256((salt + text).encode()).hexdigest()


def agent_digest(source):
    """Which agent started a standby: another version of orchestrate's never serves."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


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
    """Why this standby may not serve a launch of `argv` with `env` (import_env's), or None."""
    if standby is None:
        return "no standby"
    if not standby.get("alive"):
        return "the standby is gone"
    # One still importing TensorFlow serves too: it reads the hand-over once the import is done,
    # which is sooner than a cold start's (`up` starts the first attempt's before its checks).
    if runnable_argv(argv) is None:
        return f"a standby cannot run {argv[:2]}"
    if standby.get(protocol.PYTHON_KEY) != argv[0]:
        return f"the standby runs {standby.get(protocol.PYTHON_KEY)}, this attempt {argv[0]}"
    if standby.get("digest") != env_digest(standby.get("salt", ""), argv[0], env):
        return "the standby's environment differs from this attempt's"
    if standby.get("packages_changed"):
        return f"packages changed in {standby['packages_changed']} since the standby's import"
    return None


# --- standbys between runs (job.linger): which standby may serve which slot of which run ------


def foreign_standby(standby, run_dir):
    """Why the slot's standby is not this run's to use or discard, or None: it backs an attempt
    of another run of the job that still runs (never released by that run's end)."""
    if standby is None or not standby.get("alive"):
        return None
    other = rundir.run_of(standby.get(protocol.BACKS_KEY) or "")
    if other == rundir.run_of(run_dir) or standby.get("until") is not None:
        return None
    if standby.get("backing_alive"):
        return f"the slot's standby serves run {os.path.basename(other)}, which still runs"
    return None


def standby_verdict(standby, backs, python, env, agent, *, now):
    """What a request for a standby backing `backs` (interpreter `python`, import_env `env`,
    agent digest `agent`) does with the slot's current standby, and why: "keep" (it backs
    `backs` already), "take" (re-pointed at `backs`: one of this run's, or one another run of
    the job left lingering), "leave" (foreign_standby: not ours to touch) or "replace" (none,
    gone, expired or stale: discarded and a new one started)."""
    if standby is None or not standby.get("alive"):
        return "replace", None
    foreign = foreign_standby(standby, backs)
    if foreign:
        return "leave", foreign
    until = standby.get("until")
    if until is not None and now >= until:
        return "replace", "its linger ran out"
    if standby.get(protocol.PYTHON_KEY) != python:
        return "replace", f"the standby runs {standby.get(protocol.PYTHON_KEY)}, this run {python}"
    if standby.get("digest") != env_digest(standby.get("salt", ""), python, env):
        return "replace", "the standby's environment differs from this run's"
    if standby.get("agent") != agent:
        return "replace", "another version of orchestrate started the standby"
    if standby.get("packages_changed"):
        return "replace", (f"packages changed in {standby['packages_changed']} since the "
                           "standby's import")  # fmt: skip
    if standby.get(protocol.BACKS_KEY) == backs and until is None:
        return "keep", None
    return "take", None


def standby_summary(name, standby, now, rss_bytes):
    """One line of the `standbys` listing."""
    until = standby.get("until")
    return {
        protocol.NAME_KEY: name,
        protocol.PID_KEY: standby.get(protocol.PID_KEY),
        protocol.WORKER_PID_KEY: standby.get(protocol.WORKER_PID_KEY),
        protocol.RUN_ID_KEY: os.path.basename(rundir.run_of(standby.get(protocol.BACKS_KEY) or "")),
        protocol.BACKS_KEY: standby.get(protocol.BACKS_KEY),
        protocol.LINGERING_KEY: until is not None,
        protocol.LEFT_S_KEY: None if until is None else max(0.0, until - now),
        protocol.READY_KEY: bool(standby.get(protocol.READY_KEY)),
        protocol.RSS_BYTES_KEY: rss_bytes,
        protocol.STARTED_AT_KEY: standby.get(protocol.STARTED_AT_KEY),
    }
