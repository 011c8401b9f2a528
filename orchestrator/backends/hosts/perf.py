"""The performance round of `check --perf`: the slow host or link, found before it slows every step.

A synchronous job runs at the pace of its slowest worker and of its slowest ring link, and
nothing in TensorFlow names either. After the check's connect round, over the same hostprobe
sessions:
  1. compute: every host runs a fixed matmul (about 1 s; NumPy, or TensorFlow on the GPU when the
     job uses GPUs) and reports its best GFLOP/s;
  2. throughput: every host opens a sink on an ephemeral port, and each link the ring
     all-reduce uses (host i to host i+1) carries at most LINK_SECONDS or LINK_BYTES.
Probes of hosts on one machine (the same boot_id) run one after another, never at once, so that
they do not slow each other into false warnings; everything else runs in parallel.

The decision (who is slow) is `slow_ones`, pure: a host below COMPUTE_RATIO of the median of the
others' compute (same device), a link below LINK_RATIO of the others' median throughput
(SAME_MACHINE_LINK_RATIO between two hosts of one machine).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from orchestrator.fanout import fan_out
from orchestrator.hostside import protocol
from orchestrator.machines.hostclient import request
from orchestrator.machines.kinds import kind_of
from orchestrator.machines.runner import LineSession
from orchestrator.model.answers import ComputeProbe, Inspection, Transfer, parsed
from orchestrator.model.findings import Finding, Status
from orchestrator.model.inventory import Inventory, WorkerSlot

COMPUTE_RATIO = 0.7  # a host below this much of the others' median compute is named
LINK_RATIO = 0.5  # a link below this much of the other links' median throughput is named
# ... or this much, when both its ends are hosts of one machine (namespaces, containers): such a
# link crosses no network card, it moves through memory as fast as its two ends get a CPU, and
# the machine's other load moves it by more than 2x (a healthy veth read 0.39x in CI), while a
# shaped or broken one reads 0.01x or less.
SAME_MACHINE_LINK_RATIO = 0.2
COMPUTE_WINDOWS = 12  # the compute probe: a host's best of this many windows ...
COMPUTE_WINDOW_SECONDS = 0.1  # ... each one CFS quota period (100 ms) at least
CPU_MATRIX = 1024  # float32 matmul sizes: large enough to keep BLAS or a GPU busy
GPU_MATRIX = 8192
COMPUTE_TIMEOUT = 90.0  # seconds, TensorFlow's import on a GPU host included
LINK_BURSTS = 8  # each link carries this many bursts (its best counts) ...
LINK_SECONDS = 0.15  # ... of at most this long ...
LINK_BYTES = 32 << 20  # ... or this many bytes
LINK_TIMEOUT = 5.0  # seconds to connect to a sink, and for each read and write
# A link below its ratio after its bursts is measured again, with every other link, up to this
# many times more: it is named only if it stays below. On a busy machine one link's bursts can
# all land while its sender waits for a CPU (a healthy link read 0.49x once); a shaped or
# broken link stays slow however often it is measured.
LINK_RECHECKS = 2

K = TypeVar("K", bound=Hashable)


# ---------------------------------------------------------------------------------------------
# Pure decisions


def slow_ones(values: Mapping[K, float], ratio: float) -> dict[K, float]:
    """Each value's ratio to the median of the others, for those below `ratio`. Fewer than two
    values: nothing to compare, nobody is slow."""
    if len(values) < 2:
        return {}
    found = {}
    for key, value in values.items():
        others = statistics.median(v for k, v in values.items() if k != key)
        if others > 0 and value / others < ratio:
            found[key] = value / others
    return found


def slow_links(
    rates: Mapping[tuple[str, str], float], machine_of: Mapping[str, str]
) -> dict[tuple[str, str], float]:
    """The links below their ratio of the others' median: LINK_RATIO across machines,
    SAME_MACHINE_LINK_RATIO between two hosts of one machine (a host not in `machine_of` is a
    machine of its own)."""

    def ratio(link: tuple[str, str]) -> float:
        ends = {machine_of.get(host, host) for host in link}
        return SAME_MACHINE_LINK_RATIO if len(ends) == 1 else LINK_RATIO

    return {k: r for k, r in slow_ones(rates, LINK_RATIO).items() if r < ratio(k)}


def relative(values: Mapping[K, float]) -> dict[K, float]:
    """Each value's ratio to the median of the others (1.0 alone)."""
    out = {}
    for key, value in values.items():
        others = [v for k, v in values.items() if k != key]
        median = statistics.median(others) if others else value
        out[key] = value / median if median > 0 else 1.0
    return out


def ring_links(hosts: Sequence[str]) -> list[tuple[str, str]]:
    """The links the ring all-reduce uses: each host to the next, the last to the first."""
    if len(hosts) < 2:
        return []
    if len(hosts) == 2:
        return [(hosts[0], hosts[1]), (hosts[1], hosts[0])]
    return [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))]


def schedule(
    items: Sequence[K], hosts_of: Callable[[K], Sequence[str]], machine_of: Mapping[str, str]
) -> list[list[K]]:
    """Rounds of items to run at once: two items share no round when they involve two different
    hosts of one machine (they would compete for its CPUs, GPUs or network card). One host in
    two items is fine (a host sends on one link while it receives on another)."""
    rounds: list[list[K]] = []
    taken: list[dict[str, set[str]]] = []  # per round: machine -> the hosts of it involved
    for item in items:
        mine: dict[str, set[str]] = {}
        for host in hosts_of(item):
            mine.setdefault(machine_of[host], set()).add(host)
        for index, used in enumerate(taken):
            if all(m not in used or len(used[m] | h) == 1 for m, h in mine.items()):
                rounds[index].append(item)
                for m, h in mine.items():
                    used.setdefault(m, set()).update(h)
                break
        else:
            rounds.append([item])
            taken.append({m: set(h) for m, h in mine.items()})
    return rounds


def compute_findings(probes: Mapping[str, ComputeProbe]) -> list[Finding]:
    """One `compute` finding per host: its figure and ratio, a warning for the slow ones (among
    hosts of the same device), "not measured" for a host without NumPy or TensorFlow."""
    findings = []
    by_device: dict[str, dict[str, float]] = {}
    for name, probe in probes.items():
        if probe.gflops is not None:
            by_device.setdefault(probe.device, {})[name] = probe.gflops
    ratios = {n: r for group in by_device.values() for n, r in relative(group).items()}
    slow = {
        n: r for group in by_device.values() for n, r in slow_ones(group, COMPUTE_RATIO).items()
    }
    for name, probe in probes.items():
        if probe.gflops is None:
            detail = f"not measured: {probe.detail or 'no NumPy or TensorFlow'}"
            findings.append(
                Finding(
                    name,
                    "compute",
                    Status.OK,
                    detail,
                    figures={"gflops": None, "device": probe.device},
                )
            )
            continue
        figures = {
            "gflops": round(probe.gflops, 1),
            "ratio": round(ratios[name], 2),
            "probe": probe.probe,
            "device": probe.device,
            "cpu_limit": probe.cpu_limit,
        }
        peers = len(by_device[probe.device]) - 1
        what = f"{probe.probe} matmul {probe.gflops:.0f} GFLOP/s ({probe.device})"
        if name in slow:
            findings.append(
                Finding(
                    name,
                    "compute",
                    Status.WARN,
                    f"matmul {probe.gflops:.0f} GFLOP/s, {slow[name]:.2f}x the others",
                    hint="a synchronous job runs at its slowest worker's pace: look for other "
                    "load, a CPU quota, a throttled clock or a slower device on this host",
                    figures=figures,
                )
            )
        elif peers:
            findings.append(
                Finding(
                    name,
                    "compute",
                    Status.OK,
                    f"{what}, {ratios[name]:.2f}x the others",
                    figures=figures,
                )
            )
        else:
            findings.append(Finding(name, "compute", Status.OK, what, figures=figures))
    return findings


def rate_text(rate: float) -> str:
    """Bytes per second as people read a link: 2.4 MB/s, 940 MB/s, 5.2 GB/s."""
    if rate >= 1e9:
        return f"{rate / 1e9:.1f} GB/s"
    return f"{rate / 1e6:.3g} MB/s" if rate < 1e8 else f"{rate / 1e6:.0f} MB/s"


def link_findings(
    transfers: Mapping[tuple[str, str], Transfer], machine_of: Mapping[str, str]
) -> list[Finding]:
    """One `throughput` finding per ring link, on its sending host."""
    rates = {link: t.rate for link, t in transfers.items() if t.ok and t.rate}
    ratios = relative(rates)
    slow = slow_links(rates, machine_of)
    findings = []
    for (source, target), transfer in transfers.items():
        link = (source, target)
        if link not in rates:
            findings.append(
                Finding(
                    source,
                    "throughput",
                    Status.WARN,
                    f"to {target}: not measured ({transfer.detail or 'no figures'})",
                    hint="the probe uses an ephemeral TCP port on the receiving host: a firewall "
                    "that opens only the TensorFlow port stops it",
                    figures={"to": target, "bytes_per_second": None},
                )
            )
            continue
        rate = rates[link]
        figures = {
            "to": target,
            "bytes_per_second": round(rate),
            "ratio": round(ratios[link], 2),
            "bytes": transfer.sent,
            "seconds": transfer.seconds,
        }
        if link in slow:
            findings.append(
                Finding(
                    source,
                    "throughput",
                    Status.WARN,
                    f"to {target}: {rate_text(rate)}, {slow[link]:.2f}x the other links",
                    hint="the ring all-reduce moves at its slowest link's pace: look at this "
                    "link's speed, shaping (tc qdisc) or a busy interface",
                    figures=figures,
                )
            )
        else:
            ratio = f", {ratios[link]:.2f}x the other links" if len(rates) > 1 else ""
            findings.append(
                Finding(
                    source,
                    "throughput",
                    Status.OK,
                    f"to {target}: {rate_text(rate)}{ratio}",
                    figures=figures,
                )
            )
    return findings


# ---------------------------------------------------------------------------------------------
# The rounds


@dataclass(frozen=True)
class PerfPlan:
    """Which hosts are measured, on which machine each is, and whether the job uses GPUs."""

    hosts: dict[str, WorkerSlot]
    machine_of: dict[str, str]
    gpu: bool


def plan(inventory: Inventory, reports: Mapping[str, Inspection]) -> PerfPlan:
    hosts = {h.name: h for h in inventory.hosts if h.name in reports}
    machine_of = {
        name: reports[name].boot_id or f"key:{kind_of(host).machine_key(host)!r}"
        for name, host in hosts.items()
    }
    return PerfPlan(hosts, machine_of, bool(inventory.gpus_per_worker))


def measure_compute(perf: PerfPlan, sessions: Mapping[str, LineSession]) -> dict[str, ComputeProbe]:
    """Start every host's compute child (at once: the imports are not measured), then measure
    COMPUTE_WINDOWS windows round-robin, one machine's hosts in turn; each host's best window."""
    names = list(perf.hosts)
    settings = {"gpu": perf.gpu, "cpu_size": CPU_MATRIX, "gpu_size": GPU_MATRIX}

    def ask(name: str, **spec: object) -> ComputeProbe:
        answer = request(sessions[name], protocol.COMPUTE, COMPUTE_TIMEOUT + 30, **spec)
        return parsed(name, ComputeProbe.parse, answer)

    started = fan_out(names, lambda n: ask(n, start=settings, timeout=COMPUTE_TIMEOUT))
    probes = dict(started.ok)
    probes.update(
        {n: ComputeProbe(None, "cpu", None, e.message) for n, e in started.failed.items()}
    )
    ready = [n for n in names if probes[n].probe is not None]
    best: dict[str, float] = {}
    for _ in range(COMPUTE_WINDOWS):
        for at_once in schedule(ready, lambda n: [n], perf.machine_of):
            windows = fan_out(at_once, lambda n: ask(n, window=COMPUTE_WINDOW_SECONDS, timeout=30))
            for name, window in windows.ok.items():
                if window.gflops is not None:
                    best[name] = max(best.get(name, 0.0), window.gflops)
    fan_out(ready, lambda n: request(sessions[n], protocol.COMPUTE, 30, stop=True))
    for name in ready:
        probe = probes[name]
        gflops = best.get(name)
        detail = None if gflops else "the compute probe gave no figure"
        probes[name] = ComputeProbe(probe.probe, probe.device, gflops, detail, probe.cpu_limit)
    return probes


def _better(new: Transfer, old: Transfer | None) -> bool:
    if old is None or not old.ok:
        return True
    return new.ok and (new.rate or 0) > (old.rate or 0)


def run_perf_round(
    inventory: Inventory, sessions: Mapping[str, LineSession], reports: Mapping[str, Inspection]
) -> list[Finding]:
    """The compute probes, then the link probes, over the check's open sessions."""
    perf = plan(inventory, reports)
    names = list(perf.hosts)

    probes = measure_compute(perf, sessions)
    findings = compute_findings({n: probes[n] for n in names})
    links = ring_links(names)
    if not links:
        return findings
    sinks = fan_out(names, lambda n: request(sessions[n], protocol.SINK, 30, timeout=LINK_TIMEOUT))
    transfers: dict[tuple[str, str], Transfer] = {}

    def send(link: tuple[str, str]) -> Transfer:
        source, target = link
        answer = request(
            sessions[source],
            protocol.SEND,
            LINK_TIMEOUT * 3 + LINK_SECONDS + 30,
            address=perf.hosts[target].address,
            port=sinks.ok[target].get(protocol.PORT_KEY),
            seconds=LINK_SECONDS,
            max_bytes=LINK_BYTES,
            timeout=LINK_TIMEOUT,
        )
        return parsed(source, Transfer.parse, answer)

    for link in links:
        if link[1] in sinks.failed:
            transfers[link] = Transfer(False, None, 0, None, sinks.failed[link[1]].message)
    ready = [link for link in links if link[1] in sinks.ok]
    transfers.update(measure_links(ready, send, perf.machine_of))
    return findings + link_findings({link: transfers[link] for link in links}, perf.machine_of)


def measure_links(
    links: Sequence[tuple[str, str]],
    send: Callable[[tuple[str, str]], Transfer],
    machine_of: Mapping[str, str],
) -> dict[tuple[str, str], Transfer]:
    """Each link's best of LINK_BURSTS bursts, round-robin like the compute windows; while a
    link reads below its ratio of the others (`slow_links`), every link gets LINK_BURSTS more
    (at most LINK_RECHECKS times), so a link is named for staying slow, not for one unlucky
    pass."""
    best: dict[tuple[str, str], Transfer] = {}
    for _ in range(1 + LINK_RECHECKS):
        for _ in range(LINK_BURSTS):
            for at_once in schedule(links, list, machine_of):
                sent = fan_out(at_once, send)
                for link, transfer in sent.ok.items():
                    if _better(transfer, best.get(link)):
                        best[link] = transfer
                for link, error in sent.failed.items():
                    best.setdefault(link, Transfer(False, None, 0, None, error.message))
        rates = {link: t.rate for link, t in best.items() if t.ok and t.rate}
        if not slow_links(rates, machine_of):
            break
    return best
