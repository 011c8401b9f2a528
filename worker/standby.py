"""A standby worker: `python -m worker.standby READY_FILE`, started by the host agent.

It imports TensorFlow and nothing else: no TensorFlow op runs, no eager context is created, so
the worker it becomes can still apply tf.config settings and create its strategy first. Then it
writes READY_FILE and blocks on one JSON line on stdin, {"argv", "cwd", "env"}: the command line
of the worker it is to become (`PYTHON -m MODULE ARGS`, `PYTHON SCRIPT ARGS` or a script behind
orchestrate's boot, `PYTHON -c BOOT SCRIPT ARGS`), its working
directory and its whole environment (TF_CONFIG included). It takes them over the way the
interpreter would have set them up, and runs the module or script as __main__. End of input
without a line (its supervisor went away, or the standby was discarded) ends it quietly.

What a cold start would not share: TensorFlow and its dependencies were imported in the
environment the standby was started with. The host agent hands a standby only attempts whose
environment at that import was the same (agent.standby_refusal); orchestrate's own `worker`
modules are dropped and imported afresh, so nothing of them holds the standby's environment.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time

from orchestrator.contract import (
    READY_AT,
    READY_IMPORT_SECONDS,
    READY_PACKAGE_DIRS,
    READY_PID,
    REQUEST_ARGV,
    REQUEST_CWD,
    REQUEST_ENV,
    SAFE_PATH_ENV,
)


def package_dirs() -> dict[str, int]:
    """The package directories on sys.path with their modification times: installing or
    removing a package changes its directory's, so the agent can tell that what this process
    imported is no longer what a fresh interpreter would import (a lingering standby)."""
    found = {}
    for entry in sys.path[1:]:
        if os.path.basename(entry) in ("site-packages", "dist-packages"):
            try:
                found[entry] = os.stat(entry).st_mtime_ns
            except OSError:
                continue
    return found


def _write_ready(path: str, imported_in: float) -> None:
    tmp = f"{path}.tmp"
    record = {READY_PID: os.getpid(), READY_AT: time.time(), READY_IMPORT_SECONDS: imported_in,
              READY_PACKAGE_DIRS: package_dirs()}  # fmt: skip
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(record, handle)
    os.replace(tmp, path)


def become(request: dict[str, object]) -> None:
    """Turn this process into the worker `request` describes, and run it (may raise
    SystemExit, like the worker would)."""
    argv = [str(arg) for arg in request[REQUEST_ARGV]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in request[REQUEST_ENV].items()}  # type: ignore[attr-defined]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(str(request[REQUEST_CWD]))
    devnull = os.open(os.devnull, os.O_RDONLY)  # a cold worker's stdin is /dev/null too
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin
    for name in [m for m in sys.modules if m == "worker" or m.startswith("worker.")]:
        if name != __name__:
            del sys.modules[name]  # imported afresh, in the worker's own environment
    if len(argv) >= 3 and argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        if not env.get(SAFE_PATH_ENV):  # under the safe path the worker appends it itself
            first_on_path(os.getcwd())  # what `python -m` puts first
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    elif len(argv) >= 3 and argv[1] == "-c":  # a script behind the stacks boot (contract)
        sys.argv = ["-c", *argv[3:]]
        first_on_path("")  # what `python -c` puts first; the boot sets the script's
        exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__"})
    else:
        script = os.path.abspath(argv[1])
        sys.argv = [argv[1], *argv[2:]]
        first_on_path(os.path.dirname(script))  # what `python SCRIPT` puts first
        runpy.run_path(script, run_name="__main__")


def first_on_path(entry: str) -> None:
    """Put `entry` first on sys.path as Python would have for the worker's command. This
    standby started with the safe path (nothing of its directory on sys.path: it imports
    TensorFlow, no module of the user's), or, on Python before 3.11, with its directory first:
    that entry is the one replaced."""
    if getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, entry)
    else:
        sys.path[0] = entry


def main() -> int:
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m worker.standby READY_FILE (started by the agent)\n")
        return 2
    began = time.monotonic()
    import tensorflow  # noqa: F401 - the point: paid now, before the attempt that needs it

    imported_in = time.monotonic() - began
    _write_ready(sys.argv[1], imported_in)
    print(
        f"standby: tensorflow imported in {imported_in:.1f} s; waiting for an attempt", flush=True
    )
    line = sys.stdin.readline()
    if not line.strip():
        sys.stdout.flush()
        os._exit(0)  # nothing ran: skip TensorFlow's teardown, which can block for long
    # From here on this is the worker: its exit, exceptions and teardown are a cold one's.
    become(json.loads(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
