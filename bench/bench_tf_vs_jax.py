"""TensorFlow against Keras 3 on JAX, same model, same two local workers (issue 57): the bundled
example's CNN and data, trained by the built-in MultiWorkerMirroredStrategy loop
(`task: worker.examples.shapes:task`) and by Keras 3 `model.fit` on the JAX backend across the
two processes (`job.keras: jax`, bench/shapes_keras3_jax.py), global batch 64 in both. Per run:
the time from `up` to both workers' first step, the steady steps/s (the median of what status
shows over the run's second half) and the most memory a worker held (RSS). No evaluation,
checkpoint every 320 steps, no standbys. The JAX workers run from .venv-jax (a host with
`pip install '.[jax]'` only, as scripts/test.sh makes it): the dev venv has no JAX.

    .venv/bin/python -m bench.bench_tf_vs_jax --steps 640 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
JAX_PYTHON = REPO / ".venv-jax" / "bin" / "python"
POLL = 0.5


def job(kind: str, steps: int) -> dict[str, Any]:
    common = {"name": f"bench-{kind}", "steps": steps, "checkpoint_every": 320,
              "warm_restarts": False, "linger": 0,
              "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}}  # fmt: skip
    if kind == "tf":
        return {**common, "task": "worker.examples.shapes:task", "batch_size": 64}
    return {**common, "script": str(REPO / "bench" / "shapes_keras3_jax.py"), "keras": "jax"}


def inventory(directory: Path, kind: str, steps: int) -> None:
    python = str(JAX_PYTHON) if kind == "jax" else sys.executable
    base = 24000 + os.getpid() % 1000
    hosts = [{"name": f"w{i}", "address": "localhost", "port": base + i} for i in range(2)]
    defaults = {"connection": "local", "workdir": str(directory / "work"), "python": python}
    spec = {"defaults": defaults, "hosts": hosts, "job": job(kind, steps)}
    (directory / "inv.yaml").write_text(yaml.safe_dump(spec))


def cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=directory,
                          capture_output=True, text=True, check=False, timeout=300)  # fmt: skip


def measure(kind: str, steps: int) -> dict[str, float]:
    """One run: seconds to both first steps, steady steps/s, peak RSS (MiB) of a worker."""
    with tempfile.TemporaryDirectory() as work:
        directory = Path(work)
        inventory(directory, kind, steps)
        started = time.monotonic()
        up = cli(directory, "up", "--detach", "--skip-checks", "inv.yaml")
        if up.returncode != 0:
            raise SystemExit(f"{kind}: up failed: {up.stderr[-2000:]}")
        first, rates, rss = None, [], 0.0
        while True:
            status = json.loads(cli(directory, "status", "--json").stdout)
            workers = status["workers"]
            if first is None and all((w["step"] or 0) >= 1 for w in workers):
                first = time.monotonic() - started
            least = min(w["step"] or 0 for w in workers)
            if least >= steps // 2:
                rates += [w["steps_per_sec"] for w in workers if w["steps_per_sec"]]
            rss = max(rss, *((w["rss_bytes"] or 0) / 2**20 for w in workers))
            if status["state"] in ("succeeded", "failed", "stopped"):
                break
            time.sleep(POLL)
        cli(directory, "down")
        if status["state"] != "succeeded":
            raise SystemExit(f"{kind}: the run {status['state']}: {status.get('outcome')}")
    return {"first": first or 0.0, "rate": statistics.median(rates) if rates else 0.0,
            "rss": rss}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=640)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    if not JAX_PYTHON.exists():
        raise SystemExit(
            f"no jax-only install at {JAX_PYTHON.parent.parent}: python3 -m venv .venv-jax && "
            ".venv-jax/bin/pip install '.[jax]' (the dev venv has no JAX)"
        )
    results: dict[str, list[dict[str, float]]] = {"tf": [], "jax": []}
    for _ in range(options.runs):  # A/B pair by pair: a load change hits both alike
        for kind, runs in results.items():
            runs.append(measure(kind, options.steps))
    print(f"{'':28} {'TensorFlow MWMS':>16} {'Keras 3 / JAX':>14}")
    for key, label in (("first", "to both first steps (s)"), ("rate", "steady steps/s"),
                       ("rss", "peak RSS of a worker (MiB)")):  # fmt: skip
        tf, jx = (statistics.median(r[key] for r in results[k]) for k in ("tf", "jax"))
        print(f"{label:28} {tf:16.1f} {jx:14.1f}")
    print(f"medians of {options.runs} runs each, {options.steps} steps; "
          f"load average at the end: {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
