"""A real multi-host test cluster on one Linux machine, built from network namespaces.

Each "host" is a Linux network namespace with its own IPv4 address, its own port space, its own
iptables and its own sshd on port 22. All hosts hang off one bridge in the root namespace:

    root namespace (the controller)            namespace <tag>_h1          namespace <tag>_h2
    bridge <tag>_br 10.231.0.1/24 ──veth <tag>_1── eth0 10.231.0.11    ... eth0 10.231.0.12
                                   └──veth <tag>_2──────────────────────────┘

Network safety: the subnet 10.231.0.0/24 only exists on the bridge this module creates; the bridge
has no uplink and the namespaces have no default route, so nothing leaves the machine. `start()`
refuses to run when any interface or route already overlaps the subnet. Only one cluster can
therefore exist on a machine at a time.

Namespaces share the file system, so every host gets its own directory under `base_dir`:

    base_dir/
        client_key, client_key.pub   key the controller logs in with (root, key only)
        authorized_keys              the client public key, shared by every sshd
        known_hosts                  every host's key, for strict host-key checking
        ssh_config                   `ssh -F base_dir/ssh_config host1` works
        cluster.json                 state, so `python -m tests.cluster down` can tear it down
        host1/work/                  the host's working directory (ClusterHost.workdir)
        host1/sshd/                  host key, sshd config, pid file and log (sshd.log)

Names carry a tag `<prefix>-<pid base36><counter>` so parallel runs and leftovers of crashed runs
never collide; `cleanup_leftovers(prefix)` removes what a dead process left behind.

Needs root, iproute2 (`ip`) and openssh-server (`sshd`); no pytest import here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

SUBNET = ipaddress.IPv4Network("10.231.0.0/24")
BRIDGE_ADDRESS = ipaddress.IPv4Address("10.231.0.1")
FIRST_HOST_ADDRESS = ipaddress.IPv4Address("10.231.0.11")
MAX_HOSTS = int(SUBNET.broadcast_address) - int(FIRST_HOST_ADDRESS)  # .11 ... .254
SSH_PORT = 22
STATE_FILE = "cluster.json"
DEFAULT_PREFIX = "orch"

# Linux interface names are at most 15 characters (IFNAMSIZ - 1).
_IFNAME_MAX = 15
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
# Interfaces get "_<index>" / "_br" after the tag; "-" and "_" never occur in a prefix or in
# base36, so these patterns can't mistake one prefix's objects for another's.
_SUFFIX = r"(?P<suffix>[0-9a-z]+)"
_STARTUP_TIMEOUT_S = 15.0
_PROBE_TIMEOUT_S = 0.5
_KILL_GRACE_S = 3.0
_SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")

_cluster_counter = itertools.count()


class ClusterError(RuntimeError):
    """The cluster could not be built, used or torn down; the message says what and why."""


@dataclass
class ClusterHost:
    """One namespace host. `sshd_pid` changes when `start_sshd` restarts its server."""

    name: str
    namespace: str
    address: str
    workdir: Path
    sshd_pid: int | None
    veth: str
    sshd_dir: Path

    @property
    def sshd_config_path(self) -> Path:
        # The namespace name is in the file name so that cleanup_leftovers can recognise a
        # stray sshd by its command line even after base_dir is gone.
        return self.sshd_dir / f"{self.namespace}.sshd_config"

    @property
    def sshd_log_path(self) -> Path:
        return self.sshd_dir / "sshd.log"

    @property
    def sshd_pid_path(self) -> Path:
        return self.sshd_dir / "sshd.pid"

    @property
    def host_key_path(self) -> Path:
        return self.sshd_dir / "ssh_host_ed25519_key"


# --------------------------------------------------------------------------- tools and checks


def find_tool(name: str) -> str | None:
    """Return the absolute path of `name`; sbin dirs are searched too (sudo/CI PATHs lack them)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN_DIRS])
    return shutil.which(name, path=search)


def unavailable_reason() -> str | None:
    """Why a namespace cluster can't be built here, or None when it can."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root")
    missing = [tool for tool in ("ip", "sshd", "ssh-keygen") if find_tool(tool) is None]
    if missing:
        problems.append(f"missing {', '.join(missing)} (run scripts/ci-system-deps.sh)")
    if not problems:
        return None
    return "network-namespace cluster needs root, iproute2 and openssh-server: " + "; ".join(
        problems
    )


def _tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise ClusterError(f"{name} not found; install it with scripts/ci-system-deps.sh")
    return path


def _run(argv: Sequence[str], *, check: bool = True, stdin: str | None = None) -> str:
    """Run a command, return stdout; raise ClusterError carrying stderr when it fails."""
    result = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=60
    )
    if check and result.returncode != 0:
        raise ClusterError(
            f"command failed (exit {result.returncode}): {shlex.join(argv)}\n"
            f"{result.stderr.strip()}"
        )
    return result.stdout


def _ip_json(*args: str) -> list[dict[str, Any]]:
    # `ip -j netns list` prints nothing at all (not "[]") when there are no namespaces.
    out = _run([_tool("ip"), "-j", *args]).strip()
    return json.loads(out) if out else []


def list_namespaces() -> set[str]:
    return {entry["name"] for entry in _ip_json("netns", "list")}


def list_links() -> set[str]:
    return {entry["ifname"] for entry in _ip_json("link", "show")}


def subnet_users() -> list[str]:
    """Interfaces and routes in the root namespace that overlap SUBNET (default route excepted)."""
    users = []
    for link in _ip_json("-4", "addr", "show"):
        for info in link.get("addr_info", []):
            network = ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network
            if network.overlaps(SUBNET):
                users.append(f"address {info['local']}/{info['prefixlen']} on {link['ifname']}")
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = route.get("dst", "")
        if dst in ("", "default"):
            continue  # the default route covers everything but doesn't claim this subnet
        if ipaddress.ip_network(dst, strict=False).overlaps(SUBNET):
            users.append(f"route {dst} dev {route.get('dev', '?')} table {route.get('table', '')}")
    return users


def check_subnet_free() -> None:
    users = subnet_users()
    if users:
        raise ClusterError(
            f"{SUBNET} is already in use on this machine ({'; '.join(users)}). Another cluster "
            "(tests or `python -m tests.cluster up`) may be running: stop it with "
            "`python -m tests.cluster down --dir DIR` or `python -m tests.cluster cleanup "
            "--prefix PREFIX`; a foreign network on this range must be moved first."
        )


def _check_root_account_unlocked() -> None:
    # With UsePAM no, sshd itself refuses accounts whose shadow password starts with "!"
    # ("User root not allowed because account is locked"), even for key logins.
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == "root" and fields[1].startswith("!"):
                raise ClusterError(
                    "root's password field in /etc/shadow starts with '!', so sshd (UsePAM no) "
                    "rejects key logins as root; run scripts/ci-system-deps.sh or "
                    "`usermod -p '*' root` (still no password login)"
                )
    except OSError:
        return


def _bridge_netfilter_needs_rule() -> bool:
    """True when bridged frames pass iptables FORWARD and that chain may drop them.

    With br_netfilter loaded (Docker loads it) frames between two ports of a bridge traverse
    the root namespace's FORWARD chain, and Docker sets its policy to DROP: host-to-host
    traffic would vanish. Only then do we add one ACCEPT rule scoped to our bridge.
    """
    flag = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if not flag.exists() or flag.read_text().strip() != "1" or find_tool("iptables") is None:
        return False
    rules = _run([_tool("iptables"), "-w", "-S", "FORWARD"], check=False).split("\n")
    return [rule for rule in rules if rule.strip()] != ["-P FORWARD ACCEPT"]


# The kernel keeps ONE IPv4 neighbour (ARP) table for all network namespaces, 1024 entries at
# most by default (gc_thresh3). A full mesh of N namespace hosts needs about N·(N+1) entries
# (every host knows every other and the bridge): past ~31 hosts new entries fail ("neighbour:
# arp_cache: neighbor table overflow!" in dmesg) and connections time out as if a firewall
# dropped them. Real hosts each have their own table; only this one-machine cluster needs more.
_NEIGH_SYSCTL = Path("/proc/sys/net/ipv4/neigh/default")


def _ensure_neighbour_room(count: int) -> None:
    """Raise the shared neighbour table's limits to fit a full mesh of `count` hosts. Only ever
    raised, never restored: another cluster on the machine may rely on it meanwhile, and
    larger limits change nothing for smaller tables."""
    needed = count * (count + 1)
    for name, value in (("gc_thresh2", needed), ("gc_thresh3", 2 * needed)):
        path = _NEIGH_SYSCTL / name
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) < value:
                path.write_text(f"{value}\n")


def _forward_rule(bridge: str, tag: str) -> list[str]:
    return [
        "FORWARD",
        "-i",
        bridge,
        "-o",
        bridge,
        "-m",
        "comment",
        "--comment",
        tag,
        "-j",
        "ACCEPT",
    ]


# --------------------------------------------------------------------------- names


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
        if number == 0:
            return out


def _make_tag(prefix: str, count: int) -> str:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"prefix {prefix!r} must be 1-8 lowercase letters/digits, letter first")
    # pid in base36 plus one counter digit: unique among live processes, and the pid can be
    # read back by cleanup_leftovers to tell a crashed run's objects from a live run's.
    tag = f"{prefix}-{_base36(os.getpid())}{_base36(next(_cluster_counter) % 36)}"
    longest = f"{tag}_{count}"
    if len(longest) > _IFNAME_MAX:
        raise ValueError(
            f"interface name {longest!r} would exceed {_IFNAME_MAX} characters; "
            f"use a shorter prefix than {prefix!r}"
        )
    return tag


def _creator_pid(suffix: str) -> int:
    return int(suffix[:-1], 36) if len(suffix) > 1 else -1


# --------------------------------------------------------------------------- processes


def namespace_pids(namespace: str) -> list[int]:
    """Pids of every process whose network namespace is `namespace` (`ip netns pids`)."""
    out = _run([_tool("ip"), "netns", "pids", namespace], check=False)
    return [int(word) for word in out.split() if word.isdigit()]


def _process_or_none(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _is_dead(proc: psutil.Process | None) -> bool:
    # A zombie has released its sockets and namespaces; waiting for its reaping is pointless:
    # sshd daemons are reparented to PID 1, which may reap late (this VM: ~2 s) or never
    # (a container whose PID 1 is not an init).
    try:
        return proc is None or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_dead(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited; return those still alive after timeout_s."""
    alive = procs
    deadline = time.monotonic() + timeout_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [proc for proc in alive if not _is_dead(proc)]
    return alive


def _kill(pids: Iterable[int], grace_s: float = _KILL_GRACE_S) -> None:
    """SIGTERM, wait, then SIGKILL whatever is left; never this process itself."""
    procs = []
    for pid in set(pids) - {os.getpid()}:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    alive = _wait_dead(procs, grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    still = _wait_dead(alive, grace_s)
    if still:
        raise ClusterError(f"processes survived SIGKILL: {[p.pid for p in still]}")


def _sshd_processes(config_pattern: re.Pattern[str]) -> list[psutil.Process]:
    """Live sshd processes whose command line matches `config_pattern` (a search).

    sshd rewrites its title, so /proc/PID/cmdline of a listener is one string
    "sshd: /usr/sbin/sshd -f CONFIG -E LOG [listener] ..." rather than separate arguments.
    """
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] == "sshd" and config_pattern.search(cmdline):
            found.append(proc)
    return found


def _probe_ssh(address: str, port: int = SSH_PORT) -> bool:
    """True when address:port accepts a connection and sends an SSH banner."""
    try:
        with socket.create_connection((address, port), timeout=_PROBE_TIMEOUT_S) as conn:
            conn.settimeout(_PROBE_TIMEOUT_S)
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _port_refuses(address: str, port: int = SSH_PORT) -> bool:
    try:
        with socket.create_connection((address, port), timeout=_PROBE_TIMEOUT_S):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def _wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- the cluster


CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")


def _cpu_cgroup_of(pid: int) -> str:
    """A process's cgroup in the v1 `cpu` hierarchy ("/" at the root)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return "/"


def _remove_cgroup(group: Path, parent: Path) -> None:
    """Move what is left in `group` to `parent`, then remove it (a cgroup with tasks is busy)."""
    deadline = time.monotonic() + _KILL_GRACE_S
    while True:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it may have exited meanwhile
                (parent / "cgroup.procs").write_text(pid)
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class NamespaceCluster:
    """N namespace hosts on a bridge, each with its own sshd. Use as a context manager.

    `start()` builds everything (and removes what it built if it fails half-way); `stop()` kills
    every process inside each namespace, deletes veths, namespaces, the bridge and the optional
    iptables rule, then checks that nothing is left. `stop()` is idempotent.
    """

    def __init__(self, count: int, prefix: str = DEFAULT_PREFIX, *, base_dir: Path) -> None:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"count must be between 1 and {MAX_HOSTS}, got {count}")
        self.count = count
        self.prefix = prefix
        self.base_dir = Path(base_dir).resolve()
        self.tag = _make_tag(prefix, count)
        self.bridge = f"{self.tag}_br"
        self.hosts: list[ClusterHost] = [self._plan_host(i) for i in range(1, count + 1)]
        self.iptables_rule = False
        self._ip = ""

    def _plan_host(self, index: int) -> ClusterHost:
        name = f"host{index}"
        host_dir = self.base_dir / name
        return ClusterHost(
            name=name,
            namespace=f"{self.tag}_h{index}",
            address=str(FIRST_HOST_ADDRESS + (index - 1)),
            workdir=host_dir / "work",
            sshd_pid=None,
            veth=f"{self.tag}_{index}",
            sshd_dir=host_dir / "sshd",
        )

    # ---- paths

    @property
    def client_key_path(self) -> Path:
        return self.base_dir / "client_key"

    @property
    def authorized_keys_path(self) -> Path:
        return self.base_dir / "authorized_keys"

    @property
    def known_hosts_path(self) -> Path:
        return self.base_dir / "known_hosts"

    @property
    def ssh_config_path(self) -> Path:
        return self.base_dir / "ssh_config"

    @property
    def state_path(self) -> Path:
        return self.base_dir / STATE_FILE

    def host(self, name: str) -> ClusterHost:
        for host in self.hosts:
            if name in (host.name, host.namespace, host.address):
                return host
        raise KeyError(name)

    # ---- lifecycle

    def __enter__(self) -> NamespaceCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> NamespaceCluster:
        reason = unavailable_reason()
        if reason:
            raise ClusterError(reason)
        self._ip = _tool("ip")
        _check_root_account_unlocked()
        check_subnet_free()
        try:
            self._prepare_files()
            self._create_network()
            self._start_all_sshd()
            self._write_known_hosts()
            self._write_ssh_config()
            self.write_state()
        except BaseException:
            # Half a cluster is worse than none: remove whatever exists, then re-raise.
            self.stop(verify=False)
            raise
        return self

    def stop(self, *, verify: bool = True) -> None:
        ip = self._ip or _tool("ip")
        namespaces = list_namespaces()
        ours = [h for h in self.hosts if h.namespace in namespaces]
        # Kill first: a namespace that still holds processes outlives `ip netns del` (only its
        # name goes) and keeps its veth, and an sshd in it would keep answering.
        pids = [pid for host in ours for pid in namespace_pids(host.namespace)]
        pids += [p.pid for p in _sshd_processes(self._sshd_config_pattern())]
        kill_error: ClusterError | None = None
        try:
            _kill(pids)
        except ClusterError as exc:
            kill_error = exc  # tear down the rest anyway, report it at the end
        links = list_links()
        for host in self.hosts:
            host.sshd_pid = None
            if host.veth in links:
                # Deleting one end of a veth pair deletes the peer (eth0 in the namespace).
                _run([ip, "link", "del", host.veth], check=False)
        for host in ours:
            _run([ip, "netns", "del", host.namespace], check=False)
        for host in self.hosts:  # a cpu_quota block cut short
            group = CPU_CGROUP_ROOT / f"{host.namespace}_quota"
            if group.is_dir():
                _remove_cgroup(group, CPU_CGROUP_ROOT)
        if self.iptables_rule:
            _run(
                [_tool("iptables"), "-w", "-D", *_forward_rule(self.bridge, self.tag)], check=False
            )
            self.iptables_rule = False
        if self.bridge in links:
            _run([ip, "link", "del", self.bridge], check=False)
        self._remove_own_state()
        if verify:
            self._verify_gone()
            if kill_error is not None:
                raise kill_error

    def _remove_own_state(self) -> None:
        # base_dir may hold the state of another, running cluster (a failed second `up` in the
        # same directory): only remove the file if it describes this cluster.
        try:
            if json.loads(self.state_path.read_text()).get("tag") == self.tag:
                self.state_path.unlink()
        except (OSError, ValueError):
            return

    def _verify_gone(self) -> None:
        left = sorted(
            ({h.namespace for h in self.hosts} & list_namespaces())
            | ({self.bridge, *(h.veth for h in self.hosts)} & list_links())
        )
        left += [f"sshd pid {p.pid}" for p in _sshd_processes(self._sshd_config_pattern())]
        if left:
            raise ClusterError(f"cluster {self.tag} not fully removed: {', '.join(left)}")

    def _sshd_config_pattern(self) -> re.Pattern[str]:
        return re.compile(rf"/{re.escape(self.tag)}_h\d+\.sshd_config\b")

    # ---- building blocks

    def _prepare_files(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        # sshd's privilege-separation directory; /run is a tmpfs, so it vanishes on reboot.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        keys = [(self.client_key_path, f"client@{self.tag}")]
        for host in self.hosts:
            host.workdir.mkdir(parents=True, exist_ok=True)
            host.sshd_dir.mkdir(parents=True, exist_ok=True)
            host.sshd_log_path.unlink(missing_ok=True)
            keys.append((host.host_key_path, f"{host.name}@{self.tag}"))
        self._generate_keys(keys)
        self.authorized_keys_path.write_text(self._public_key(self.client_key_path) + "\n")

    @staticmethod
    def _generate_keys(keys: Sequence[tuple[Path, str]]) -> None:
        keygen = _tool("ssh-keygen")
        for old_key, _ in keys:
            # ssh-keygen asks "Overwrite (y/n)?" when the file exists: remove old keys first.
            old_key.unlink(missing_ok=True)
            Path(f"{old_key}.pub").unlink(missing_ok=True)
        # Generate in parallel: 17 sequential ssh-keygen runs are a noticeable part of startup.
        procs = [
            (
                path,
                subprocess.Popen(
                    [keygen, "-t", "ed25519", "-N", "", "-q", "-C", comment, "-f", str(path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
            )
            for path, comment in keys
        ]
        for path, proc in procs:
            out, _ = proc.communicate(timeout=60)
            if proc.returncode != 0:
                raise ClusterError(f"ssh-keygen failed for {path}: {out.strip()}")

    @staticmethod
    def _public_key(private_key: Path) -> str:
        return Path(f"{private_key}.pub").read_text().strip()

    def _create_network(self) -> None:
        ip = self._ip
        _run([ip, "link", "add", "name", self.bridge, "type", "bridge"])
        _run([ip, "addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", self.bridge])
        _run([ip, "link", "set", "dev", self.bridge, "up"])
        _ensure_neighbour_room(self.count)
        if _bridge_netfilter_needs_rule():
            _run([_tool("iptables"), "-w", "-I", *_forward_rule(self.bridge, self.tag)])
            self.iptables_rule = True
        for host in self.hosts:
            self._create_host_network(host)

    def _create_host_network(self, host: ClusterHost) -> None:
        ip = self._ip
        _run([ip, "netns", "add", host.namespace])
        # Create the peer directly inside the namespace as eth0: no name clash in the root
        # namespace and no window where it sits there.
        peer = ["peer", "name", "eth0", "netns", host.namespace]
        _run([ip, "link", "add", "name", host.veth, "type", "veth", *peer])
        _run([ip, "link", "set", "dev", host.veth, "master", self.bridge, "up"])
        # One `ip` process for the three in-namespace steps; lo matters too (TF and probes
        # use 127.0.0.1 inside the host). No default route: nothing may leave the subnet.
        batch = "\n".join(
            [
                "link set dev lo up",
                f"addr add {host.address}/{SUBNET.prefixlen} dev eth0",
                "link set dev eth0 up",
            ]
        )
        _run([ip, "-n", host.namespace, "-batch", "-"], stdin=batch + "\n")

    def _sshd_config_text(
        self, host: ClusterHost, extra: Sequence[str], *, sftp: bool = True
    ) -> str:
        lines = [
            f"# Generated by tests/cluster/netns.py for {host.namespace}; removed with it.",
            f"Port {SSH_PORT}",
            f"ListenAddress {host.address}",
            f"HostKey {host.host_key_path}",
            f"PidFile {host.sshd_pid_path}",
            f"AuthorizedKeysFile {self.authorized_keys_path}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # PAM would bring pam_loginuid & co, which fail in containers; no PAM, no surprises.
            "UsePAM no",
            # base_dir may live in a world-writable /tmp tree; keys there are ours anyway.
            "StrictModes no",
            # Fan-out benchmarks open many connections at once.
            "MaxStartups 100",
            "MaxSessions 100",
            "LogLevel VERBOSE",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "UseDNS no",
            # Fabric's put()/get() use SFTP; hardened servers leave the subsystem out.
            *(["Subsystem sftp internal-sftp"] if sftp else []),
            *extra,
        ]
        return "\n".join(lines) + "\n"

    def _extra_sshd_options(self, host: ClusterHost) -> list[str]:
        # OpenSSH >= 9.8 penalises sources whose connections end without authenticating
        # (our readiness probes, stop/start tests) and then refuses them for a while; every
        # connection here comes from 10.231.0.1. Turn that off where the option exists.
        host.sshd_config_path.write_text(self._sshd_config_text(host, []))
        probe = [
            _tool("sshd"),
            "-t",
            "-f",
            str(host.sshd_config_path),
            "-o",
            "PerSourcePenalties=no",
        ]
        result = subprocess.run(probe, capture_output=True, check=False, timeout=30)
        return ["PerSourcePenalties no"] if result.returncode == 0 else []

    def _start_all_sshd(self) -> None:
        extra = self._extra_sshd_options(self.hosts[0])
        for host in self.hosts:
            host.sshd_config_path.write_text(self._sshd_config_text(host, extra))
        # Launch all, then wait for all: startup time stays flat as the host count grows.
        launches = [(host, self._launch_sshd(host)) for host in self.hosts]
        for host, proc in launches:
            self._finish_sshd_start(host, proc)

    def _launch_sshd(self, host: ClusterHost) -> subprocess.Popen[str]:
        host.sshd_pid_path.unlink(missing_ok=True)
        # sshd must be started by absolute path (it re-executes itself); without -D it
        # daemonizes, so it outlives this process (the CLI's `up` exits after starting).
        argv = [_tool("sshd"), "-f", str(host.sshd_config_path), "-E", str(host.sshd_log_path)]
        return self.popen_in(
            host,
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def _finish_sshd_start(self, host: ClusterHost, proc: subprocess.Popen[str]) -> None:
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise ClusterError(
                f"sshd for {host.name} ({host.namespace}) exited {proc.returncode}: "
                f"{out.strip()}\n{_log_tail(host.sshd_log_path)}"
            )
        # The daemon binds its socket and writes the pid file after forking, so the launcher
        # returning says nothing about readiness: wait for a banner on address:22.
        if not _wait_until(lambda: _probe_ssh(host.address), _STARTUP_TIMEOUT_S):
            raise ClusterError(
                f"sshd for {host.name} at {host.address}:22 did not answer within "
                f"{_STARTUP_TIMEOUT_S:.0f}s; log {host.sshd_log_path}:\n"
                f"{_log_tail(host.sshd_log_path)}"
            )
        if not _wait_until(host.sshd_pid_path.exists, _STARTUP_TIMEOUT_S):
            raise ClusterError(f"sshd for {host.name} wrote no pid file {host.sshd_pid_path}")
        host.sshd_pid = int(host.sshd_pid_path.read_text().strip())

    def _write_known_hosts(self) -> None:
        lines = [
            # "address keytype base64": the key's comment is not part of a known_hosts entry.
            f"{host.address} {' '.join(self._public_key(host.host_key_path).split()[:2])}"
            for host in self.hosts
        ]
        self.known_hosts_path.write_text("\n".join(lines) + "\n")

    def _write_ssh_config(self) -> None:
        blocks = []
        for host in self.hosts:
            blocks.append(
                "\n".join(
                    [
                        f"Host {host.name} {host.address}",
                        f"    HostName {host.address}",
                        "    User root",
                        f"    Port {SSH_PORT}",
                        f"    IdentityFile {self.client_key_path}",
                        "    IdentitiesOnly yes",
                        f"    UserKnownHostsFile {self.known_hosts_path}",
                        "    GlobalKnownHostsFile /dev/null",
                        "    StrictHostKeyChecking yes",
                        "    BatchMode yes",
                    ]
                )
            )
        self.ssh_config_path.write_text("\n\n".join(blocks) + "\n")

    # ---- helpers for tests

    def exec_in(
        self, host: ClusterHost, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run(argv, **kwargs)` inside the host's network namespace."""
        return subprocess.run(self._netns_argv(host, argv), **kwargs)  # noqa: PLW1510

    def popen_in(
        self, host: ClusterHost, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """`subprocess.Popen(argv, **kwargs)` inside the host's network namespace.

        `ip netns exec` execs the program, so the Popen's pid is the program's own pid.
        """
        return subprocess.Popen(self._netns_argv(host, argv), **kwargs)

    def _netns_argv(self, host: ClusterHost, argv: Sequence[str]) -> list[str]:
        return [self._ip or _tool("ip"), "netns", "exec", host.namespace, *argv]

    def pids_in(self, host: ClusterHost) -> list[int]:
        return namespace_pids(host.namespace)

    def stop_sshd(self, host: ClusterHost, *, kill_sessions: bool = False) -> None:
        """Kill the host's listening sshd so port 22 refuses, like a dead ssh server.

        Open sessions survive (as with a real sshd restart) unless `kill_sessions` is set.
        """
        pattern = re.compile(rf"/{re.escape(host.namespace)}\.sshd_config\b")
        if kill_sessions:
            procs = _sshd_processes(pattern)
            pids = [p.pid for p in procs] + [c.pid for p in procs for c in p.children(True)]
        else:
            pids = [host.sshd_pid] if host.sshd_pid else []
        _kill(pids)
        host.sshd_pid = None
        if not _wait_until(lambda: _port_refuses(host.address), _STARTUP_TIMEOUT_S):
            raise ClusterError(f"{host.address}:22 still accepts connections after stop_sshd")
        self.write_state()

    def start_sshd(self, host: ClusterHost) -> None:
        """Start the host's sshd again (same config, keys and address) and wait until it answers."""
        if host.sshd_pid is not None and not _is_dead(_process_or_none(host.sshd_pid)):
            raise ClusterError(f"sshd for {host.name} is already running (pid {host.sshd_pid})")
        self._finish_sshd_start(host, self._launch_sshd(host))
        self.write_state()

    @contextlib.contextmanager
    def cpu_quota(self, host: ClusterHost, cores: float) -> Iterator[Path]:
        """Inside: every new session of the host (its sshd's new children, so everything a
        controller runs there) is limited to `cores` CPUs by a CFS quota (cgroup v1 `cpu`
        controller, `cpu.cfs_quota_us`). The host's sshd moves into a cgroup of its own and
        back when the block ends; sessions opened before keep their cgroup."""
        if host.sshd_pid is None:
            raise ClusterError(f"{host.name} has no sshd to put in a cgroup")
        root = CPU_CGROUP_ROOT
        if not (root / "cpu.cfs_quota_us").exists():
            raise ClusterError(f"no cgroup v1 cpu controller at {root} (cpu.cfs_quota_us)")
        before = _cpu_cgroup_of(host.sshd_pid)
        group = root / f"{host.namespace}_quota"
        group.mkdir(exist_ok=True)
        period = int((group / "cpu.cfs_period_us").read_text())
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(period * cores))))
        (group / "cgroup.procs").write_text(str(host.sshd_pid))
        # `ip netns exec` gave the host a /sys of its own, without the cgroup mounts a real host
        # has, so its programs could not read their limits: mount the cpu hierarchy there (in
        # the sshd's mount namespace only, which `ip netns exec` made a slave of this one).
        mount = (
            f"test -e {root}/cpu.cfs_quota_us || {{ mount -t tmpfs cgroup_root /sys/fs/cgroup"
            f" && mkdir -p {root} && mount -t cgroup -o cpu cgroup {root}; }}"
        )
        _run(["nsenter", "-t", str(host.sshd_pid), "-m", "sh", "-c", mount])
        try:
            yield group
        finally:
            (root / before.lstrip("/") / "cgroup.procs").write_text(str(host.sshd_pid))
            _remove_cgroup(group, root / before.lstrip("/"))

    def reset(self) -> None:
        """Back to what start() left, for the next user of a long-lived cluster (one per test
        session): no process in a host but its sshd, which runs its default configuration
        again (SFTP on) with no session left open, open firewalls, no traffic shaping, empty
        working directories. Keys, addresses and known_hosts stay as they are."""
        ip = self._ip or _tool("ip")
        for host in self.hosts:
            self.restart_sshd(host, sftp=True)  # kills every session and what it started
            _kill(pid for pid in self.pids_in(host) if pid != host.sshd_pid)
            flush = "".join(f"iptables -w -t {table} -F; iptables -w -t {table} -X; "
                            for table in ("filter", "nat", "mangle", "raw"))  # fmt: skip
            policies = "".join(f"iptables -w -P {chain} ACCEPT; "
                               for chain in ("INPUT", "FORWARD", "OUTPUT"))  # fmt: skip
            self.exec_in(host, ["sh", "-c", flush + policies], check=True, capture_output=True)
            # tc: "Cannot delete qdisc with handle of zero" when there is none to delete.
            _run([_tool("tc"), "qdisc", "del", "dev", host.veth, "root"], check=False)
            _run([ip, "-n", host.namespace, "link", "set", "dev", "eth0", "up"])
            shutil.rmtree(host.workdir, ignore_errors=True)
            host.workdir.mkdir(parents=True)

    def restart_sshd(self, host: ClusterHost, *, sftp: bool = True) -> None:
        """Restart the host's sshd with or without its SFTP subsystem (a hardened server)."""
        self.stop_sshd(host, kill_sessions=True)
        extra = self._extra_sshd_options(host)
        host.sshd_config_path.write_text(self._sshd_config_text(host, extra, sftp=sftp))
        self.start_sshd(host)

    def ssh_argv(self, host: ClusterHost, *command: str) -> list[str]:
        """An `ssh` command line that logs into `host` with strict host-key checking."""
        return [
            "ssh",
            "-F",
            str(self.ssh_config_path),
            f"root@{host.address}",
            *command,
        ]

    # ---- state file (lets `python -m tests.cluster down` stop a cluster later)

    def write_state(self) -> None:
        state = {
            "version": 1,
            "tag": self.tag,
            "prefix": self.prefix,
            "bridge": self.bridge,
            "iptables_rule": self.iptables_rule,
            "base_dir": str(self.base_dir),
            "hosts": [
                {
                    "name": h.name,
                    "namespace": h.namespace,
                    "address": h.address,
                    "workdir": str(h.workdir),
                    "sshd_pid": h.sshd_pid,
                    "veth": h.veth,
                    "sshd_dir": str(h.sshd_dir),
                }
                for h in self.hosts
            ],
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_path)

    @classmethod
    def from_state(cls, base_dir: Path) -> NamespaceCluster:
        """Rebuild the handle of a running cluster from base_dir/cluster.json."""
        path = Path(base_dir) / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ClusterError(f"no cluster state at {path}") from exc
        cluster = cls.__new__(cls)
        cluster.count = len(state["hosts"])
        cluster.prefix = state["prefix"]
        cluster.base_dir = Path(state["base_dir"])
        cluster.tag = state["tag"]
        cluster.bridge = state["bridge"]
        cluster.iptables_rule = state["iptables_rule"]
        cluster._ip = _tool("ip")
        cluster.hosts = [
            ClusterHost(
                name=h["name"],
                namespace=h["namespace"],
                address=h["address"],
                workdir=Path(h["workdir"]),
                sshd_pid=h["sshd_pid"],
                veth=h["veth"],
                sshd_dir=Path(h["sshd_dir"]),
            )
            for h in state["hosts"]
        ]
        return cluster


# --------------------------------------------------------------------------- leftovers


def cleanup_leftovers(prefix: str = DEFAULT_PREFIX, *, include_live: bool = False) -> list[str]:
    """Remove namespaces, veths, bridges, sshd daemons and iptables rules of crashed runs.

    Objects are recognised by their names (`<prefix>-<suffix>_...`). Objects of a cluster whose
    creating process is still alive are kept unless `include_live`: a parallel test run keeps
    its cluster. Returns what was removed.
    """
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"invalid prefix {prefix!r}")
    ip = _tool("ip")
    p = re.escape(prefix)
    ns_re = re.compile(rf"^{p}-{_SUFFIX}_h\d+$")
    link_re = re.compile(rf"^{p}-{_SUFFIX}_(?:\d+|br)$")
    sshd_re = re.compile(rf"/{p}-{_SUFFIX}_h\d+\.sshd_config\b")

    def stale(match: re.Match[str] | None) -> bool:
        if match is None:
            return False
        return include_live or not psutil.pid_exists(_creator_pid(match["suffix"]))

    removed: list[str] = []
    namespaces = [ns for ns in list_namespaces() if stale(ns_re.match(ns))]
    pids = [pid for ns in namespaces for pid in namespace_pids(ns)]
    for proc in _sshd_processes(sshd_re):
        if stale(sshd_re.search(" ".join(proc.info["cmdline"] or []))):
            pids.append(proc.pid)
    _kill(pids)
    removed += [f"pid {pid}" for pid in sorted(set(pids))]
    # Host-side veths first (their peers go with them), bridges last.
    links = sorted(
        (name for name in list_links() if stale(link_re.match(name))),
        key=lambda name: name.endswith("_br"),
    )
    for name in links:
        _run([ip, "link", "del", name], check=False)
        removed.append(f"link {name}")
    for ns in namespaces:
        _run([ip, "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    removed += _cleanup_iptables(prefix, stale)
    quota_re = re.compile(rf"^{p}-{_SUFFIX}_h\d+_quota$")  # NamespaceCluster.cpu_quota's
    for group in CPU_CGROUP_ROOT.glob(f"{prefix}-*_quota") if CPU_CGROUP_ROOT.is_dir() else ():
        if stale(quota_re.match(group.name)):
            _remove_cgroup(group, CPU_CGROUP_ROOT)
            removed.append(f"cgroup {group}")
    return removed


def _cleanup_iptables(prefix: str, stale: Any) -> list[str]:
    iptables = find_tool("iptables")
    if iptables is None:
        return []
    comment_re = re.compile(rf"^{re.escape(prefix)}-{_SUFFIX}$")
    removed = []
    for rule in _run([iptables, "-w", "-S", "FORWARD"], check=False).splitlines():
        words = shlex.split(rule)  # parses iptables' own output; nothing is run through a shell
        if words[:1] != ["-A"] or "--comment" not in words:
            continue
        comment = words[words.index("--comment") + 1]
        if stale(comment_re.match(comment)):
            _run([iptables, "-w", "-D", *words[1:]], check=False)
            removed.append(f"iptables rule {comment}")
    return removed
