"""How true the ETA is (issue 56): the bundled example on two local workers (evaluation and a
checkpoint every EVERY steps), `status --json` polled every POLL seconds; at a quarter, half and
three quarters of the run, the ETA it showed against the time the run then really took, for
the wall-clock ETA (engine/eta.py) and for the one it replaced (steps left over the latest
steps/s, recomputed from the same snapshot's fields). The ETA is the time to the target step:
"took" ends at the first snapshot that shows every worker there; what follows (the final
evaluation, the export, the exit) is printed apart.

    .venv/bin/python -m bench.bench_eta --steps 600
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

POLL = 1.0
EVERY = 100


def inventory(directory: Path, steps: int) -> Path:
    path = directory / "inv.yaml"
    path.write_text(f"""\
defaults: {{connection: local, workdir: '{directory / "work"}'}}
hosts:
  - {{name: chief, address: localhost, port: {23500 + os.getpid() % 400}}}
  - {{name: other, address: localhost, port: {23900 + os.getpid() % 400}}}
job:
  name: shapes
  task: worker.examples.shapes:task
  steps: {steps}
  eval_every: {EVERY}
  checkpoint_every: {EVERY}
  warm_restarts: false
  linger: 0
  env: {{TF_CPP_MIN_LOG_LEVEL: "2"}}
""")
    return path


def cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=directory,
                          capture_output=True, text=True, check=False, timeout=120)  # fmt: skip


def poll(directory: Path) -> list[tuple[float, int, float | None, float | None]]:
    """(time, step, the ETA shown, the old ETA) per snapshot until the run ends."""
    seen: list[tuple[float, int, float | None, float | None]] = []
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        inventory(directory, options.steps)
        cli(directory, "up", "--detach", "--skip-checks", "inv.yaml")
        seen = poll(directory)
        cli(directory, "down")
    target = options.steps
    end = next((at for at, step, _, _ in seen if step >= target or step < 0), seen[-1][0])
    print(f"{'at':>6} {'step':>6} {'took':>8} {'ETA now':>8} {'error':>7} {'ETA before':>10} "
          f"{'error':>7}")  # fmt: skip
    for share in (0.25, 0.5, 0.75):
        at, step, new, old = min(seen[:-1], key=lambda s: abs(s[1] - share * options.steps))
        took = end - at

        def error(eta: float | None, took: float = took) -> str:
            return "-" if eta is None else f"{(eta - took) / took:+.0%}"

        shown = [f"{eta:.0f} s" if eta is not None else "-" for eta in (new, old)]
        print(f"{share:>6.0%} {step:>6} {took:>6.0f} s {shown[0]:>8} {error(new):>7} "
              f"{shown[1]:>10} {error(old):>7}")  # fmt: skip
    print(f"then {seen[-1][0] - end:.0f} s from the target step to the run's end "
          f"(final evaluation, export, exit); load average at the end: "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
