"""Code sync (issue 15): `sync:` (rsync over OpenSSH) beside a plain SFTP upload of the same tree.

One namespace host with its own sshd (tests/cluster/netns.py, prefix `benchs`, always removed)
and a tree of 1,000 files (about 4 MiB) on this machine. Per repeat, in this order:

    rsync first      `sync:`'s code path (codesync.sync_hosts) into an empty directory
    rsync unchanged  the same again, nothing changed
    rsync 1 changed  one file rewritten (same size, new content), then the same again
    SFTP upload      what `job.files` does at every start: HostBackend.upload over one Fabric
                     connection (mkdir -p, then one SFTP put per file), into an empty directory

Bytes are what crossed the host's veth in both directions (its kernel counters: protocol,
encryption and SSH handshakes included); time is wall clock, connection set-up included.
Run as root from the repository root:

    .venv/bin/python -m bench.bench_sync [--repeats 3]

Only the cluster's own 10.231.0.x address is contacted; the cluster is always removed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.backends.hosts.backend import HostBackend, expand_uploads
from orchestrator.backends.hosts.sync import sync_hosts
from orchestrator.machines.sshsettings import SshSettings
from orchestrator.model.inventory import SyncSpec, WorkerSlot
from tests.cluster.netns import NamespaceCluster, cleanup_leftovers, unavailable_reason

FILES = 1000
PREFIX = "benchs"


def make_tree(root: Path) -> Path:
    source = root / "project"
    for index in range(FILES):
        path = source / f"pkg{index % 25}" / f"module_{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        # 1-8 KiB of source-like text, different per file (no two files compress alike)
        path.write_text("".join(f"VALUE_{index}_{line} = {line * index}\n"
                                for line in range(40 + (index % 8) * 25)))  # fmt: skip
    return source


def wire_bytes(veth: str) -> int:
    stats = Path("/sys/class/net") / veth / "statistics"
    return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())


def measure(veth: str, action: Callable[[], object]) -> tuple[float, int]:
    before, started = wire_bytes(veth), time.perf_counter()
    action()
    return time.perf_counter() - started, wire_bytes(veth) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        sys.exit(f"bench_sync: {reason}")
    cleanup_leftovers(PREFIX)
    scratch = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    samples: dict[str, list[tuple[float, int]]] = {}
    try:
        source = make_tree(scratch)
        size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
        with NamespaceCluster(1, PREFIX, base_dir=scratch / "cluster") as cluster:
            target = cluster.hosts[0]
            host = WorkerSlot(
                name="host1", address=target.address, port=20000, workdir=str(target.workdir),
                settings=SshSettings(ssh_user="root", ssh_key=str(cluster.client_key_path),
                                     ssh_known_hosts=str(cluster.known_hosts_path)),
            )  # fmt: skip
            spec = SyncSpec(str(source))
            changed = source / "pkg7" / "module_7.py"
            for repeat in range(options.repeats):
                job = target.workdir / f"rsync{repeat}"

                def rsync(job: Path = job) -> None:
                    report = sync_hosts(spec, [host], {"host1": str(job)})
                    report.result.raise_if_failed("sync")

                samples.setdefault("rsync first", []).append(measure(target.veth, rsync))
                samples.setdefault("rsync unchanged", []).append(measure(target.veth, rsync))
                text = changed.read_text()
                changed.write_text(text.replace("VALUE", "VALUX", 1))  # same size, new bytes
                samples.setdefault("rsync 1 changed", []).append(measure(target.veth, rsync))
                remote = target.workdir / f"sftp{repeat}"

                def sftp(remote: Path = remote) -> None:
                    with HostBackend() as backend:
                        backend.upload(host, expand_uploads([(str(source), str(remote))]))

                samples.setdefault("SFTP upload", []).append(measure(target.veth, sftp))
                shutil.rmtree(job, ignore_errors=True)
                shutil.rmtree(remote, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"bench_sync {stamp}  {platform.node()}  {os.cpu_count()} CPUs  load "
          f"{os.getloadavg()[0]:.1f}  tree: {FILES} files, {size / 2**20:.2f} MiB  "
          f"medians of {options.repeats}")  # fmt: skip
    print(f"{'method':<17} {'time s':>8} {'wire KiB':>10}")
    for name, values in samples.items():
        seconds = statistics.median(v[0] for v in values)
        kib = statistics.median(v[1] for v in values) / 1024
        print(f"{name:<17} {seconds:>8.2f} {kib:>10.1f}")


if __name__ == "__main__":
    main()
