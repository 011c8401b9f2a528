"""A real Slurm cluster on this machine: slurmctld here, one slurmd per network namespace.

The verified recipe (issue 13): munged runs as user munge on a private socket; the nodes live on
a private bridge (10.232.0.0/24, not tests/cluster's 10.231.0.0/24), each in its own network,
UTS and mount namespace with its own hostname and /etc/hosts, started through
`nsenter --net=... unshare --uts --mount --propagation private` (`ip netns exec` remounts /sys
and slurmd then finds no cgroup filesystem). Every daemon is a child of this process (foreground
mode), so stop() can end exactly what start() made, then delete the namespaces and the bridge.

    with SlurmCluster(Path("/tmp/x")) as cluster:
        subprocess.run(["sinfo"], env=cluster.env())

`extra=N` adds N nodes that only the ROLES_PARTITION has (it holds every node): a job of chief,
workers and ps (one task per node, as orchestrate places them) gets its four nodes there, while
the default partition keeps its two, so a job there still lands on n1 and n2.

With `login=True` a login node joins the bridge: its own network namespace (10.232.0.20) with
its own sshd, whose sessions get `SLURM_CONF` from sshd's `SetEnv`, so Slurm's commands work
there (the namespace shares this machine's files: the config, munge's socket, the "shared
disk"). `login_ssh_config` names it `slurm-login` for `ssh -F FILE slurm-login`.

`python -m tests.cluster.slurm up DIR` starts one by hand (with the login node) and waits for
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SUBNET = ipaddress.ip_network("10.232.0.0/24")
BRIDGE_ADDRESS = "10.232.0.1"
LOGIN_ADDRESS = "10.232.0.20"
LOGIN_ALIAS = "slurm-login"
PARTITION = "train"
ROLES_PARTITION = "roles"  # every node, the `extra` ones too
CONTROLLER_PORT = 6917  # not Slurm's default 6817: a system slurmctld would not clash
NODE_PORT = 6918
DAEMONS = ("munged", "slurmctld", "slurmd")


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces, munge, slurmd)"
    tools = ("ip", "nsenter", "unshare", *DAEMONS, "sbatch", "sshd", "ssh-keygen")
    missing = [t for t in tools if not _which(t)]
    if missing:
        return f"not installed: {', '.join(missing)} (scripts/ci-system-deps.sh installs them)"
    return None


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _run(argv: list[str], stdin: str | None = None) -> None:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    namespace: str
    veth: str


class SlurmCluster:
    def __init__(
        self, base_dir: Path, nodes: int = 2, prefix: str = "osl", login: bool = False,
        extra: int = 0,
    ) -> None:  # fmt: skip
        self.base = base_dir
        self.prefix = prefix
        self.login = login
        self.login_namespace = f"{prefix}-login"
        self.bridge = f"{prefix}br0"
        self.nodes = [
            Node(f"n{i}", str(SUBNET.network_address + 10 + i), f"{prefix}-n{i}", f"{prefix}v{i}")
            for i in range(1, nodes + extra + 1)
        ]
        self.partition_nodes = self.nodes[:nodes]
        self.hostname = socket.gethostname()
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        self._started_at = 0.0

    # --- paths and environment ---------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.base / "munge" / "munge.socket"

    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster (sbatch, squeue, orchestrate)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def slurmd_pid(self, node: str) -> int:
        return self._daemons[f"slurmd-{node}"].pid

    @property
    def login_dir(self) -> Path:
        return self.base / "login"

    @property
    def login_ssh_config(self) -> Path:
        """`Host slurm-login`: address, user, key and known_hosts of the login node."""
        return self.login_dir / "ssh_config"

    # --- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> SlurmCluster:
        started = time.monotonic()
        try:
            self.stop()  # leftovers of a crashed run with the same prefix
            self._prepare_files()
            self._create_network()
            self._start_munge()
            self._start_controller()
            for node in self.nodes:
                self._start_node(node)
            if self.login:
                self._start_login()
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        self._started_at = time.monotonic() - started
        return self

    @property
    def start_seconds(self) -> float:
        return self._started_at

    def stop(self) -> None:
        if "slurmctld" in self._daemons and self._daemons["slurmctld"].poll() is None:
            # Jobs a failed test left running: their slurmstepd and tasks would outlive slurmd
            # (their command lines do not name this cluster's directory).
            subprocess.run(["scancel", "--full", "--signal=KILL", "--user=root"], env=self.env(),
                           capture_output=True, timeout=30, check=False)  # fmt: skip
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self._active_jobs():
                time.sleep(0.3)
        for name in sorted(self._daemons, key=lambda n: n.startswith("munged")):
            _end(self._daemons[name])
        self._daemons.clear()
        # Daemons of an earlier, crashed session: found by their config path, never by name.
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                argv: list[str] = process.info["cmdline"] or []
                ours = any(str(self.base) in part for part in argv)
                if ours and Path(argv[0]).name in (*DAEMONS, "slurmstepd", "sshd"):
                    process.kill()
        # What still runs in the nodes: a job's slurmstepd (its argv names no path of ours) and
        # its srun and tasks outlive slurmd; they run in the nodes' namespaces, so ask those.
        for namespace in self._namespaces():
            listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                    text=True, check=False)  # fmt: skip
            for pid in listed.stdout.split():
                with contextlib.suppress(psutil.Error, ValueError):
                    psutil.Process(int(pid)).kill()
        for namespace in self._namespaces():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        # The kernel frees a deleted namespace (and the veth ends in it) later, on a busy
        # machine seconds later: delete our ends now, so a new cluster can make them again.
        for veth in self._veths():
            subprocess.run(["ip", "link", "del", veth], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)

    def _veths(self) -> list[str]:
        return [n.veth for n in self.nodes] + ([f"{self.prefix}vl"] if self.login else [])

    def _active_jobs(self) -> list[str]:
        listed = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env(), capture_output=True,
                                text=True, timeout=30, check=False)  # fmt: skip
        return listed.stdout.split()

    def _namespaces(self) -> list[str]:
        return [n.namespace for n in self.nodes] + ([self.login_namespace] if self.login else [])

    def leftovers(self) -> list[str]:
        """What stop() should have removed and did not: processes, namespaces, the bridge."""
        found = []
        for process in psutil.process_iter(["cmdline", "name"]):
            with contextlib.suppress(psutil.Error):
                cmdline = " ".join(process.info["cmdline"] or ())
                daemon = process.info["name"] in (*DAEMONS, "slurmstepd", "sshd")
                if str(self.base) in cmdline and daemon:
                    found.append(f"pid {process.pid}: {cmdline}")
        namespaces = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=False
        ).stdout
        found += [n for n in self._namespaces() if n in namespaces.split()]
        links = subprocess.run(
            ["ip", "-br", "link"], capture_output=True, text=True, check=False
        ).stdout
        names = {word.split("@")[0] for word in links.split()}
        found += [link for link in (self.bridge, *self._veths()) if link in names]
        return found

    # --- pieces --------------------------------------------------------------------------------
    def _prepare_files(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)
        (self.base / "munge").mkdir(parents=True)
        (self.base / "state").mkdir()
        for node in self.nodes:
            (self.base / f"spool-{node.name}").mkdir()
        self.base.chmod(0o755)
        key = self.base / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        shutil.chown(self.base / "munge", "munge", "munge")
        shutil.chown(key, "munge", "munge")
        hosts = ["127.0.0.1 localhost", f"{BRIDGE_ADDRESS} {self.hostname}"]
        hosts += [f"{node.address} {node.name}" for node in self.nodes]
        (self.base / "hosts").write_text("\n".join(hosts) + "\n")
        names = ",".join(node.name for node in self.partition_nodes)
        everyone = ",".join(node.name for node in self.nodes)
        cpus = os.cpu_count() or 1
        lines = [
            "ClusterName=orchestrate-test",
            f"SlurmctldHost={self.hostname}({BRIDGE_ADDRESS})",
            f"SlurmctldPort={CONTROLLER_PORT}",
            f"SlurmdPort={NODE_PORT}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # A requeued or resubmitted job would otherwise wait ~2 minutes for old credentials.
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "KillWait=5",
            "MinJobAge=600",
            "InactiveLimit=0",
            "SchedulerParameters=sched_interval=1",
            f"StateSaveLocation={self.base / 'state'}",
            f"SlurmdSpoolDir={self.base / 'spool-%n'}",
            f"SlurmctldPidFile={self.base / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.base / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.base / 'slurmctld.log'}",
            f"SlurmdLogFile={self.base / 'slurmd-%n.log'}",
            *(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN"
              for n in self.nodes),
            f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName={ROLES_PARTITION} Nodes={everyone} MaxTime=INFINITE State=UP",
        ]  # fmt: skip
        self.conf.write_text("\n".join(lines) + "\n")

    def _create_network(self) -> None:
        _run(["ip", "link", "add", "name", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", "dev", self.bridge, "up"])
        login = Node("login", LOGIN_ADDRESS, self.login_namespace, self._veths()[-1])
        for node in [*self.nodes, *([login] if self.login else [])]:
            _run(["ip", "netns", "add", node.namespace])
            peer = ["peer", "name", "eth0", "netns", node.namespace]
            _run(["ip", "link", "add", "name", node.veth, "type", "veth", *peer])
            _run(["ip", "link", "set", "dev", node.veth, "master", self.bridge, "up"])
            batch = [
                "link set dev lo up",
                f"addr add {node.address}/{SUBNET.prefixlen} dev eth0",
                "link set dev eth0 up",
            ]
            _run(["ip", "-n", node.namespace, "-batch", "-"], stdin="\n".join(batch) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.base / f"{name}.out").open("wb")
        self._daemons[name] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=self.env(), start_new_session=True,
        )  # fmt: skip
        log.close()

    def _start_munge(self) -> None:
        munge = self.base / "munge"
        self._spawn("munged", [
            "runuser", "-u", "munge", "--", _which("munged") or "munged", "--foreground",
            "--force", f"--socket={self.munge_socket}", f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ])  # fmt: skip
        _wait(self.munge_socket.exists, 10, "munged did not create its socket",
              self.base / "munged.out")  # fmt: skip

    def _start_controller(self) -> None:
        self._spawn("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-i", "-f",
                                  str(self.conf)])  # fmt: skip

    def _start_node(self, node: Node) -> None:
        # A private mount namespace for the hosts file; its own UTS namespace for the hostname.
        inner = (
            f"mount --bind {self.base / 'hosts'} /etc/hosts && hostname {node.name} && "
            f"exec {_which('slurmd')} -D -N {node.name} -f {self.conf}"
        )
        self._spawn(f"slurmd-{node.name}", [
            "nsenter", f"--net=/run/netns/{node.namespace}", "unshare", "--uts", "--mount",
            "--propagation", "private", "sh", "-c", inner,
        ])  # fmt: skip

    def _wait_idle(self) -> None:
        def idle() -> bool:
            result = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],  # a node in two partitions: two lines
                env=self.env(), capture_output=True, text=True, check=False,
            )  # fmt: skip
            states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
            return len(states) == len(self.nodes) and set(states.values()) == {"idle"}

        _wait(idle, 60, "the nodes did not become idle", self.base / "slurmctld.log")

    def _start_login(self) -> None:
        """sshd in the login node's namespace, in the foreground (a child of this process)."""
        directory = self.login_dir
        directory.mkdir()
        _keygen(directory / "host_key")
        _keygen(directory / "client_key")
        (directory / "authorized_keys").write_text((directory / "client_key.pub").read_text())
        host_key = " ".join((directory / "host_key.pub").read_text().split()[:2])
        (directory / "known_hosts").write_text(f"{LOGIN_ADDRESS} {host_key}\n")
        config = directory / f"{self.login_namespace}.sshd_config"
        lines = [
            "Port 22", f"ListenAddress {LOGIN_ADDRESS}", f"HostKey {directory / 'host_key'}",
            f"PidFile {directory / 'sshd.pid'}",
            f"AuthorizedKeysFile {directory / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "UseDNS no",
            "MaxStartups 100", "MaxSessions 100", "Subsystem sftp internal-sftp",
            # The working Slurm setup lives here, not in the controller's environment.
            f"SetEnv SLURM_CONF={self.conf}",
        ]  # fmt: skip
        config.write_text("\n".join(lines) + "\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        sshd = _which("sshd") or "/usr/sbin/sshd"
        log = str(directory / "sshd.log")
        self._spawn("sshd-login", ["ip", "netns", "exec", self.login_namespace, sshd, "-D",
                                   "-f", str(config), "-E", log])  # fmt: skip

        def answers() -> bool:
            with (
                contextlib.suppress(OSError),
                socket.create_connection((LOGIN_ADDRESS, 22), 0.5) as s,
            ):
                s.settimeout(0.5)
                return s.recv(4).startswith(b"SSH-")
            return False

        _wait(answers, 15, "the login node's sshd did not answer", directory / "sshd.log")
        self.login_ssh_config.write_text("\n".join([
            f"Host {LOGIN_ALIAS}", f"    HostName {LOGIN_ADDRESS}", "    User root",
            f"    IdentityFile {directory / 'client_key'}", "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {directory / 'known_hosts'}", "    StrictHostKeyChecking yes",
            "    BatchMode yes",
        ]) + "\n")  # fmt: skip

    def mount_private_tmpfs(self, node: str, path: str) -> None:
        """A tmpfs at `path` that only this node sees (in its mount namespace)."""
        target = str(self.slurmd_pid(node))
        _run(["nsenter", "--target", target, "--mount", "mkdir", "-p", path])
        _run(["nsenter", "--target", target, "--mount", "mount", "-t", "tmpfs", "tmpfs", path])

    def unmount(self, node: str, path: str) -> None:
        _run(["nsenter", "--target", str(self.slurmd_pid(node)), "--mount", "umount", path])


def _keygen(path: Path) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)])


def _wait(predicate: object, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    raise RuntimeError(f"{what} within {timeout:g} s; {log}:\n" + "\n".join(tail))


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


if __name__ == "__main__":
    if sys.argv[1:2] != ["up"] or len(sys.argv) != 3:
        sys.exit("usage: python -m tests.cluster.slurm up DIR")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so `with` tears the cluster down
    with SlurmCluster(Path(sys.argv[2]), login=True) as cluster:
        print(f"up in {cluster.start_seconds:.1f} s; export SLURM_CONF={cluster.conf}; login "
              f"node: ssh -F {cluster.login_ssh_config} {LOGIN_ALIAS}", flush=True)  # fmt: skip
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
