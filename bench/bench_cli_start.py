"""How fast the CLI starts (issue 56): `orchestrate --version` and a `check` that refuses its
inventory, for this tree and, side by side in the same run, a baseline tree (another checkout,
given as --baseline DIR), alternating run by run so that the machine's drift hits both.

    .venv/bin/python -m bench.bench_cli_start --baseline /tmp/old-checkout --runs 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {"--version": ["--version"], "check of a bad inventory": ["check", "bad.yaml"]}


def once(tree: Path, args: list[str], cwd: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's orchestrator first on sys.path
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env,
                   capture_output=True, check=False)  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=15)
    options = parser.parse_args()
    trees = {"this tree": REPO, "baseline": options.baseline.resolve()}
    with tempfile.TemporaryDirectory() as work:
        cwd = Path(work)
        (cwd / "bad.yaml").write_text("hosts: [\n")
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(options.runs + 1):  # the first round warms the page cache, not counted
            for command, args in COMMANDS.items():
                for name, tree in trees.items():
                    times.setdefault((command, name), []).append(once(tree, args, cwd))
    print(f"{'command':28} {'this tree':>10} {'baseline':>10} {'ratio':>7}  (median s)")
    for command in COMMANDS:
        new, old = (statistics.median(times[(command, n)][1:]) for n in trees)
        print(f"{command:28} {new:10.3f} {old:10.3f} {new / old:7.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
