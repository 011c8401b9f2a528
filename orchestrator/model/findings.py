"""What a preflight check found: one finding per host and check, and the report of them all."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

DEFAULT_PROBE_TIMEOUT = 3.0  # seconds each port probe between two hosts may take
DEFAULT_MIN_FREE_BYTES = 1 << 30  # free space wanted under the workdir and checkpoints


@dataclass(frozen=True)
class PreflightOptions:
    """How a preflight check runs. `exposure`: also try the workers' ports from this machine
    (`check` and `up` do; the supervisor's check between attempts does not)."""

    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    exposure: bool = False
    # The performance round (`check --perf`, `preflight: {perf: true}`): each host's compute
    # and each ring link's throughput, with a warning for the slow ones.
    perf: bool = False


CHECK = PreflightOptions()  # the defaults


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    host: str
    check: str
    status: Status
    detail: str
    hint: str | None = None
    # Measured figures (the performance round's GFLOP/s, bytes per second, ratios), for --json
    # and the dashboard; None for the checks that measure nothing.
    figures: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        document = {**self.__dict__, "status": self.status.value}
        if self.figures is None:
            del document["figures"]
        else:
            document["figures"] = dict(self.figures)
        return document


@dataclass(frozen=True)
class PreflightReport:
    findings: tuple[Finding, ...]

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.status is Status.FAIL]
