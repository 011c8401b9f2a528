"""The host-side preflight probe, sent like agent.py: `python -c SOURCE`.

STANDARD LIBRARY ONLY. One process per host serves the whole check: it reads one JSON request per
line on stdin ({"verb": ..., ...}, protocol.py's serve loop, as the agent does) and answers each
with one JSON line, so the three rounds cost one process start and no new SSH command. At end of
input it stops any listener it started, so a controller that dies mid-check leaves nothing
behind. The verbs:

  inspect SPEC_JSON   Python and package versions, proxy variables, free space of directories;
                      whether the TensorFlow port is free (by binding it) and, if not, which
                      process holds it; if free, keep it as a temporary listener: a detached
                      process that accepts connections until told to stop or until its deadline
  connect SPEC_JSON   connect to every peer's port at once, each with a timeout; say how each
                      attempt ended (ok, timed out, refused, unreachable); whether a file is visible
  cleanup SPEC_JSON   stop the temporary listener (and wait until its port is released), remove
                      the shared-directory token file

`check --perf` adds three, compute, sink and send (the performance round, perfprobe.py).
"""

import errno
import os
import select
import shutil
import signal
import socket
import struct
import sys
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator import contract
    from orchestrator.hostside import perfprobe, protocol, workerpath
else:  # shipped: hostside/bundle.py carries them in front of this file's source
    import contract  # type: ignore[no-redef]
    import perfprobe  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import workerpath  # type: ignore[no-redef]

PROXY_VARIABLES = (
    "http_proxy", "https_proxy", "grpc_proxy", "no_proxy", "no_grpc_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "GRPC_PROXY", "NO_PROXY",
)  # fmt: skip


def _expand(path):
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.join(os.path.expanduser("~"), path)


def _versions(packages):
    """Installed versions, found where importlib.metadata looks (the *.dist-info and *.egg-info
    entries of each sys.path directory, the first one found winning) without importing it:
    importlib.metadata brings the email package and costs ~30 ms of CPU per host, a tenth of
    a whole check's per-host share on a loaded machine. Metadata, not `import tensorflow`:
    seconds of CPU per host saved, and enough to see what is installed and whether versions
    match across hosts."""
    wanted = {_project(name): name for name in packages}
    found = dict.fromkeys(packages)
    for directory in workerpath.worker_path():
        try:
            entries = sorted(os.listdir(directory or "."))
        except OSError:
            continue
        for entry in entries:
            stem, _, suffix = entry.rpartition(".")
            name = wanted.get(_project(stem.split("-", 1)[0]))
            if suffix not in ("dist-info", "egg-info") or name is None or found[name]:
                continue
            found[name] = _metadata_version(os.path.join(directory or ".", entry))
    return found


def _project(name):
    # PEP 503 normalization, with "_" as wheels write it in their .dist-info names
    return name.lower().replace("-", "_").replace(".", "_")


def _metadata_version(path):
    """The Version header of a METADATA / PKG-INFO file (an .egg-info may be the file itself)."""
    for name in ("METADATA", "PKG-INFO", ""):
        candidate = os.path.join(path, name) if name else path
        if not os.path.isfile(candidate):
            continue
        try:
            with open(candidate, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if not line.strip():
                        break  # the end of the headers
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip() or None
        except OSError:
            return None
    return None


def _directory(path):
    path = _expand(path)
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    usage = shutil.disk_usage(existing)
    return {
        protocol.PATH_KEY: path,
        protocol.EXISTS_KEY: os.path.isdir(path),
        protocol.WRITABLE_KEY: os.access(existing, os.W_OK | os.X_OK),
        protocol.CHECKED_KEY: existing,
        protocol.FREE_BYTES_KEY: usage.free,
    }


def _socket_inodes(port):
    """Inodes of sockets listening on `port`, from /proc/net/tcp and tcp6; with none, of those
    bound to it without listening (a squatter that took the port and sits on it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes or _bound_inodes(port)


SOCK_DIAG, SOCK_DIAG_BY_FAMILY, DUMP_REQUEST = 4, 20, 0x301  # netlink: NLM_F_REQUEST|NLM_F_DUMP
BOUND_INACTIVE = 1 << 13  # inet_diag's state of a bound socket that neither listens nor connects


def _bound_inodes(port):
    """Inodes of TCP sockets bound to `port` that do not listen: /proc/net/tcp lists none of
    them; the kernel's socket diagnostics (netlink, Linux 6.8+) do. Empty where it cannot say."""
    inodes = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, BOUND_INACTIVE)
        request += bytes(48)  # inet_diag_sockid: no filter
        try:
            with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, SOCK_DIAG) as link:
                link.settimeout(2)
                link.sendall(struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY,
                                         DUMP_REQUEST, 1, 0) + request)  # fmt: skip
                inodes.update(_diag_inodes(link, port))
        except (OSError, struct.error):
            continue
    return inodes


def _diag_inodes(link, port):
    """The inodes of the sockets on `port` in a netlink dump of inet_diag_msg records."""
    found = []
    while True:
        data, offset = link.recv(1 << 16), 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if kind in (2, 3) or length < 16:  # NLMSG_ERROR, NLMSG_DONE
                return found
            sport = struct.unpack_from("!H", data, offset + 20)[0]  # after family..retrans
            if sport == port:
                found.append(str(struct.unpack_from("=I", data, offset + 16 + 68)[0]))
            offset += (length + 3) & ~3
        if not data:
            return found


def _holder(port):
    """The process listening on `port` (or bound to it): pid, command line, and the orchestrate
    run if it is one."""
    targets = {f"socket:[{inode}]" for inode in _socket_inodes(port)}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if not any(os.readlink(f"/proc/{pid}/fd/{fd}") in targets for fd in fds):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            holder = {protocol.PID_KEY: int(pid), protocol.COMMAND_KEY: command[:300]}
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = dict(
                    item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item
                )
            for key in (contract.RUN_ID_ENV.encode(), contract.WORKER_ENV.encode()):
                if key in environ:
                    holder[key.decode().lower()] = environ[key].decode("utf-8", "replace")
            return holder
        except OSError:
            continue
    return None


def _serve(server, deadline):
    """Accept connections until the deadline; each is closed once the peer has closed it, so the
    TIME_WAIT state lands on the peer and the port is clean for the worker that binds it next."""
    clients = []
    while time.time() < deadline:
        readable, _, _ = select.select([server, *clients], [], [], 0.5)
        for sock in readable:
            if sock is server:
                clients.append(server.accept()[0])
            elif not sock.recv(64):
                clients.remove(sock)
                sock.close()
    os._exit(0)


def _start_listener(port, seconds):
    """Bind the port in a detached child; return its pid, or the errno of a failed bind."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()  # spawn point: the temporary listener, forked (no exec)
    if pid == 0:
        os.close(ready_read)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("0.0.0.0", port))  # where TensorFlow's gRPC server binds
            server.listen(128)
        except OSError as exc:
            os.write(ready_write, str(exc.errno).encode())
            os._exit(1)
        os.write(ready_write, b"0")
        os.close(ready_write)
        _serve(server, time.time() + seconds)
    os.close(ready_write)
    answer = os.read(ready_read, 16).decode() or str(errno.EIO)
    os.close(ready_read)
    if answer == "0":
        return pid, None
    os.waitpid(pid, 0)
    return None, int(answer)


LISTENERS: list = []  # the temporary listeners' pids, stopped at end of input


def _boot_id():
    """One value per booted machine: hosts that share it share CPUs, GPUs and network cards."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _name_addresses():
    """The host's name and the addresses it resolves to here, as gloo (JAX's CPU collectives)
    resolves it to pick the address it tells its peers: getaddrinfo of gethostname()."""
    name = socket.gethostname()
    try:
        found = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except OSError:
        return name, []
    return name, list(dict.fromkeys(entry[4][0] for entry in found))  # gloo takes the first


def cmd_inspect(spec):
    report = {
        protocol.PYTHON_KEY: sys.version.split()[0],
        protocol.PACKAGES_KEY: _versions(spec[protocol.PACKAGES_KEY]),
        protocol.ENV_KEY: {k: os.environ[k] for k in PROXY_VARIABLES if os.environ.get(k)},
        protocol.DIRECTORIES_KEY: [_directory(path) for path in spec[protocol.DIRECTORIES_KEY]],
    }
    pid, error = _start_listener(spec[protocol.PORT_KEY], spec[protocol.LISTEN_SECONDS_KEY])
    if pid:
        LISTENERS.append(pid)  # stopped at end of input at the latest
    report[protocol.LISTENER_PID_KEY] = pid
    report[protocol.PORT_ERROR_KEY] = os.strerror(error) if error else None
    report[protocol.HOLDER_KEY] = (
        _holder(spec[protocol.PORT_KEY]) if error == errno.EADDRINUSE else None
    )
    report[protocol.BOOT_ID_KEY] = _boot_id()
    report[protocol.HOSTNAME_KEY], report[protocol.NAME_ADDRESSES_KEY] = _name_addresses()
    token = spec.get(protocol.TOKEN_KEY)
    if token:
        try:
            os.makedirs(os.path.dirname(token), exist_ok=True)
            with open(token, "w", encoding="utf-8") as handle:
                handle.write("orchestrate shared-directory check\n")
            report["token_written"] = True
        except OSError as exc:
            report["token_written"] = False
            report["token_error"] = str(exc)
    return report


UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH)


def _outcome(code, detail, seconds):
    """A connect's end as the controller reads it: ok, refused, unreachable, error."""
    if code == 0:
        outcome = {protocol.STATUS_KEY: "ok"}
    elif code == errno.ECONNREFUSED:
        outcome = {protocol.STATUS_KEY: "refused"}
    else:
        status = "unreachable" if code in UNREACHABLE else "error"
        outcome = {protocol.STATUS_KEY: status, protocol.DETAIL_KEY: detail or os.strerror(code)}
    outcome[protocol.SECONDS_KEY] = round(seconds, 3)
    return outcome


def cmd_connect(spec):
    """Connect to every peer at once: non-blocking sockets on one selector, so a 64-host check
    (63 peers per host, 4,032 connects) starts no thread per peer."""
    import selectors

    timeout = spec[protocol.TIMEOUT_KEY]
    results = {}
    pending = selectors.DefaultSelector()
    started = time.monotonic()
    for peer in spec[protocol.PEERS_KEY]:
        name = peer[protocol.NAME_KEY]
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                peer[protocol.ADDRESS_KEY], peer[protocol.PORT_KEY], type=socket.SOCK_STREAM
            )[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:  # a name that does not resolve
            results[name] = _outcome(exc.errno or errno.EINVAL, exc.strerror or str(exc),
                                     time.monotonic() - started)  # fmt: skip
            continue
        sock.setblocking(False)
        code = sock.connect_ex(address)
        if code in (errno.EINPROGRESS, errno.EAGAIN):
            pending.register(sock, selectors.EVENT_WRITE, name)
            continue
        results[name] = _outcome(code, None, time.monotonic() - started)
        sock.close()
    deadline = started + timeout
    while pending.get_map() and time.monotonic() < deadline:
        for key, _ in pending.select(max(0.0, deadline - time.monotonic())):
            sock = key.fileobj
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            results[key.data] = _outcome(code, None, time.monotonic() - started)
            pending.unregister(sock)
            sock.close()
    for key in list(pending.get_map().values()):
        results[key.data] = {
            protocol.STATUS_KEY: "timeout",
            protocol.SECONDS_KEY: round(timeout, 3),
        }
        key.fileobj.close()
    pending.close()
    token = spec.get(protocol.TOKEN_KEY)
    return {
        protocol.PEERS_KEY: results,
        protocol.TOKEN_VISIBLE_KEY: os.path.exists(token) if token else None,
    }


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmd_cleanup(spec):
    pid = spec.get(protocol.LISTENER_PID_KEY)
    if pid and _alive(pid):
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    token = spec.get(protocol.TOKEN_KEY)
    if token and os.path.exists(token):
        os.remove(token)
    return {"listener_left": bool(pid) and _alive(pid)}


VERBS = {protocol.INSPECT: cmd_inspect, protocol.CONNECT: cmd_connect,
         protocol.CLEANUP: cmd_cleanup, protocol.COMPUTE: perfprobe.cmd_compute,
         protocol.SINK: perfprobe.cmd_sink, protocol.SEND: perfprobe.cmd_send}  # fmt: skip


def serve(lines, out):
    protocol.serve(lines, out, VERBS)
    for pid in LISTENERS:  # end of input: the controller is done, or gone
        cmd_cleanup({protocol.LISTENER_PID_KEY: pid})
    for server in perfprobe.SINKS:
        server.close()
    perfprobe.stop_computer()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
