"""A lease's hold on one port or GPU: an abstract Unix socket bound under a name of its lease
directory and resource. STANDARD LIBRARY ONLY, Linux; shipped with the lease program.

Why a socket and not a lock file: a lock file lives in a directory every user writes to. A
neighbour who owns the file (one they created before the victim's keeper locked it) may delete
or rename it while the keeper holds its flock, and the next taker locks a new file under the
old name: two holders of one GPU. An abstract socket's name is no file: it exists exactly while
a process holds the socket, nobody can remove, rename or replace it, and the kernel frees it
when the holder dies. So whatever files anyone creates, deletes or renames in the lease
directory, two keepers never hold the same name.

The exclusive holder of a resource binds its name. A keeper that shares a GPU (`share: true`)
binds a name of its own below it (`.../gpu-1/share/UID-TOKEN`); each side looks for the other
after binding its own, so of two takers at the same moment at least one sees the other and
backs off. Names are per network namespace: a host is one (a container with a network of its
own is a host of its own), and per lease directory (its real path's hash).
"""

import hashlib
import os
import socket
import struct

PREFIX = "orchestrate-lease"
BACKLOG = 64  # a keeper listens, so that anyone may ask it who it is (SO_PEERCRED); it
# accepts and closes each look at once, so that looks never fill the queue
PEERCRED = struct.Struct("3i")  # pid, uid, gid
LISTING = "/proc/net/unix"  # every bound name of this network namespace, readable by anyone


def space(lease_dir):
    """The names of one lease directory: its real path's digest (two spellings, one space)."""
    real = os.path.realpath(lease_dir)
    return hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def name(where, kind, number):
    """The exclusive name of resource `number` of `kind` ("ports", "gpus")."""
    return f"{PREFIX}/{where}/{kind[:-1]}-{int(number)}"


def bound(prefix):
    """The abstract names bound now that start with `prefix`."""
    found = set()
    with open(LISTING, encoding="utf-8", errors="replace") as listing:
        for line in listing:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("@" + prefix):
                found.add(fields[7][1:])
    return found


def _bind(address):
    """A listening socket bound to the abstract `address`, or None where it is taken."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind("\0" + address)
        sock.listen(BACKLOG)
        return sock
    except OSError:
        sock.close()
        return None


def claim(where, kind, number, shared=False):
    """A socket that holds the resource for this process (and its children), or None where
    another holder may not share it."""
    exclusive = name(where, kind, number)
    if shared:
        sock = _bind(f"{exclusive}/share/{os.getuid()}-{os.urandom(6).hex()}")
        taken = sock is None or exclusive in bound(exclusive)
    else:
        sock = _bind(exclusive)
        taken = sock is None or bool(bound(exclusive + "/share/"))
    if taken and sock is not None:
        sock.close()
        return None
    return sock


def peer(address):
    """(pid, uid) of the process that listens on the abstract `address`, as the kernel says
    (SO_PEERCRED: the last process to call listen on it; pid 0 where it is in a pid namespace
    this one cannot see); None where nobody holds the name or it does not answer."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(1.0)
    try:
        probe.connect("\0" + address)
        pid, uid, _gid = PEERCRED.unpack(
            probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
        )
        return pid, uid
    except OSError:
        return None
    finally:
        probe.close()


def holder_uid(where, kind, number):
    """The uid of the process that holds the resource's exclusive name, where it answers
    (a keeper listens); None where it does not, or nobody holds it."""
    found = peer(name(where, kind, number))
    return None if found is None else found[1]


def holders(where, kind, number, names=None):
    """Every (pid, uid) that holds the resource now: its exclusive holder, or its sharers
    (each answers for itself: the uid its name says is never trusted). `names`: the names
    bound now, where the caller listed them once (bound()) for many resources."""
    exclusive = name(where, kind, number)
    below = exclusive + "/share/"
    sharers = [n for n in (bound(below) if names is None else names) if n.startswith(below)]
    found = [peer(exclusive)] + [peer(shared) for shared in sorted(sharers)]
    return [held for held in found if held is not None]


def answer_as_keeper(sock):
    """Make the calling process the one a claim's holder answers as (listen again: the kernel
    records the caller's credentials); the keeper calls it on the claims it inherited."""
    sock.listen(BACKLOG)


def turn_away(sock):
    """Accept and close one pending look at a held claim (a keeper's loop does, so that looks
    never fill its backlog)."""
    try:
        conn, _ = sock.accept()
        conn.close()
    except OSError:
        pass


def sharer_uids(where, kind, number):
    """The uids the shared holders' names say (a name is no proof: shown, never trusted)."""
    below = name(where, kind, number) + "/share/"
    uids = set()
    for found in bound(below):
        text = found[len(below) :].split("-", 1)[0]
        if text.isdigit():
            uids.add(int(text))
    return sorted(uids)
