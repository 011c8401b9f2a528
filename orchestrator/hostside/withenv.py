"""Runs one command with environment variables that arrive on standard input, never in argv.

STANDARD LIBRARY ONLY, sent as `python -c SOURCE` like agent.py; it imports nothing shipped (no
contract.py, which needs 3.7), so it still runs on Python 3.6. One JSON request line,
{"argv": [...], "env": {NAME: VALUE}, "timeout": SECONDS, "id": N}, is answered with one JSON
line, {"returncode", "stdout", "stderr"} or {"error"}, with the request's "id"; then the next,
until end of input. What it is
for: `sbatch` on a Slurm login node with job.secret_env's values in its environment, so that
`--export=ALL` passes them to the tasks, while no command line (visible to every user there in
`ps`) and no file on the login node ever holds one.
"""

import json
import os
import subprocess
import sys

# protocol.ID, the session's request id: this program imports nothing shipped (Python 3.6).
REQUEST_ID = "id"
# Its request and answer, by these names here (backends/slurm/commands.py writes and reads them).
ARGV_KEY = "argv"
ENV_KEY = "env"
TIMEOUT_KEY = "timeout"
RETURNCODE_KEY = "returncode"
STDOUT_KEY = "stdout"
STDERR_KEY = "stderr"
ERROR_KEY = "error"  # protocol.ERROR_KEY: it could not run the command, or the request was bad


def run(request):
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in request.get(ENV_KEY, {}).items()})
    try:
        done = subprocess.run(  # noqa: UP022 - capture_output is 3.7+, a login node may be 3.6
            [str(a) for a in request[ARGV_KEY]],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=request.get(TIMEOUT_KEY),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {ERROR_KEY: f"{type(exc).__name__}: {exc}"}
    return {
        RETURNCODE_KEY: done.returncode,
        STDOUT_KEY: done.stdout.decode("utf-8", "replace"),
        STDERR_KEY: done.stderr.decode("utf-8", "replace"),
    }


def main():
    for line in sys.stdin:
        if line.strip():
            request = None
            try:
                request = json.loads(line)
                answer = run(request)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                answer = {ERROR_KEY: f"bad request: {exc}"}
            if isinstance(request, dict) and REQUEST_ID in request:
                # Echoed as every host program does: the controller drops a session whose
                # answer carries another id or none.
                answer[REQUEST_ID] = request[REQUEST_ID]
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
