"""Leases on a host, the pure part: which records and tickets are valid, which ports and GPUs
to try, and whether a queued run may take what it needs (leases.py does the locking).

STANDARD LIBRARY ONLY (shipped with the lease program: hostside/bundle.py). Other users' files
are untrusted input: a record or ticket counts only when its owner is the uid it claims and
every field is what it should be; anything else is ignored, and why is said.
"""

import math
import re

CLOCK_SKEW = 300.0  # seconds a host's clock may run ahead of the one that wrote a time
EARLIEST = 946684800.0  # 2000-01-01: no record or ticket is older (a time before is forged)
TICKET_TTL = 30.0  # seconds a ticket of a controller on another machine lives unrefreshed
RECORD_TTL = 30.0  # seconds a record whose claims cannot be seen from here lives untouched
ARRIVAL_SLACK = 2.0  # seconds a ticket's arrival may precede its process's start (clock ticks)
TICKET_NAME = re.compile(r"^ticket-(\d{1,10})-([A-Za-z0-9_.-]{1,64})\.json$")
LEGACY_LOCK = re.compile(r"^(port|gpu)-\d{1,5}\.lock$")  # an older orchestrate's leases
RECORD_NAME = re.compile(r"^lease-(\d{1,10})-([A-Za-z0-9_.-]{1,64})-([0-9a-f]{8,32})\.json$")
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")  # user, job, run id
HOSTNAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}$")


# --- the lease program's keys: its requests and answers (backends/hosts/leases.py writes and
# model/leases.py reads them), its lease records and tickets (leases.py and leasequeue.py write
# them, validate_record and validate_ticket read them): declared once, here.
# acquire, release, list, withdraw: the request
LEASE_DIR_KEY = "lease_dir"
RUN_ID_KEY = "run_id"
JOB_KEY = "job"
CONTROLLER_KEY = "controller"  # the controller's host name
IDLE_KEY = "idle"  # seconds a keeper lives after its controller stopped touching it
DRY_RUN_KEY = "dry_run"
TICKET_KEY = "ticket"  # queue for what is held: the ticket's ARRIVAL_KEY and process (below)
WORKERS_KEY = "workers"  # each with NAME_KEY and the five below, PORT_KEY, RANGE_KEY, GPUS_KEY
NAME_KEY = "name"
KEEP_PORT_KEY = "keep_port"
KEEP_GPUS_KEY = "keep_gpus"
POOL_KEY = "pool"  # the GPUs a worker may take; a clash's: the pool it asked of
SHARE_KEY = "share"
# the answers: acquire's
ASSIGNED_KEY = "assigned"  # per worker, its PORT_KEY and GPUS_KEY
CLASHES_KEY = "clashes"
QUEUED_KEY = "queued"
IGNORED_KEY = "ignored"  # files that count for nothing (leasedir.ignored_file), and why
# list's
HOLDERS_KEY = "holders"  # the live records; a clash's: who holds what it could not take
TICKETS_KEY = "tickets"
HERE_KEY = "here"  # a record of this network namespace (else another's: it still blocks)
# a lease record, a ticket (with UID_KEY, JOB_KEY, RUN_ID_KEY, CONTROLLER_KEY, BOOT_ID_KEY,
# PIDNS_KEY and PID_KEY: the keeper's, or the queued controller's)
USER_KEY = "user"
UID_KEY = "uid"
PID_KEY = "pid"
SINCE_KEY = "since"
PORTS_KEY = "ports"  # also a ticket's needs; a clash's kind
GPUS_KEY = "gpus"  # also a worker's count, a pool's list; a clash's kind
SHARED_GPUS_KEY = "shared_gpus"
BOOT_ID_KEY = "boot_id"
PIDNS_KEY = "pidns"
NETNS_KEY = "netns"
KEEPER_START_KEY = "keeper_start"
TOUCHED_KEY = "touched"
FILE_KEY = "file"  # its file's name (an ignored one's: its path)
ARRIVAL_KEY = "arrival"  # a ticket's
SEEN_KEY = "seen"
STARTTIME_KEY = "starttime"
NEEDS_KEY = "needs"  # PORTS_KEY and POOLS_KEY
POOLS_KEY = "pools"  # each with GPUS_KEY and COUNT_KEY
COUNT_KEY = "count"
# a clash (clash, queue_clash; with HOLDERS_KEY, PORT_KEY, RANGE_KEY, and in acquire POOL_KEY)
WORKER_KEY = "worker"
KIND_KEY = "kind"
PORT_KEY = "port"
RANGE_KEY = "range"
UNKNOWN_KEY = "unknown"  # held, by a claim of no live record
UNKNOWN_UIDS_KEY = "unknown_uids"
WANTED_GPUS_KEY = "wanted_gpus"
# an ignored file
OWNER_UID_KEY = "owner_uid"
OWNER_NAME_KEY = "owner_name"
REASON_KEY = "reason"


def port_candidates(keep, low, high):
    """The ports to try for `port: auto`, in order: the run's own one first (a restart keeps
    it), then the range from its low end."""
    ports = list(range(low, high + 1))
    if keep in ports:
        ports.remove(keep)
        ports.insert(0, keep)
    return ports


def gpu_candidates(pool, keep):
    """The GPUs to try, in order: the run's own ones first, then the pool's order."""
    keep = [g for g in keep or () if g in pool]
    return keep + [g for g in pool if g not in keep]


def moment(value, now):
    """A time a file says (seconds since the epoch) as a float, or None where it is no number or
    not finite; given `now`, also where it is before EARLIEST or after `now` beyond CLOCK_SKEW
    (seen: 1e300 or arrival: -1e300 would put a forged ticket first forever, and no clock can
    show them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if now is not None and not EARLIEST <= value <= now + CLOCK_SKEW:
        return None
    return float(value)


def claims_owner(data, owner_uid, owner_name, uid_in_name):
    """Why the file's uid or user is not its owner's, or None. Pure."""
    uid = data.get(UID_KEY)
    whole = isinstance(uid, int) and not isinstance(uid, bool)
    if not whole or uid != owner_uid or str(uid) != uid_in_name:
        return f"claims uid {uid!r} but belongs to uid {owner_uid}"
    if owner_name is not None and data.get(USER_KEY) != owner_name:
        return f"claims user {data.get(USER_KEY)!r} but belongs to {owner_name}"
    return None


def validate_record(data, owner_uid, file_name, owner_name=None, now=None):
    """(record, None) or (None, why it is ignored). `owner_uid`: the file's owner (lstat), and
    `owner_name` that account's name; `file_name`: its name, which repeats the uid and run id;
    `now`: the time, which `since` may not be later than. Pure."""
    match = RECORD_NAME.fullmatch(file_name)
    if not match:
        return None, "not a lease record's name"
    if not isinstance(data, dict):
        return None, "not a JSON object"

    def text(key, pattern):
        value = data.get(key)
        return value if isinstance(value, str) and pattern.fullmatch(value) else None

    def whole(value, low, high):
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        return value if ok else None

    forged = claims_owner(data, owner_uid, owner_name, match.group(1))
    if forged is not None:
        return None, forged
    uid = owner_uid
    record = {
        USER_KEY: text(USER_KEY, NAME),
        UID_KEY: uid,
        JOB_KEY: text(JOB_KEY, NAME),
        RUN_ID_KEY: text(RUN_ID_KEY, NAME),
        CONTROLLER_KEY: text(CONTROLLER_KEY, HOSTNAME),
        PID_KEY: whole(data.get(PID_KEY), 1, 2**31),
    }
    for key, value in record.items():
        if value is None:
            return None, f"{key} is missing or malformed"
    if record[RUN_ID_KEY] != match.group(2):
        return None, "its run id differs from its name's"
    record[SINCE_KEY] = moment(data.get(SINCE_KEY), now)
    if record[SINCE_KEY] is None:
        return None, f"since is missing, malformed or out of range ({data.get(SINCE_KEY)!r})"
    for key, high in ((PORTS_KEY, 65535), (GPUS_KEY, 4095)):
        values = data.get(key)
        if not isinstance(values, list) or len(values) > 1024:
            return None, f"{key} is not a list"
        if any(whole(v, 0 if key == GPUS_KEY else 1, high) is None for v in values):
            return None, f"{key} holds a value that is no {key[:-1]}"
        record[key] = sorted(set(values))
    record[SHARED_GPUS_KEY] = data.get(SHARED_GPUS_KEY) is True
    for key in (BOOT_ID_KEY, PIDNS_KEY, NETNS_KEY):  # where its keeper runs; "" from an older one
        value = data.get(key)
        record[key] = value if isinstance(value, str) and len(value) <= 64 else ""
    record[KEEPER_START_KEY] = whole(data.get(KEEPER_START_KEY), 0, 2**63)
    return record, None


def record_alive(record, here, holders_of, process_of, now):
    """Whether the record's keeper holds its leases now, as the kernel says, never a file:
    in this network namespace every resource it names is held by a claim whose holder is its
    uid and its keeper's pid (`holders_of(kind, number)`: the (pid, uid) of each holder; the
    pid is compared where it means the same process here: the keeper's pid namespace is this
    one); in another network namespace (its claims' names are not visible here) its keeper
    process is looked at (`process_of(pid)`: (uid, start time) or None) where it runs in this
    pid namespace; elsewhere the record lives while its keeper touches it (`record["touched"]`,
    RECORD_TTL). `here`: this machine's boot id, pid and network namespace. Pure."""
    boot, pidns, netns = here
    resources = [(PORTS_KEY, n) for n in record[PORTS_KEY]] + [
        (GPUS_KEY, n) for n in record[GPUS_KEY]
    ]
    if not resources:
        return False  # a keeper holds at least one claim
    if (record[BOOT_ID_KEY] and record[BOOT_ID_KEY] != boot) or (
        record[NETNS_KEY] and record[NETNS_KEY] != netns
    ):
        if record[BOOT_ID_KEY] == boot and record[PIDNS_KEY] == pidns and record[KEEPER_START_KEY]:
            return process_of(record[PID_KEY]) == (record[UID_KEY], record[KEEPER_START_KEY])
        return now - record.get(TOUCHED_KEY, 0.0) <= RECORD_TTL
    same_pids = record[KEEPER_START_KEY] is not None and record[PIDNS_KEY] == pidns
    for kind, number in resources:
        if not any(
            uid == record[UID_KEY] and (pid == record[PID_KEY] or not same_pids)
            for pid, uid in holders_of(kind, number)
        ):
            return False
    return True


def never_served(ticket, machine_gpus):
    """Why a ticket could never be served on this host (a pool asks for more GPUs than the
    host has of it: `machine_gpus`, the GPUs nvidia-smi lists, None where it cannot be
    asked), or None. Pure."""
    if machine_gpus is None:
        return None
    for pool in ticket[NEEDS_KEY][POOLS_KEY]:
        have = len(set(pool[GPUS_KEY]) & set(machine_gpus))
        if pool[COUNT_KEY] > have:
            return (f"asks for {pool[COUNT_KEY]} GPUs of a pool of which this host has {have}: "
                    "it could never be served")  # fmt: skip
    return None


def arrival_forged(ticket, started):
    """Why a ticket's arrival cannot be true (before its process started: `started`, seconds
    since the epoch, None where its process cannot be seen from here), or None. Pure."""
    if started is None or ticket[ARRIVAL_KEY] >= started - ARRIVAL_SLACK:
        return None
    return f"its arrival ({ticket[ARRIVAL_KEY]:.0f}) is before its process started ({started:.0f})"


def validate_ticket(data, owner_uid, file_name, owner_name=None, now=None):
    """(ticket, None) or (None, why it is ignored): a queued run's ticket, checked like a
    lease record (its owner is the uid and user it claims, every field what it should be, its
    times within range of `now`). Pure."""
    match = TICKET_NAME.fullmatch(file_name)
    if not match:
        return None, "not a ticket's name"
    if not isinstance(data, dict):
        return None, "not a JSON object"

    forged = claims_owner(data, owner_uid, owner_name, match.group(1))
    if forged is not None:
        return None, forged
    ticket = {UID_KEY: owner_uid}
    for key, pattern in ((USER_KEY, NAME), (JOB_KEY, NAME), (RUN_ID_KEY, NAME),
                         (CONTROLLER_KEY, HOSTNAME)):  # fmt: skip
        value = data.get(key)
        if not (isinstance(value, str) and pattern.fullmatch(value)):
            return None, f"{key} is missing or malformed"
        ticket[key] = value
    if ticket[RUN_ID_KEY] != match.group(2):
        return None, "its run id differs from its name's"
    for key in (ARRIVAL_KEY, SEEN_KEY):
        ticket[key] = moment(data.get(key), now)
        if ticket[key] is None:
            return None, f"{key} is missing, malformed or out of range ({data.get(key)!r})"
    ticket[PID_KEY] = _whole(data.get(PID_KEY), 1, 2**31)
    ticket[STARTTIME_KEY] = _whole(data.get(STARTTIME_KEY), 0, 2**63)
    if ticket[PID_KEY] is None or ticket[STARTTIME_KEY] is None:
        return None, "pid or starttime is missing or malformed"
    for key in (BOOT_ID_KEY, PIDNS_KEY):
        value = data.get(key)
        ticket[key] = value if isinstance(value, str) and len(value) <= 64 else ""
    ticket[NEEDS_KEY], why = _valid_needs(data.get(NEEDS_KEY))
    return (ticket, None) if why is None else (None, why)


def _whole(value, low, high):
    ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    return value if ok else None


def _valid_needs(needs):
    """A ticket's needs, cleaned, and None; or None and why they are refused."""
    if not isinstance(needs, dict):
        return None, "needs is not an object"
    ports, pools = needs.get(PORTS_KEY), needs.get(POOLS_KEY)
    if (
        not isinstance(ports, list)
        or len(ports) > 1024
        or any(_whole(p, 1, 65535) is None for p in ports)
    ):
        return None, "needs.ports is not a list of ports"
    if not isinstance(pools, list) or len(pools) > 1024:
        return None, "needs.pools is not a list"
    clean = []
    for pool in pools:
        gpus = pool.get(GPUS_KEY) if isinstance(pool, dict) else None
        count = _whole(pool.get(COUNT_KEY), 1, 4096) if isinstance(pool, dict) else None
        if (
            not isinstance(gpus, list)
            or count is None
            or len(gpus) > 4096
            or any(_whole(g, 0, 4095) is None for g in gpus)
        ):
            return None, "needs.pools holds an entry that is no pool of GPUs"
        if count > len(set(gpus)):
            return (
                None,
                f"asks for {count} GPUs of a pool of {len(set(gpus))}: it could never be served",
            )
        clean.append({GPUS_KEY: sorted(set(gpus)), COUNT_KEY: count})
    return {PORTS_KEY: sorted(set(ports)), POOLS_KEY: clean}, None


def needs_of(workers, pool_of):
    """What a request's workers need that another job could hold: their fixed ports and the
    GPUs of their pools (`pool_of(worker)`; a port of a range is plentiful, not queued for)."""
    ports = sorted({w[PORT_KEY] for w in workers if w.get(RANGE_KEY) is None and w.get(PORT_KEY)})
    pools = [{GPUS_KEY: sorted(set(pool_of(w))), COUNT_KEY: int(w[GPUS_KEY])}
             for w in workers if w.get(GPUS_KEY)]  # fmt: skip
    return {PORTS_KEY: ports, POOLS_KEY: pools}


def overlap(a, b):
    """The resources both needs name: (ports, GPUs). Pure."""
    ports = sorted(set(a[PORTS_KEY]) & set(b[PORTS_KEY]))
    gpus_a = {g for pool in a[POOLS_KEY] for g in pool[GPUS_KEY]}
    gpus_b = {g for pool in b[POOLS_KEY] for g in pool[GPUS_KEY]}
    return ports, sorted(gpus_a & gpus_b)


def order(ticket):
    """A ticket's place in the queue: by arrival, then user and run (one total order on every
    host, so that two runs never wait for each other)."""
    return (ticket[ARRIVAL_KEY], ticket[UID_KEY], ticket[RUN_ID_KEY])


def may_take(needs, place, tickets):
    """Whether a run needing `needs`, at `place` in the queue (order(); its arrival is now when
    it has no ticket), may take them now: (True, []) or (False, the earlier tickets that wait
    for some of them, each with what they share). `tickets`: the live ones of this host, the
    run's own among them or not. Pure."""
    ahead = []
    for ticket in sorted(tickets, key=order):
        if order(ticket) >= place:
            break
        ports, gpus = overlap(needs, ticket[NEEDS_KEY])
        if ports or gpus:
            ahead.append(dict(ticket, ports=ports, gpus=gpus))
    return not ahead, ahead


def ticket_alive(ticket, now, here, started_at):
    """Whether the ticket's controller lives: on this machine (`here`: this boot id and pid
    namespace) its process (`started_at(pid)`: its start time, None when gone) is looked at;
    else it was refreshed within TICKET_TTL seconds. Pure."""
    if ticket[BOOT_ID_KEY] and (ticket[BOOT_ID_KEY], ticket[PIDNS_KEY]) == here:
        return started_at(ticket[PID_KEY]) == ticket[STARTTIME_KEY]
    return now - ticket[SEEN_KEY] <= TICKET_TTL


def holder(live, kind, number):
    """Who holds resource `number` of `kind` ("ports", "gpus") among the live records."""
    for record in live:
        if number in record[kind]:
            return {
                k: record[k]
                for k in (USER_KEY, UID_KEY, JOB_KEY, RUN_ID_KEY, CONTROLLER_KEY, SINCE_KEY)
            }
    return None


def clash(worker, live, kind, held):
    """A worker's clash: who holds the resources it could not take (`held`), by run."""
    holders = {}
    unknown = []
    for number in held:
        holder_ = holder(live, kind, number)
        if holder_ is None:
            unknown.append(number)
            continue
        key = (holder_[UID_KEY], holder_[RUN_ID_KEY])
        entry = holders.setdefault(key, dict(holder_, ports=[], gpus=[]))
        entry[kind].append(number)
    return {
        WORKER_KEY: worker[NAME_KEY],
        KIND_KEY: kind,
        PORT_KEY: worker.get(PORT_KEY),
        RANGE_KEY: worker.get(RANGE_KEY),
        HOLDERS_KEY: list(holders.values()),
        UNKNOWN_KEY: {kind: unknown} if unknown else {},
    }


def queue_clash(ahead):
    """The earlier tickets a run waits behind, as a clash answer (kind `queue`)."""
    keys = (USER_KEY, UID_KEY, JOB_KEY, RUN_ID_KEY, CONTROLLER_KEY, ARRIVAL_KEY)
    return {WORKER_KEY: "", KIND_KEY: "queue",
            HOLDERS_KEY: [dict({k: t[k] for k in keys}, since=t[ARRIVAL_KEY], ports=t[PORTS_KEY],
                             gpus=t[GPUS_KEY]) for t in ahead]}  # fmt: skip
