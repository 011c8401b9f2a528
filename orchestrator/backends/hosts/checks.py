"""`orchestrate check`: every reason a cluster would hang, found before anything starts.

Three rounds, each in parallel over every host, each one round trip to one hostprobe.py process
per host that serves the whole check:
  1. inspect: versions, proxies, free space; bind the TensorFlow port and keep it as a listener
  2. connect: every host connects to every other host's port (N² probes, short timeout); the
     controller, when it is no cluster member, tries each port too (the exposure check)
  3. with --perf, the performance round (perf.py): compute on every host, throughput on each
     ring link
  4. cleanup: stop the listeners, remove the shared-directory token
The findings are computed from the answers by pure functions below.
"""

from __future__ import annotations

import ipaddress
import posixpath
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.backends.hosts.perf import run_perf_round
from orchestrator.backends.software import PACKAGES, Software, Where
from orchestrator.backends.software import gloo_finding as shared_gloo_finding
from orchestrator.backends.software import software_findings as shared_software_findings
from orchestrator.contract import KERAS_JAX
from orchestrator.errors import ConnectError, HostError
from orchestrator.fanout import GroupResult, fan_out
from orchestrator.hostside import protocol
from orchestrator.machines.hostclient import request
from orchestrator.machines.kinds import kind_of
from orchestrator.machines.runner import LineSession
from orchestrator.model.answers import Connections, Inspection, PeerProbe, parsed
from orchestrator.model.findings import (
    DEFAULT_MIN_FREE_BYTES,
    DEFAULT_PROBE_TIMEOUT,
    Finding,
    PreflightReport,
    Status,
)
from orchestrator.model.inventory import Inventory, WorkerSlot
from orchestrator.model.workers import checkpoint_dir, job_dir
from orchestrator.paths import is_loopback

# ---------------------------------------------------------------------------------------------
# Pure checks


def address_findings(inventory: Inventory) -> list[Finding]:
    """`localhost` in a multi-machine TF_CONFIG: the other hosts would dial themselves."""
    loopback = [h for h in inventory.hosts if is_loopback(h.address)]
    if not loopback or len(loopback) == len(inventory.hosts):
        return []
    return [
        Finding(
            host.name,
            "address",
            Status.FAIL,
            f"{host.address} is a loopback address but other hosts are remote: they would "
            "connect to themselves, not to this worker",
            hint="use an address the other hosts reach this one by",
        )
        for host in loopback
    ]


def software_findings(inventory: Inventory, reports: Mapping[str, Inspection]) -> list[Finding]:
    """Each reached host's login, then the software checks every backend shares (software.py)."""
    login = {host.name: kind_of(host).login_check for host in inventory.hosts}
    findings = [Finding(name, str(login[name]), Status.OK, "connected and logged in")
                for name in reports if login[name]]  # fmt: skip
    found = {name: Software(r.python, r.packages) for name, r in reports.items()}
    return findings + shared_software_findings(inventory.job, found, Where())


def port_finding(host: WorkerSlot, report: Inspection) -> Finding:
    if report.listener_pid:
        return Finding(host.name, "port", Status.OK, f"port {host.port} is free")
    holder = report.holder
    if holder and holder.run_id:
        return Finding(
            host.name,
            "port",
            Status.FAIL,
            # One wording whether run X is live or a worker outlived it: the host cannot tell
            # which, and a live run's worker is no "leftover".
            f"port {host.port} is held by worker {holder.worker or '?'} of run {holder.run_id} "
            f"(pid {holder.pid})",
            hint=f"if run {holder.run_id} is still wanted, wait for it or give this job other "
            f"ports ('port: auto'); else stop it with 'orchestrate down --run {holder.run_id}' "
            f"from the directory that started it, or 'kill {holder.pid}' on the host",
        )
    if holder:
        detail = f"port {host.port} is busy: pid {holder.pid} ({holder.command}) listens on it"
    else:
        detail = f"port {host.port} cannot be bound: {report.port_error}"
    return Finding(
        host.name,
        "port",
        Status.FAIL,
        detail,
        hint="stop that process or give this host another 'port:'",
    )


def directory_findings(
    host: WorkerSlot, report: Inspection, labels: list[str], min_free: int
) -> list[Finding]:
    findings = []
    for label, directory in zip(labels, report.directories, strict=True):
        free = directory.free_bytes
        if not directory.writable:
            findings.append(
                Finding(
                    host.name,
                    label,
                    Status.FAIL,
                    f"{directory.path} is not writable ({directory.checked} is not)",
                    hint="fix its permissions or choose another workdir / checkpoint_dir",
                )
            )
        elif free < min_free:
            findings.append(
                Finding(
                    host.name,
                    label,
                    Status.FAIL,
                    f"only {free / 2**30:.1f} GiB free under {directory.path} "
                    f"(at least {min_free / 2**30:.1f} GiB wanted)",
                    hint="free some space, or lower the bar with --min-free-gb",
                )
            )
        else:
            findings.append(
                Finding(
                    host.name, label, Status.OK, f"{directory.path}: {free / 2**30:.1f} GiB free"
                )
            )
    return findings


def no_proxy_covers(address: str, entries: str) -> bool:
    """Whether a no_proxy list exempts `address`: `*`, the address, a domain suffix, or a CIDR."""
    for raw in entries.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry in ("*", address.lower()):
            return True
        if "/" in entry:
            try:
                if ipaddress.ip_address(address) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if address.lower().endswith("." + entry.lstrip(".")):
            return True
    return False


def proxy_finding(host: WorkerSlot, env: Mapping[str, str], peers: Iterable[WorkerSlot]) -> Finding:
    """gRPC honours grpc_proxy, https_proxy and http_proxy unless no_grpc_proxy/no_proxy exempt
    the target: a proxy between the workers breaks their gRPC traffic."""
    lowered = {k.lower(): v for k, v in env.items()}
    proxies = [k for k in ("grpc_proxy", "https_proxy", "http_proxy") if lowered.get(k)]
    if not proxies:
        return Finding(host.name, "proxy", Status.OK, "no proxy variables")
    exempt = ",".join(lowered.get(k, "") for k in ("no_grpc_proxy", "no_proxy"))
    missing = [p.address for p in peers if not no_proxy_covers(p.address, exempt)]
    if not missing:
        return Finding(host.name, "proxy", Status.OK, f"{proxies[0]} set; peers are in no_proxy")
    return Finding(
        host.name,
        "proxy",
        Status.FAIL,
        f"{proxies[0]} is set and {', '.join(missing)} not in no_proxy: the workers' gRPC would "
        "go through the proxy",
        hint=f"add no_grpc_proxy: '{','.join(missing)}' to the job's env",
    )


PROBE_MEANING = {
    "timeout": "timed out, probably a firewall dropping packets",
    "refused": "refused: nothing listening, or a firewall REJECT rule",
    "unreachable": "unreachable: no route",
    "error": "failed",
}


def gloo_finding(host: WorkerSlot, report: Inspection) -> Finding | None:
    """software.gloo_finding of a host; None where it cannot matter (a host at a loopback
    address, whose peers share its machine) or the probe did not say."""
    if report.name_addresses is None or is_loopback(host.address):
        return None
    return shared_gloo_finding(host.name, report.hostname, report.name_addresses, host.address)


def reachability_finding(
    target: WorkerSlot, probes: Mapping[str, PeerProbe], timeout: float
) -> Finding:
    """`probes` maps each peer's name to how its connection to `target`'s port ended."""
    if not probes:
        return Finding(target.name, "reachable", Status.OK, "no peer to check from")
    failed = {peer: p for peer, p in probes.items() if p.status != "ok"}
    if not failed:
        return Finding(
            target.name,
            "reachable",
            Status.OK,
            f"port {target.port} reachable from {', '.join(probes)}",
        )
    lines = []
    for peer, probe in failed.items():
        meaning = PROBE_MEANING.get(probe.status, probe.status)
        if probe.status == "timeout":
            meaning = meaning.replace("timed out", f"timed out after {timeout:g} s")
        extra = f" ({probe.detail})" if probe.detail else ""
        lines.append(f"from {peer}: {meaning}{extra}")
    return Finding(
        target.name,
        "reachable",
        Status.FAIL,
        f"{target.endpoint} cannot be reached " + "; ".join(lines),
        hint=f"open TCP port {target.port} on {target.name} to the other hosts "
        "('orchestrate firewall INVENTORY' prints the rules)",
    )


def exposure_finding(host: WorkerSlot, controller: str, reached: bool) -> Finding:
    """Whether this machine, which is not in the cluster, could connect to the host's TensorFlow
    port: then so can anyone on its network, and the port takes no authentication."""
    if not reached:
        return Finding(host.name, "exposed", Status.OK,
                       f"port {host.port} is closed to this machine ({controller})")  # fmt: skip
    return Finding(
        host.name,
        "exposed",
        Status.WARN,
        f"port {host.port} accepts connections from this machine ({controller}), which is not in "
        "the cluster: the unauthenticated TensorFlow port is open beyond the cluster",
        hint="'orchestrate firewall INVENTORY' prints rules that admit only the cluster's hosts",
    )


def outsiders(inventory: Inventory, route_source: Callable[[str], str | None]) -> dict[str, str]:
    """Host name -> this machine's address towards it, for hosts this machine is no member of
    (its address there is not one of the inventory's; loopback and local hosts are members)."""
    members = {host.address for host in inventory.hosts}
    found = {}
    for host in inventory.hosts:
        if is_loopback(host.address) or kind_of(host).shares_files_with_controller:
            continue
        source = route_source(host.address)
        if source is not None and source not in members and not is_loopback(source):
            found[host.name] = source
    return found


def shared_directory_finding(
    host: WorkerSlot, visible: bool | None, directory: str
) -> Finding | None:
    if visible is None:
        return None
    if visible:
        return Finding(host.name, "shared", Status.OK, f"sees the chief's {directory}")
    return Finding(
        host.name,
        "shared",
        Status.WARN,
        f"{directory} is not shared with the chief; its checkpoints are copied here before "
        "each start",
    )


# ---------------------------------------------------------------------------------------------
# The rounds


def partition_findings(
    inventory: Inventory, preflight: Callable[[Inventory], PreflightReport]
) -> list[Finding]:
    """The blocking findings of a fresh check that say the hosts cannot reach each other (their
    ports, or logging in); none without a check when every worker is on one machine."""
    hosts = inventory.hosts
    if len({kind_of(h).machine_key(h) for h in hosts}) < 2:
        return []  # workers of one machine cannot be cut off from each other
    network = {"reachable", "connect"} | {kind_of(h).login_check for h in hosts} - {None}
    return [f for f in preflight(inventory).blocking if f.check in network]


class ProbeSessions(Protocol):
    """Where the rounds get one hostprobe session per host (Machines, or a test's fake)."""

    def preflight_session(self, host: WorkerSlot) -> LineSession: ...


def run_preflight(
    inventory: Inventory,
    machines: ProbeSessions,
    *,
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
    exposure: ExposureProbe | None = None,
    perf: bool = False,
) -> PreflightReport:
    """`exposure`: how this machine finds its address towards a host and tries a port (the CLI
    passes the real ones; without it the exposure check is skipped). `perf`: the performance
    round too."""
    early = address_findings(inventory)
    if early:
        return PreflightReport(tuple(early))  # rejected before any connection
    hosts = {host.name: host for host in inventory.hosts}
    directories = {name: _directories(inventory, host) for name, host in hosts.items()}
    token = _shared_token(inventory)
    sessions: dict[str, LineSession] = {}

    def inspect(host: WorkerSlot) -> Inspection:
        session = sessions[host.name] = machines.preflight_session(host)
        answer = request(
            session,
            protocol.INSPECT,
            probe_timeout + 30,
            port=host.port,
            packages=list(PACKAGES),  # what the software checks judge (software.py)
            directories=directories[host.name],
            listen_seconds=probe_timeout * 4 + 60,
            token=token if host is inventory.hosts[0] else None,
        )
        return parsed(host.name, Inspection.parse, answer)

    try:
        inspections = _round(hosts, inspect)
        reports = dict(inspections.ok)
        connects = _connect_round(inventory, sessions, reports, probe_timeout, token)
        exposed = _exposure_round(inventory, reports, exposure, probe_timeout)
        if perf:
            exposed += run_perf_round(inventory, sessions, reports)
        _round(
            {name: hosts[name] for name in reports},
            lambda host: request(
                sessions[host.name],
                protocol.CLEANUP,
                30,
                listener_pid=reports[host.name].listener_pid,
                token=token if host is inventory.hosts[0] else None,
            ),
        )
    finally:
        # End of input also stops a listener whose cleanup request never arrived.
        _round({n: hosts[n] for n in list(sessions)}, lambda host: sessions[host.name].close())
    findings = [_failure_finding(hosts[name], error) for name, error in inspections.failed.items()]
    findings += _host_findings(inventory, reports, connects, min_free_bytes, probe_timeout)
    findings += exposed
    return PreflightReport(tuple(sorted(findings, key=_order(inventory))))


def _round(
    hosts: Mapping[str, WorkerSlot], action: Callable[[WorkerSlot], Any]
) -> GroupResult[str, Any]:
    return fan_out(hosts, lambda name: action(hosts[name]))


def _directories(inventory: Inventory, host: WorkerSlot) -> list[str]:
    directory = job_dir(inventory.job, host.workdir)
    return [directory, checkpoint_dir(inventory.job, directory)]


def _shared_token(inventory: Inventory) -> str | None:
    """An absolute checkpoint_dir on several machines suggests a shared disk: verify it."""
    machines = {kind_of(host).machine_key(host) for host in inventory.hosts}
    if not posixpath.isabs(inventory.job.checkpoint_dir) or len(machines) < 2:
        return None
    name = f".orchestrate-shared-check-{secrets.token_hex(4)}"
    return posixpath.join(inventory.job.checkpoint_dir, name)


def _connect_round(
    inventory: Inventory,
    sessions: Mapping[str, LineSession],
    reports: Mapping[str, Inspection],
    timeout: float,
    token: str | None,
) -> GroupResult[str, Connections]:
    listening = [h for h in inventory.hosts if h.name in reports and reports[h.name].listener_pid]
    probers = {h.name: h for h in inventory.hosts if h.name in reports}

    def connect(host: WorkerSlot) -> Connections:
        peers = [
            {protocol.NAME_KEY: p.name, protocol.ADDRESS_KEY: p.address, protocol.PORT_KEY: p.port}
            for p in listening
            if p.name != host.name
        ]
        answer = request(sessions[host.name], protocol.CONNECT, timeout + 30,
                         peers=peers, timeout=timeout, token=token)  # fmt: skip
        return parsed(host.name, Connections.parse, answer)

    return _round(probers, connect)


@dataclass(frozen=True)
class ExposureProbe:
    route_source: Callable[[str], str | None]  # this machine's address towards an address
    reaches: Callable[[str, int, float], bool]  # whether a TCP connect succeeds in time


def _exposure_round(
    inventory: Inventory,
    reports: Mapping[str, Inspection],
    exposure: ExposureProbe | None,
    timeout: float,
) -> list[Finding]:
    """While the listeners hold the ports: can this machine, no cluster member, connect?"""
    if exposure is None:
        return []
    hosts = {
        h.name: h for h in inventory.hosts if h.name in reports and reports[h.name].listener_pid
    }
    targets = {n: a for n, a in outsiders(inventory, exposure.route_source).items() if n in hosts}
    wait = min(timeout, 2.0)
    tried = fan_out(targets, lambda n: exposure.reaches(hosts[n].address, hosts[n].port, wait))
    return [exposure_finding(hosts[n], targets[n], reached) for n, reached in tried.ok.items()]


def _host_findings(
    inventory: Inventory,
    reports: Mapping[str, Inspection],
    connects: GroupResult[str, Connections],
    min_free: int,
    timeout: float,
) -> list[Finding]:
    findings = software_findings(inventory, reports)
    env = inventory.job.env
    for host in inventory.hosts:
        report = reports.get(host.name)
        if report is None:
            continue
        findings.append(port_finding(host, report))
        findings += directory_findings(host, report, ["workdir", "checkpoints"], min_free)
        peers = [p for p in inventory.hosts if p.name != host.name]
        findings.append(proxy_finding(host, {**report.env, **env}, peers))
        gloo = gloo_finding(host, report) if inventory.job.keras == KERAS_JAX and peers else None
        findings += [gloo] if gloo else []
        if report.listener_pid:
            probes = {
                peer: answer.peers[host.name]
                for peer, answer in connects.ok.items()
                if host.name in answer.peers
            }
            findings.append(reachability_finding(host, probes, timeout))
        answer = connects.ok.get(host.name)
        if host is not inventory.hosts[0] and answer:
            shared = shared_directory_finding(
                host, answer.token_visible, inventory.job.checkpoint_dir
            )
            findings += [shared] if shared else []
    hosts = {host.name: host for host in inventory.hosts}
    findings += [_failure_finding(hosts[n], e) for n, e in connects.failed.items()]
    return findings


def _failure_finding(host: WorkerSlot, error: HostError) -> Finding:
    # A host that could not be reached fails its kind's login check; a reached host whose
    # program failed fails Python's.
    login = kind_of(host).login_check or "connect"
    check = login if isinstance(error, ConnectError) else "python"
    return Finding(host.name, check, Status.FAIL, error.message.split(": ", 1)[-1], error.hint)


def _order(inventory: Inventory) -> Callable[[Finding], tuple[int, int]]:
    index = {host.name: i for i, host in enumerate(inventory.hosts)}
    checks = ["address", "ssh", "connect", "python", "tensorflow", "keras", "worker", "port",
              "reachable", "exposed", "proxy", "workdir", "checkpoints", "shared", "compute",
              "throughput"]  # fmt: skip
    return lambda f: (index.get(f.host, 0), checks.index(f.check) if f.check in checks else 99)
