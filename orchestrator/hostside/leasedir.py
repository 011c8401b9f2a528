"""The lease directory read as untrusted input: records, queue tickets and the files around
them, whoever wrote them. STANDARD LIBRARY ONLY; shipped with the lease program (leases.py).

Other users' files are opened with O_NOFOLLOW and O_NONBLOCK after an lstat, only regular files
of a bounded size and nesting; a record or ticket counts only when its owner is the uid and user
it claims, its times are within range and every field is what it should be (leasepolicy);
anything else is ignored and named (path, owner, why), never followed, and blocks nothing.
"""

import contextlib
import errno
import fcntl
import json
import os
import pwd
import stat
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator.hostside import claims, protocol, safefiles
    from orchestrator.hostside import leasepolicy as policy
else:  # shipped: hostside/bundle.py carries them in front of the lease program
    import claims  # type: ignore[no-redef]
    import leasepolicy as policy  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]

RECORD_MAX_BYTES = 64 * 1024
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Hostile(Exception):
    """A file in the lease directory that is not what orchestrate writes there."""


def ensure_dir(lease_dir):
    """The lease directory: made sticky 1777 where it is missing; accepted when it is this
    account's or root's with the sticky bit (how an admin shares one), else refused naming its
    owner. Another account's directory is never trusted: its owner may remove or rename every
    file in it, the records and queue tickets of every user."""
    with contextlib.suppress(FileExistsError):
        os.makedirs(os.path.dirname(lease_dir) or "/", exist_ok=True)
        os.mkdir(lease_dir, 0o1777)
        os.chmod(lease_dir, 0o1777)  # the umask took bits off
    info = os.lstat(lease_dir)
    if not stat.S_ISDIR(info.st_mode):
        raise protocol.Refused(f"lease_dir {lease_dir} is not a directory (a link?): choose one")
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != 0o1777:
        os.chmod(lease_dir, 0o1777)
        info = os.lstat(lease_dir)
    if info.st_uid == os.getuid() or (info.st_uid == 0 and info.st_mode & stat.S_ISVTX):
        return
    owner = safefiles.owner_name(info.st_uid)
    raise protocol.Refused(
        f"lease_dir {lease_dir} belongs to {owner}, not to you or to root "
        "with the sticky bit: its owner could remove your leases' records and queue tickets. "
        f"Ask an admin to make it shared (sudo install -d -o root -m 1777 {lease_dir}), or "
        "set lease_dir to a directory of your own"
    )


def open_lock(path):
    """An fd on an existing lock file, never through a symlink or onto a fifo or device."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Hostile("a symlink") from None
        raise Hostile(f"cannot be opened ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Hostile("not a regular file")
    return fd


def try_lock(fd, shared=False):
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise


def lock_free(path, shared_holders_count=False):
    """Whether nobody holds the lock file at `path`. A shared look by default: it never blocks
    a holder, and sees an exclusive one; `shared_holders_count` sees shared holders too."""
    try:
        fd = open_lock(path)
    except (FileNotFoundError, Hostile):
        return True
    try:
        return try_lock(fd, shared=not shared_holders_count)
    finally:
        os.close(fd)


def read_record(lease_dir, name):
    """A record file's JSON and owner, read without following a link. Raises Hostile."""
    path = os.path.join(lease_dir, name)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(info.st_mode):
        raise Hostile("not a regular file (a link, a fifo?)")
    if info.st_size > RECORD_MAX_BYTES:
        raise Hostile(f"larger than {RECORD_MAX_BYTES} bytes")
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise Hostile(f"cannot be read ({exc.strerror})") from None
    try:
        opened = os.fstat(fd)
        if (opened.st_ino, opened.st_dev) != (info.st_ino, info.st_dev):
            raise Hostile("replaced while it was read")
        raw = os.read(fd, RECORD_MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return json.loads(raw.decode("utf-8")), info.st_uid
    except (UnicodeDecodeError, ValueError):
        raise Hostile("not JSON") from None
    except RecursionError:  # json's C parser recurses: '[' * 60000 is no ValueError
        raise Hostile("JSON nested too deep") from None


def validated(lease_dir, prefix, validate):
    """Each `prefix*.json` file of the lease directory as (name, owner uid, the validated entry
    or None, why not); a missing directory has none. Files are read without following links."""
    try:
        names = sorted(os.listdir(lease_dir))
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(prefix) or not name.endswith(".json"):
            continue
        owner = None
        try:
            owner = os.lstat(os.path.join(lease_dir, name)).st_uid
            data, owner = read_record(lease_dir, name)
            if data is None:
                continue
            entry, why = validate(data, owner, name, account(owner), time.time())
        except Hostile as exc:
            entry, why = None, str(exc)
        except OSError as exc:
            entry, why = None, f"cannot be read ({exc.strerror})"
        except (TypeError, ValueError, KeyError, OverflowError, RecursionError) as exc:
            # The one place a file's content can fail a check in a way nobody foresaw: it is
            # one more file ignored and named, never an error of the whole listing.
            entry, why = None, f"not a record orchestrate writes ({type(exc).__name__})"
        yield name, owner, entry, why


def account(uid):
    """The name records and tickets of `uid` carry: its account's, else the number (a uid
    with no account, as in some containers); None for no uid."""
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def ignored_file(lease_dir, name, owner, why):
    return {policy.FILE_KEY: os.path.join(lease_dir, name), policy.OWNER_UID_KEY: owner,
            policy.OWNER_NAME_KEY: account(owner), policy.REASON_KEY: why}  # fmt: skip


def scan(lease_dir):
    """(live records with their file names, ignored files with why). A record is live while
    its keeper holds its claims, as the kernel says (policy.record_alive), never as a file
    says: records of dead keepers are stale, this account's removed, others' left alone and
    not named."""
    live, ignored = [], []
    where, now = (*here(), netns()), time.time()
    space = claims.space(lease_dir)
    names = []  # the claims bound now: listed once, at the first record that asks

    def holders_of(kind, number):
        if not names:
            names.append(claims.bound(f"{claims.PREFIX}/{space}/"))
        return claims.holders(space, kind, number, names[0])

    for name, owner, record, why in validated(lease_dir, "lease-", policy.validate_record):
        if record is None:
            ignored.append(ignored_file(lease_dir, name, owner, why))
            continue
        path = os.path.join(lease_dir, name)
        with contextlib.suppress(OSError):
            record[policy.TOUCHED_KEY] = os.lstat(path).st_mtime
        if not (
            policy.record_alive(record, where, holders_of, process_of, now)
            or _own_keeper_lives(record, where)
        ):
            if owner == os.getuid():
                for stale in (path[: -len(".json")] + ".lock", path):  # .lock: an older one's
                    with contextlib.suppress(OSError):
                        os.remove(stale)
            continue
        record[policy.FILE_KEY] = name
        live.append(record)
    return live, ignored + hostile_locks(lease_dir)


def _own_keeper_lives(record, where):
    """Whether the record is this account's and its keeper process lives (the same process:
    its start time): its claims may not answer a look in time (a neighbour floods them with
    connections), yet its record is never thrown away under it."""
    return (
        record[policy.UID_KEY] == os.getuid()
        and record[policy.KEEPER_START_KEY] is not None
        and (record[policy.BOOT_ID_KEY], record[policy.PIDNS_KEY]) == where[:2]
        and process_of(record[policy.PID_KEY])
        == (record[policy.UID_KEY], record[policy.KEEPER_START_KEY])
    )


def keeper_lives(record):
    """Whether the record's pid is its keeper still (this account's process, started when the
    keeper did): never signal a pid that came back as another process."""
    found = process_of(record[policy.PID_KEY])
    if found is None or found[0] != os.getuid():
        return False
    if record[policy.KEEPER_START_KEY] is not None:
        return found[1] == record[policy.KEEPER_START_KEY]
    lock = os.path.join(
        record[policy.LEASE_DIR_KEY], record[policy.FILE_KEY][: -len(".json")] + ".lock"
    )
    return holds_open(record[policy.PID_KEY], lock)  # an older keeper: it holds its lock file open


def holds_open(pid, path):
    """Whether process `pid` (this account's) has `path` open."""
    try:
        target = os.stat(path)
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                info = os.stat(f"/proc/{pid}/fd/{fd}")
                if (info.st_ino, info.st_dev) == (target.st_ino, target.st_dev):
                    return True
    except OSError:
        return False
    return False


def hostile_locks(lease_dir):
    """Files named like an older orchestrate's resource locks that are none (a fifo, a link, one
    nobody may open): they block nothing, and are named so that their owner can be asked."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(lease_dir)):
            if policy.LEGACY_LOCK.fullmatch(name):
                path = os.path.join(lease_dir, name)
                try:
                    os.close(open_lock(path))
                except Hostile as exc:
                    found.append(ignored_file(lease_dir, name, owner_of(path), str(exc)))
                except FileNotFoundError:
                    continue
    return found


def here():
    """This machine's boot id and this process's pid namespace: where a pid means a process."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot = handle.read().strip()
        return boot, os.readlink("/proc/self/ns/pid")
    except OSError:
        return "", ""


def netns():
    """This process's network namespace: where a claim's name means a claim."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def started_at(pid):
    """The start time (clock ticks after boot) of process `pid`, None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def process_of(pid):
    """(owner uid, start time) of process `pid` as the kernel says, None when there is none."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    start = started_at(pid)
    return None if start is None else (uid, start)


def started_epoch(ticks):
    """A process's start (`ticks` after boot) in seconds since the epoch, None if unknown."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def scan_tickets(lease_dir):
    """(live tickets with their file names, ignored files with why). Expired tickets are not
    live: this account's are removed, others' left alone and not named."""
    live, ignored = [], []
    now, where = time.time(), here()
    for name, owner, ticket, why in validated(lease_dir, "ticket-", policy.validate_ticket):
        if ticket is None:
            ignored.append(ignored_file(lease_dir, name, owner, why))
            continue
        if not policy.ticket_alive(ticket, now, where, started_at):
            if owner == os.getuid():
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(lease_dir, name))
            continue
        here_ = (
            ticket[policy.BOOT_ID_KEY]
            and (ticket[policy.BOOT_ID_KEY], ticket[policy.PIDNS_KEY]) == where
        )
        forged = policy.arrival_forged(
            ticket, started_epoch(ticket[policy.STARTTIME_KEY]) if here_ else None
        )
        if forged is not None:  # its process is seen here: alive, and started after it "arrived"
            ignored.append(ignored_file(lease_dir, name, owner, forged))
            continue
        ticket[policy.FILE_KEY] = name
        live.append(ticket)
    return sorted(live, key=policy.order), ignored


def legacy_path(lease_dir, kind, number):
    return os.path.join(lease_dir, f"{kind[:-1]}-{number}.lock")


def legacy_held(lease_dir, kind, number):
    """Whether an older orchestrate's keeper holds the resource through its lock file (leases
    were flocks on port-N.lock and gpu-N.lock before claims.py): while a host's users upgrade,
    both kinds of keeper run. Only looked at, never created nor locked for a lease."""
    return not lock_free(legacy_path(lease_dir, kind, number), shared_holders_count=True)


def owner_of(path):
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None
