"""Benchmark for issue 31: the CPU the control plane spends on a steady run.

A local two-worker script job (tests/scripts/stepper.py, a step every 50 ms, no TensorFlow, no
standbys) is started with `orchestrate up --detach`; once both workers report steps, the CPU time
(user + system, psutil) over --seconds (default 20) is read for three groups of processes:

  supervisor  the detached `orchestrate supervise` and its agent sessions (its children)
  host side   the host supervisors (`agent.py supervise RUN_DIR`) that run the workers
  workers     the two stepper processes (for scale)

then `orchestrate down`. --tree runs another checkout's orchestrator (PYTHONPATH first), so a
before/after pair runs the same job and the same measurement; --repeats alternates the trees.

    .venv/bin/python -m bench.bench_supervisor_cpu [--seconds 20] [--repeats 3] [--tree DIR ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

from tests.conftest import free_ports
from tests.scripts import STEPPER

HERE = Path(__file__).resolve().parents[1]


def _cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _groups(supervisor: int, run_id: str) -> dict[str, list[psutil.Process]]:
    root = psutil.Process(supervisor)
    groups: dict[str, list[psutil.Process]] = {"supervisor": [root, *root.children(True)],
                                               "host side": [], "workers": []}  # fmt: skip
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if run_id not in line or process in groups["supervisor"]:
            continue
        if " supervise " in line and "orchestrator" not in line:
            groups["host side"].append(process)
            groups["workers"].extend(process.children(True))
    return groups


def one(tree: Path, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-cpu-", ignore_cleanup_errors=True) as scratch:
        root = Path(scratch)
        shutil.copyfile(STEPPER, root / "train.py")
        ports = free_ports(2)
        job = {"name": "cpu", "script": "train.py", "warm_restarts": False,
               "stall_timeout": 3600, "env": {"STEPS": 1000000, "DELAY": 0.05}}  # fmt: skip
        (root / "inv.yaml").write_text(textwrap.dedent(f"""\
            defaults: {{connection: local, workdir: ./work}}
            hosts:
              - {{name: a, address: localhost, port: {ports[0]}}}
              - {{name: b, address: localhost, port: {ports[1]}}}
            job: {json.dumps(job)}
            """))  # fmt: skip
        env = {**os.environ, "PYTHONPATH": f"{tree}:{HERE}", "ORCHESTRATE_LINGER": "0"}
        cli = [sys.executable, "-m", "orchestrator", "--state-dir", str(root / "state")]
        up = subprocess.run([*cli, "up", "--detach", "--skip-checks", "inv.yaml"], cwd=root,
                            env=env, capture_output=True, text=True, check=False)  # fmt: skip
        if up.returncode != 0:
            raise SystemExit(f"up failed in {tree}: {up.stdout}{up.stderr}")
        supervisor = int((up.stdout + up.stderr).split("a supervisor (pid ", 1)[1].split(")", 1)[0])
        try:
            deadline = time.monotonic() + 60
            while True:
                shown = subprocess.run([*cli, "status", "--json"], cwd=root, env=env,
                                       capture_output=True, text=True, check=False)  # fmt: skip
                status = json.loads(shown.stdout)
                if all((w.get("step") or 0) > 5 for w in status["workers"]):
                    break
                assert time.monotonic() < deadline, status
                time.sleep(0.5)
            time.sleep(2)  # past the first polls
            groups = _groups(supervisor, status["run_id"])
            before = {name: _cpu(procs) for name, procs in groups.items()}
            time.sleep(seconds)
            after = {name: _cpu(procs) for name, procs in groups.items()}
            return {name: after[name] - before[name] for name in groups}
        finally:
            subprocess.run([*cli, "down"], cwd=root, env=env, capture_output=True,
                           check=False)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree", action="append", type=Path, help="a checkout (default: this)")
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [HERE])]
    results: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for repeat in range(args.repeats):
        for tree in trees if repeat % 2 == 0 else trees[::-1]:
            load = os.getloadavg()[0]
            figures = one(tree, args.seconds)
            results[tree].append(figures)
            shown = "  ".join(f"{k} {v:.3f} s" for k, v in figures.items())
            print(f"repeat {repeat + 1} {tree} (load {load:.2f}): {shown}", flush=True)
    print(f"CPU seconds over {args.seconds:g} s, medians of {args.repeats}:")
    for tree, rows in results.items():
        medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"  {tree}: " + "  ".join(f"{k} {v:.3f}" for k, v in medians.items()))


if __name__ == "__main__":
    main()
