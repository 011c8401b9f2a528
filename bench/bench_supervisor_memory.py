"""Benchmark for issue 10: the supervisor's memory over 10,000 polls through a real SSH session.

One namespace host (tests/cluster: its own sshd, reached over SSH as in production) runs a
two-worker script job that sleeps; this process supervises it with the real Supervisor and
HostBackend, polling back to back (--interval, default 0: as fast as the session answers), and
samples its own resident memory (psutil) every 1,000 polls. Flat means the figure at 10,000 polls
is within a few hundred KiB of the one at 1,000 (allocator noise), not growing with every poll.

    sudo .venv/bin/python -m bench.bench_supervisor_memory [--polls 10000] [--interval 0]

Needs root (network namespaces). Prints a table; records nothing by itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from orchestrator.backends.hosts.backend import HostBackend
from orchestrator.backends.registry import load_inventory
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run, stop_run
from tests.cluster.inventories import write_inventory
from tests.cluster.netns import NamespaceCluster, cleanup_leftovers

SCRIPT = "import time\nwhile True:\n    time.sleep(1)\n"


class Enough(Exception):
    """Raised from the live view once the wanted number of polls is done."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=0.0)
    args = parser.parse_args()
    cleanup_leftovers("orchbm")
    with tempfile.TemporaryDirectory(prefix="bench-supmem-") as scratch:
        root = Path(scratch)
        with NamespaceCluster(1, "orchbm", base_dir=root / "cluster") as cluster:
            (root / "sleep.py").write_text(SCRIPT)
            job = {"name": "sleepy", "script": "sleep.py", "stall_timeout": 3600}
            host: dict[str, Any] = {"name": "h1", "address": cluster.hosts[0].address,
                                   "workdir": str(cluster.hosts[0].workdir)}  # fmt: skip
            hosts = [host, {**host, "name": "h2", "port": 20001}]
            path = write_inventory(root / "inv.yaml", cluster, job, hosts=hosts)
            store = RunStore(root / "state")
            rows: list[tuple[int, float, float]] = []
            process = psutil.Process()
            with HostBackend() as backend:
                record = start_run(load_inventory(path), store, backend)
                started = time.perf_counter()
                count = 0

                def show(_status: object) -> None:
                    nonlocal count
                    count += 1
                    if count % 1000 == 0:
                        rss = process.memory_info().rss / 2**20
                        rows.append((count, time.perf_counter() - started, rss))
                    if count >= args.polls:
                        raise Enough

                try:
                    Supervisor(store, backend, record, show=show, interval=args.interval).run()
                except Enough:
                    pass
                finally:
                    stop_run(store.load(record.run_id), backend, grace=2)
    print(f"{'polls':>7} {'seconds':>8} {'ms/poll':>8} {'RSS MiB':>8}")
    previous = 0.0
    for index, (polls, seconds, rss) in enumerate(rows):
        per_poll = (seconds - previous) / 1000 * 1000 if index else seconds / polls * 1000
        print(f"{polls:>7} {seconds:>8.1f} {per_poll:>8.2f} {rss:>8.1f}")
        previous = seconds
    print(json.dumps({"growth_mib_1k_to_end": round(rows[-1][2] - rows[0][2], 2)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
