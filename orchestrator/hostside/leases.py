"""Leases on a host: ports and GPUs that one run holds against every other job of every user.

STANDARD LIBRARY ONLY, sent as `python -c SOURCE` like agent.py; requests as JSON lines on
standard input, one JSON answer per line (protocol.py's serve loop). A verb that fails answers
{"error": "..."}. This module takes claims and forks keepers; what is valid, what to try and who
may take what are decided in leasepolicy.py (pure).

Verbs:
  acquire lease_dir run_id job controller idle workers [dry_run]
                  lease each worker's port (fixed, or the first free one of its range, the
                  run's own one first) and GPUs (from its pool; shared only between leases that
                  all say share); a run's resources that its live keeper holds are kept. Taken
                  resources pass to a keeper: a small process of its own session that holds the
                  claims until the run's end, `release`, or `idle` seconds without a worker or
                  minder of the run on this host (its standbys do not count). `dry_run`:
                  what would be taken, nothing held. A clash answers who holds what.
  release lease_dir run_id   stop this account's keepers of the run: its leases are free
  list lease_dir             every live holder's record, any user; records ignored, and why;
                             the live tickets of queued runs, in their order
  withdraw lease_dir run_id  remove this account's ticket of the run (it started, or gave up)

The queue (`up --queue`): `acquire` with `ticket` (the run's arrival time, and its controller's
pid, process start time, boot id and pid namespace) writes the run's ticket beside the leases,
`ticket-{uid}-{run_id}.json`: what it needs (fixed ports, GPUs of a pool) and since when. A run
takes new resources only when no earlier live ticket needs any of them (may_take; every
acquire obeys it, queued or not); a blocked or clashing queued acquire keeps its ticket and is
asked again. A ticket lives while its controller does: on this machine (same boot id and pid
namespace) the process itself is looked at; else it expires TICKET_TTL seconds after its last
acquire refreshed it. A ticket that could never be served (more GPUs than its pool has) or whose
arrival is before its process started (where that process is seen) is ignored and named: it
blocks nothing.

A lease on a port or GPU is a claim (claims.py): an abstract Unix socket named after the lease
directory and the resource, bound by the keeper (exclusive; for GPUs whose leases say share,
one name per sharer below it). No file holds it, so no file anyone creates, deletes or renames
in the lease directory can make two keepers hold one resource, and the kernel frees it when the
keeper dies. The keeper listens again on the claims it inherits, so that each answers, to
anyone who connects (SO_PEERCRED), with the keeper's pid and uid. Beside them, per keeper, a
record `lease-{uid}-{run_id}-{token}.json`: user, uid, job, run id, controller, since, ports,
GPUs, the keeper's pid and start time, its boot id, pid and network namespace. Records say who
holds what; they hold nothing, and count only while their keeper holds every claim they name,
as the kernel answers (leasepolicy.record_alive): a dead keeper's record is stale at once,
whatever anyone does with files. No lock file any more: a flock works on a read-only
descriptor, so a file others can open proves nothing. A record of another network namespace
(whose claims' names are not visible here) counts as taken while its keeper process lives
(same boot and pid namespace) or, where that cannot be seen, while the keeper touches it
(RECORD_TTL). Records are readable by every user and hold no secret. The directory is made
sticky and world-writable (1777), like /tmp, and used only when it is this account's or root's
and sticky.
An older orchestrate's keepers held flocks on `port-N.lock` and `gpu-N.lock`: a held one still
counts as taken (looked at, never created).

Other users' files are untrusted input: opened with O_NOFOLLOW and O_NONBLOCK after an lstat,
only regular files of a bounded size and nesting, a record or ticket only when its owner is the
uid and user it claims, its times are within range and every field is what it should be
(leasepolicy); anything else is ignored and named (path, owner, why), never followed, and blocks
nothing.
"""

import contextlib
import math
import os
import select
import signal
import socket
import sys
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator import contract
    from orchestrator.hostside import claims, leasedir, protocol, rundir, safefiles
    from orchestrator.hostside import leasepolicy as policy
    from orchestrator.hostside import leasequeue as queue
else:  # shipped: hostside/bundle.py carries them in front of this file's source
    import claims  # type: ignore[no-redef]
    import contract  # type: ignore[no-redef]
    import leasedir  # type: ignore[no-redef]
    import leasepolicy as policy  # type: ignore[no-redef]
    import leasequeue as queue  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import rundir  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]

POLL = 1.0  # seconds between the keeper's looks at the run's processes


def _bindable(port):
    """Whether nothing listens on the port here (TensorFlow binds 0.0.0.0:PORT)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


# --- acquire, release, list -------------------------------------------------------------------


class _Taking:
    """One acquire: what the run holds already, the claims taken so far (sockets, released
    unless handed to a keeper), the clashes and the hostile files met."""

    def __init__(self, lease_dir, live, mine, run_id):
        self.lease_dir = lease_dir
        self.space = claims.space(lease_dir)
        self.live = live
        # what claims cannot show: records of this machine's other network namespaces
        boot, here = leasedir.here()[0], leasedir.netns()
        self.elsewhere = [
            r
            for r in live
            if r[policy.BOOT_ID_KEY] == boot and r[policy.NETNS_KEY] not in ("", here)
        ]
        self.run = (os.getuid(), run_id)
        self.own = {policy.PORTS_KEY: {p for r in mine for p in r[policy.PORTS_KEY]},
                    policy.GPUS_KEY: {g for r in mine for g in r[policy.GPUS_KEY]}}  # fmt: skip
        self.used = {
            policy.PORTS_KEY: set(),
            policy.GPUS_KEY: set(),
        }  # by this request's earlier workers
        self.new = {policy.PORTS_KEY: [], policy.GPUS_KEY: []}
        self.held = []  # claims.py's sockets: the keeper inherits them
        self.clashes = []
        self.ignored = []

    def take(self, kind, number, shared=False):
        """True if taken now (claims.py); False if another holder may not share it: a claim,
        or a live record (one of another network namespace holds claims not visible here)."""
        if leasedir.legacy_held(self.lease_dir, kind, number):
            return False
        if any(self._elsewhere(r, kind, number, shared) for r in self.elsewhere):
            return False
        held = claims.claim(self.space, kind, number, shared)
        if held is None:
            return False
        self.held.append(held)
        self.new[kind].append(number)
        return True

    def _elsewhere(self, record, kind, number, shared):
        """Whether another namespace's record holds the resource against this request: a
        port is its namespace's own, except against another run; a GPU is the machine's."""
        if number not in record[kind]:
            return False
        if kind == "ports":
            return (record[policy.UID_KEY], record[policy.RUN_ID_KEY]) != self.run
        return not (shared and record[policy.SHARED_GPUS_KEY])

    def unknown_holders(self, kind, numbers):
        """Who holds these resources without a record: the uid a claim's holder answers with,
        else the owner of an older orchestrate's lock file that is held."""
        found = {}
        for number in numbers:
            uid = claims.holder_uid(self.space, kind, number)
            if uid is None and leasedir.legacy_held(self.lease_dir, kind, number):
                uid = leasedir.owner_of(leasedir.legacy_path(self.lease_dir, kind, number))
            if uid is not None:
                found[str(number)] = uid
        return found

    def close(self):
        for held in self.held:
            held.close()
        self.held = []


def cmd_acquire(request):
    lease_dir = request[policy.LEASE_DIR_KEY]
    run_id = request[policy.RUN_ID_KEY]
    leasedir.ensure_dir(lease_dir)
    live, ignored = leasedir.scan(lease_dir)
    mine = _mine(live, run_id)
    if not mine and not request.get(policy.DRY_RUN_KEY):  # a restart keeps what it holds, unqueued
        waiting, bad_tickets = queue.turn(request, lease_dir)
        ignored += bad_tickets  # named also when they are in nobody's way
        if waiting is not None:
            return dict(waiting, ignored=ignored)
    taking = _Taking(lease_dir, live, mine, run_id)
    assigned, shared = {}, False
    try:
        for worker in request[policy.WORKERS_KEY]:
            port = _acquire_port(worker, taking)
            gpus = _acquire_gpus(worker, taking)
            shared = shared or (bool(worker.get(policy.SHARE_KEY)) and bool(gpus))
            assigned[worker[policy.NAME_KEY]] = {policy.PORT_KEY: port, policy.GPUS_KEY: gpus}
        ignored += taking.ignored
        if taking.clashes:
            return {policy.CLASHES_KEY: taking.clashes, policy.IGNORED_KEY: ignored,
                    policy.QUEUED_KEY: bool(request.get(policy.TICKET_KEY))}  # fmt: skip
        keeper = None
        if taking.held and not request.get(policy.DRY_RUN_KEY):
            keeper = _start_keeper(request, sorted(taking.new[policy.PORTS_KEY]),
                                   sorted(taking.new[policy.GPUS_KEY]), shared,
                                   taking.held)  # fmt: skip
        return {
            policy.ASSIGNED_KEY: assigned,
            policy.IGNORED_KEY: ignored,
            "keeper": keeper,
            "kept": bool(mine),
        }
    finally:
        taking.close()  # a keeper holds its own copies


def _mine(live, run_id):
    """The run's records on this host: this account's, in this network namespace (the run's
    workers on other namespace hosts sharing the directory hold their own)."""
    here = leasedir.netns()
    return [r for r in live if r[policy.UID_KEY] == os.getuid() and r[policy.RUN_ID_KEY] == run_id
            and r[policy.NETNS_KEY] in ("", here)]  # fmt: skip


def _acquire_port(worker, taking):
    """The worker's port, leased (or kept), or None after recording a clash."""
    span = worker.get(policy.RANGE_KEY)
    if span is None:  # a fixed port: that one, or a clash
        candidates = [worker.get(policy.PORT_KEY)]
    else:
        candidates = policy.port_candidates(worker.get(policy.KEEP_PORT_KEY), span[0], span[1])
    held = []
    for port in candidates:
        if port in taking.used[policy.PORTS_KEY]:
            continue
        if port in taking.own[policy.PORTS_KEY] or (
            (span is None or _bindable(port)) and taking.take("ports", port)
        ):
            taking.used[policy.PORTS_KEY].add(port)
            return port
        if span is None or _bindable(port):
            held.append(port)  # else something that is no lease listens there
    taking.clashes.append(_clash(worker, taking, "ports", held))
    return None


def _acquire_gpus(worker, taking):
    count = worker.get(policy.GPUS_KEY)
    if not count:
        return None
    pool = queue.gpu_pool(worker)
    share = bool(worker.get(policy.SHARE_KEY))
    chosen, held = [], []
    for gpu in policy.gpu_candidates(pool, worker.get(policy.KEEP_GPUS_KEY)):
        if len(chosen) == count:
            break
        if gpu in taking.used[policy.GPUS_KEY]:
            continue
        if gpu in taking.own[policy.GPUS_KEY] or taking.take("gpus", gpu, shared=share):
            chosen.append(gpu)
        else:
            held.append(gpu)
    if len(chosen) < count:
        clash = _clash(worker, taking, "gpus", held)
        clash[policy.WANTED_GPUS_KEY] = count
        clash[policy.POOL_KEY] = pool
        taking.clashes.append(clash)
        return None
    taking.used[policy.GPUS_KEY].update(chosen)
    return sorted(chosen)


def _clash(worker, taking, kind, held):
    clash = policy.clash(worker, taking.live, kind, held)
    unknown = clash[policy.UNKNOWN_KEY].get(kind, [])
    if unknown:
        clash[policy.UNKNOWN_UIDS_KEY] = taking.unknown_holders(kind, unknown)
    return clash


def _start_keeper(request, ports, gpus, shared, held):
    """Hand the taken claims (`held`: this process's sockets, inherited) to a new keeper, which
    makes itself the process they answer as; its pid. No lock file: a file any account can
    open is no proof of life (a flock works on a read-only descriptor)."""
    base = os.path.join(
        request[policy.LEASE_DIR_KEY],
        f"lease-{os.getuid()}-{request[policy.RUN_ID_KEY]}-{os.urandom(6).hex()}",
    )
    read_end, write_end = os.pipe()
    middle = os.fork()  # spawn point: the keeper, forked twice (no exec)
    if middle == 0:
        status = 1
        try:
            os.close(read_end)
            if os.fork() == 0:
                os.setsid()
                devnull = os.open(os.devnull, os.O_RDWR)
                for target in (0, 1, 2):
                    os.dup2(devnull, target)
                os.close(devnull)
                for sock in held:  # before its pid is told: no record names another pid
                    claims.answer_as_keeper(sock)
                os.write(write_end, f"{os.getpid()}\n".encode())
                os.close(write_end)
                try:
                    keep(request, base, held)
                finally:
                    os._exit(0)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    os.waitpid(middle, 0)
    answer = b""
    while chunk := os.read(read_end, 64):
        answer += chunk
    os.close(read_end)
    pid = int(answer.split()[0])
    boot, pidns = leasedir.here()
    record = {
        policy.USER_KEY: leasedir.account(os.getuid()),
        policy.UID_KEY: os.getuid(),
        policy.JOB_KEY: request[policy.JOB_KEY],
        policy.RUN_ID_KEY: request[policy.RUN_ID_KEY],
        policy.CONTROLLER_KEY: request[policy.CONTROLLER_KEY],
        policy.SINCE_KEY: time.time(),
        policy.PID_KEY: pid,
        policy.KEEPER_START_KEY: leasedir.started_at(pid),
        policy.BOOT_ID_KEY: boot,
        policy.PIDNS_KEY: pidns,
        policy.NETNS_KEY: leasedir.netns(),
        policy.PORTS_KEY: ports,
        policy.GPUS_KEY: gpus,
        policy.SHARED_GPUS_KEY: shared,
    }
    safefiles.write_json(base + ".json", record, mode=0o644)  # readable by every account
    return pid  # the keeper holds its copies of the claims (the caller closes its own)


def run_processes(run_id, uid, skip=()):
    """This account's processes of the run: minders and workers (their environment names
    the run), not its standbys (whose command lines name a standby directory)."""
    wanted = f"{contract.RUN_ID_ENV}={run_id}".encode()
    standby = f"/{rundir.STANDBY_DIR_NAME}/".encode()  # a standby's minder-to-be: not yet the run's
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if wanted not in environ:
            continue
        if standby in cmdline and protocol.SUPERVISE.encode() not in cmdline:
            continue
        found.append(int(entry))
    return found


def keep(request, base, held):
    """The keeper: hold the inherited claims while the run lives on this host; answer every
    look at them (who holds this?) and touch the record (its life where the claims cannot be
    seen: another network namespace)."""
    idle = float(request.get(policy.IDLE_KEY, 60))
    run_id = request[policy.RUN_ID_KEY]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sock in held:
        sock.setblocking(False)
    seen = time.monotonic()  # the launch follows the lease: its start counts as seen
    looked = -math.inf
    me = {os.getpid()}
    while not stop:
        if time.monotonic() - looked >= POLL:
            looked = time.monotonic()
            with contextlib.suppress(OSError):
                os.utime(base + ".json")
            if run_processes(run_id, os.getuid(), me):
                seen = time.monotonic()
            elif time.monotonic() - seen > idle:
                break
        with contextlib.suppress(InterruptedError, OSError, ValueError):
            ready, _, _ = select.select(held, [], [], min(POLL, max(idle / 4, 0.05)))
            for sock in ready:
                claims.turn_away(sock)
    with contextlib.suppress(OSError):
        os.remove(base + ".json")


def cmd_release(request):
    lease_dir, run_id = request[policy.LEASE_DIR_KEY], request[policy.RUN_ID_KEY]
    live, _ = leasedir.scan(lease_dir)
    mine = _mine(live, run_id)
    released = {policy.PORTS_KEY: [], policy.GPUS_KEY: []}
    for record in mine:
        record[policy.LEASE_DIR_KEY] = lease_dir
        if leasedir.keeper_lives(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record[policy.PID_KEY], signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and leasedir.keeper_lives(record):
            time.sleep(0.02)
        if leasedir.keeper_lives(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record[policy.PID_KEY], signal.SIGKILL)
        base = os.path.join(lease_dir, record[policy.FILE_KEY][: -len(".json")])
        for path in (base + ".json", base + ".lock"):  # .lock: an older keeper's
            with contextlib.suppress(OSError):
                os.remove(path)
        released[policy.PORTS_KEY] += record[policy.PORTS_KEY]
        released[policy.GPUS_KEY] += record[policy.GPUS_KEY]
    return {"released": released, "keepers": len(mine)}


def cmd_list(request):
    lease_dir = request[policy.LEASE_DIR_KEY]
    live, ignored = leasedir.scan(lease_dir)
    ours = leasedir.netns()
    for record in live:
        record.pop(policy.FILE_KEY, None)
        # else another namespace's: it blocks
        record[policy.HERE_KEY] = record[policy.NETNS_KEY] in ("", ours)
    tickets, bad = leasedir.scan_tickets(lease_dir)
    for ticket in tickets:
        ticket.pop(policy.FILE_KEY, None)
    return {
        policy.HOLDERS_KEY: live,
        policy.IGNORED_KEY: ignored + bad,
        policy.TICKETS_KEY: tickets,
        "now": time.time(),
    }


VERBS = {protocol.ACQUIRE: cmd_acquire, protocol.RELEASE: cmd_release, protocol.LIST: cmd_list,
         protocol.WITHDRAW: queue.cmd_withdraw}  # fmt: skip


if __name__ == "__main__":
    protocol.serve(sys.stdin, sys.stdout, VERBS)
