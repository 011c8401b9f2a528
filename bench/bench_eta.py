"""How true the ETA is, and what goodput the bundled settings reach (issue 56): the bundled
example on two local workers with inventory/local.yaml's own job settings (evaluation,
checkpoints, export) and only `steps` changed, `status --json` polled every POLL seconds; at a
quarter, half and three quarters of the run, the ETA it showed against the time the run then
really took, for the wall-clock ETA (engine/observe/eta.py) and for the one it replaced (steps left
over the latest steps/s, recomputed from the same snapshot's fields). The ETA is the time to the
target step: "took" ends at the first snapshot that shows every worker there; what follows (the
final evaluation, the export, the exit) is printed apart, and then the run's goodput and parts.

`--unwatched` measures only the goodput, of a run nobody polls: `up` in the foreground, as the
README's command runs it. On a 2-core machine the poll's CLI process every second takes CPU from
the workers' start-up, which a user's run does not pay.

    .venv/bin/python -m bench.bench_eta --steps 3000 [--warm] [--unwatched]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

POLL = 1.0
Snapshot = tuple[float, int, float | None, float | None]  # time, step, the ETA shown, the old one
BUNDLED = Path(__file__).resolve().parent.parent / "inventory" / "local.yaml"


def inventory(directory: Path, steps: int, warm: bool) -> Path:
    """The bundled inventory's job with `steps` steps, on ports and a workdir of the bench's
    own. Cold: no standbys. Warm: the bundled standbys, which the next `up` takes (`down`
    discards them at the end: a bench run leaves nothing behind)."""
    bundled = yaml.safe_load(BUNDLED.read_text())
    job = {**bundled["job"], "steps": steps}
    if not warm:
        job.update(warm_restarts=False, linger=0)
    hosts = [
        {"name": "chief", "address": "localhost", "port": 23500 + os.getpid() % 400},
        {"name": "other", "address": "localhost", "port": 23900 + os.getpid() % 400},
    ]
    defaults = {"connection": "local", "workdir": str(directory / "work")}
    path = directory / "inv.yaml"
    path.write_text(yaml.safe_dump({"defaults": defaults, "hosts": hosts, "job": job}))
    return path


def cli(directory: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=directory,
                          capture_output=True, text=True, check=False, timeout=timeout)  # fmt: skip


def poll(directory: Path) -> list[Snapshot]:
    """(time, step, the ETA shown, the old ETA) per snapshot until the run ends."""
    seen: list[Snapshot] = []
    while True:
        result = cli(directory, "status", "--json")
        now = time.monotonic()
        if result.returncode == 0:
            status = json.loads(result.stdout)
            if status["state"] in ("succeeded", "failed", "stopped"):
                seen.append((now, -1, None, None))
                return seen
            workers = [w for w in status["workers"] if w["step"] is not None]
            if workers:
                step = min(w["step"] for w in workers)
                target = max(w["target_steps"] or 0 for w in workers)
                rates = [w["steps_per_sec"] for w in workers if w["steps_per_sec"]]
                old = (target - step) / min(rates) if rates and target > step else None
                seen.append((now, step, status["eta_seconds"], old))
        time.sleep(POLL)


def standbys_ready(directory: Path) -> None:
    """Wait until the finished run's standbys have imported TensorFlow (a user's next `up`
    comes minutes later; the bench's would otherwise take standbys still importing)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        standbys = json.loads(cli(directory, "status", "--json").stdout)["standbys"]
        if standbys and all(s["ready"] for s in standbys):
            return
        time.sleep(POLL)
    raise SystemExit("the standbys were not ready within 120 s")


def measured(steps: int, warm: bool, watched: bool = True) -> tuple[list[Snapshot], dict[str, Any]]:
    """The snapshots of a run of `steps` steps and its final status. Warm: a run of 10 steps
    first, whose standbys the measured run takes (as a user's second `up` does). Unwatched: `up`
    in the foreground and no snapshot."""
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        seen: list[Snapshot] = []
        try:  # `down` in any case: a bench run leaves no worker nor standby behind
            if warm:
                inventory(directory, 10, warm)
                cli(directory, "up", "--skip-checks", "inv.yaml", timeout=600)
                standbys_ready(directory)
            inventory(directory, steps, warm)
            if watched:
                cli(directory, "up", "--detach", "--skip-checks", "inv.yaml")
                seen = poll(directory)
            else:
                cli(directory, "up", "--skip-checks", "inv.yaml", timeout=1800)
            final = json.loads(cli(directory, "status", "--json").stdout)
        finally:
            cli(directory, "down")
    return seen, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warm", action="store_true",
                        help="measure a second run, from the first one's standbys")  # fmt: skip
    parser.add_argument("--unwatched", action="store_true",
                        help="no status polls: only the goodput of a foreground up")  # fmt: skip
    options = parser.parse_args()
    seen, final = measured(options.steps, options.warm, watched=not options.unwatched)
    if seen:
        print_etas(seen, options.steps)
    account = final["goodput"]
    parts = ", ".join(f"{name} {share:.0%}" for name, share in account["shares"].items()
                      if share)  # fmt: skip
    print(
        f"goodput {account['goodput']:.0%} of {account['total_seconds']:.0f} s: {parts}; "
        f"load average at the end: {os.getloadavg()[0]:.1f}"
    )


def print_etas(seen: list[Snapshot], steps: int) -> None:
    """The ETA shown at a quarter, half and three quarters of the run against the time taken."""
    target = steps
    end = next((at for at, step, _, _ in seen if step >= target or step < 0), seen[-1][0])
    print(f"{'at':>6} {'step':>6} {'took':>8} {'ETA now':>8} {'error':>7} {'ETA before':>10} "
          f"{'error':>7}")  # fmt: skip
    for share in (0.25, 0.5, 0.75):
        at, step, new, old = min(seen[:-1], key=lambda s: abs(s[1] - share * steps))
        took = end - at

        def error(eta: float | None, took: float = took) -> str:
            return "-" if eta is None else f"{(eta - took) / took:+.0%}"

        shown = [f"{eta:.0f} s" if eta is not None else "-" for eta in (new, old)]
        print(f"{share:>6.0%} {step:>6} {took:>6.0f} s {shown[0]:>8} {error(new):>7} "
              f"{shown[1]:>10} {error(old):>7}")  # fmt: skip
    print(f"then {seen[-1][0] - end:.0f} s from the target step to the run's end "
          f"(final evaluation, export, exit)")  # fmt: skip


if __name__ == "__main__":
    main()
