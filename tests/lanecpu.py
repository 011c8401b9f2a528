"""Each test's CPU, for the phase log (tests/phase_log.py): the suite's lanes share two cores,
so the CPU a test spends, not its wall time, is what it costs the others.

As root, on cgroup v1's cpuacct (the development machines), each pytest process moves itself
into a cpuacct cgroup of its own when it starts. Everything a test starts is counted there,
however it detaches (a daemon keeps its parent's cgroup): its workers, its `orchestrate`
commands, their supervisors, minders and host programs. A test's CPU is its lane's count at its
end minus at its start. Docker's containers run in Docker's own cgroups and are not counted, and
a cluster a lane keeps between tests (the namespace hosts, Slurm) counts in whichever of the
lane's tests is running. Only while scripts/test.sh keeps a phase log; elsewhere nothing moves
and `used()` is None."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
PREFIX = "orchestrate-lane-"


def _own_cpuacct() -> Path | None:
    """This process's cpuacct cgroup, as a directory, or None (cgroup v2, no cpuacct)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                directory = CPUACCT / path.lstrip("/")
                return directory if directory.is_dir() else None
    return None


class LaneCpu:
    """The CPU of this pytest process and of everything it started since `join`."""

    def __init__(self) -> None:
        self.cgroup: Path | None = None

    def join(self, lane_process: str) -> None:
        if os.geteuid() != 0:
            return
        parent = _own_cpuacct()
        if parent is None:
            return
        group = parent / f"{PREFIX}{lane_process}-{os.getpid()}"
        try:
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
            return
        self.cgroup = group

    def used(self) -> float | None:
        """CPU seconds so far, or None where nothing is counted."""
        if self.cgroup is None:
            return None
        try:
            return int((self.cgroup / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def leave(self) -> None:
        """Back to the cgroup it came from; the group goes once nothing it started still runs
        (scripts/test.sh removes what is left at its end)."""
        if self.cgroup is None:
            return
        with contextlib.suppress(OSError):
            (self.cgroup.parent / "cgroup.procs").write_text(str(os.getpid()))
            self.cgroup.rmdir()
        self.cgroup = None
