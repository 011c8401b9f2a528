"""The SSH runner: the same argument lists as the local runner, run on a host through Fabric.

Host keys are checked: Fabric alone accepts any key (it installs paramiko's AutoAddPolicy and loads
no known_hosts), so this module loads the known_hosts file and sets its own policy. Errors from
paramiko and sockets become HostError with a hint.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import shlex
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import fabric
import invoke
import paramiko

from orchestrator.errors import ConnectError, HostError
from orchestrator.machines.runner import CHUNK, CommandResult, LineReader, LineSession, Runner
from orchestrator.machines.sshsettings import SshSettings, ssh_settings
from orchestrator.model.inventory import WorkerSlot

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
COPY_CHUNK = 1 << 16


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: record keys of hosts never seen before.
    A changed key still fails: paramiko raises BadHostKeyException before asking a policy."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Append rather than rewrite: the user's file may hold hashed or commented entries.
        with self.known_hosts.open("a", encoding="utf-8") as handle:
            handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def fingerprint(key: paramiko.PKey) -> str:
    """A host key as OpenSSH shows it (ssh-keygen -l): its type and SHA256: with the unpadded
    base64 of the SHA-256 of the key blob."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class SshRunner(Runner):
    def __init__(self, host: WorkerSlot) -> None:
        super().__init__(host.name)
        self.host = host
        self.settings: SshSettings = ssh_settings(host)
        self._sftp: bool | None = None  # whether the host offers SFTP, once asked
        # Threads of one fan-out share the connection of workers on one machine (a Slurm login
        # node): two opening it at once both authenticate on one transport, and one fails.
        self._opening = threading.Lock()
        connect_kwargs: dict[str, Any] = {}
        if self.settings.ssh_key:
            # An explicit key is the only one tried, so a wrong key fails clearly.
            connect_kwargs.update(
                key_filename=[str(Path(self.settings.ssh_key).expanduser())],
                look_for_keys=False,
                allow_agent=False,
            )
        config = fabric.Config(runtime_ssh_path=self.settings.ssh_config)  # else ~/.ssh/config
        self.connection = fabric.Connection(
            self.settings.target or host.address,
            user=self.settings.ssh_user,
            port=self.settings.ssh_port,
            config=config,
            connect_timeout=int(self.settings.ssh_connect_timeout),
            connect_kwargs=connect_kwargs,
        )
        self.known_hosts = Path(
            self.settings.ssh_known_hosts
            or self.connection.ssh_config.get("userknownhostsfile", "").split(" ")[0]
            or DEFAULT_KNOWN_HOSTS
        ).expanduser()
        # Fabric builds a ProxyJump's jump hosts itself, with AutoAddPolicy: they get the same
        # host-key checking and connect timeout as the host.
        for connection in self._chain():
            self._check_host_keys(connection.client)
            connection.connect_timeout = int(self.settings.ssh_connect_timeout)

    def _chain(self) -> list[fabric.Connection]:
        chain, connection = [], self.connection
        while isinstance(connection, fabric.Connection):
            chain.append(connection)
            connection = connection.gateway
        return chain

    def _check_host_keys(self, client: paramiko.SSHClient) -> None:
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        policy: paramiko.MissingHostKeyPolicy = (
            AcceptNewPolicy(self.known_hosts)
            if self.settings.ssh_host_key_policy == "accept-new"
            else paramiko.RejectPolicy()
        )
        client.set_missing_host_key_policy(policy)

    @property
    def target(self) -> str:
        return f"{self.connection.user}@{self.host.address}:{self.connection.port}"

    def open(self) -> None:
        with self._opening:
            if not self.connection.is_connected:
                self._open()

    def _open(self) -> None:
        # The jump hosts first, from the outermost: a failure names the hop that failed.
        for jump in reversed(self._chain()[1:]):
            if jump.is_connected:
                continue
            try:
                jump.open()
            except Exception as exc:
                error = self._connect_error(exc, jump.host, f"{jump.user}@{jump.host}:{jump.port}")
                raise ConnectError(
                    self.host_name,
                    f"through jump host {jump.original_host}: {error.message.split(': ', 1)[1]}",
                    hint=error.hint,
                ) from exc
        try:
            self.connection.open()
        except paramiko.ChannelException as exc:
            jump = self._chain()[1]
            raise ConnectError(
                self.host_name,
                f"jump host {jump.original_host} could not connect to {self.target}: {exc}",
                hint="check the host's HostName/address and that the jump host can reach it",
            ) from exc
        except Exception as exc:  # every paramiko/socket failure is mapped below
            raise self._connect_error(exc) from exc

    def _connect_error(
        self, exc: Exception, address: str | None = None, target: str | None = None
    ) -> ConnectError:
        """What a failed connection means, with what to do about it."""
        address = address or self.host.address
        target = target or self.target
        return self._trust_error(exc, address, target) or self._network_error(exc, address, target)

    def _trust_error(self, exc: Exception, address: str, target: str) -> ConnectError | None:
        """Host keys and authentication: SSH reached the host and one side refused the other."""
        if isinstance(exc, paramiko.BadHostKeyException):
            return ConnectError(
                self.host_name,
                f"the host key of {address} has CHANGED since it was recorded in "
                f"{self.known_hosts} (recorded {fingerprint(exc.expected_key)}, offered "
                f"{fingerprint(exc.key)}); this can be a reinstalled host or an attack",
                hint="if the host was reinstalled, remove the old key with "
                f"'ssh-keygen -f {self.known_hosts} -R {self._known_hosts_name()}' "
                "and connect again",
            )
        if isinstance(exc, paramiko.AuthenticationException):
            key = self.settings.ssh_key or "your default keys / ssh-agent"
            return ConnectError(
                self.host_name,
                f"authentication refused for {target} with {key}",
                hint="check ssh_user and ssh_key, and that the public key is in the host's "
                "authorized_keys",
            )
        if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
            return ConnectError(
                self.host_name,
                f"the host key of {address} is unknown (not in {self.known_hosts})",
                hint=f"verify and record it with 'ssh-keyscan -p {self.connection.port} "
                f"{address} >> {self.known_hosts}', or set "
                "'ssh_host_key_policy: accept-new' to record keys of new hosts on first contact",
            )
        return None

    def _network_error(self, exc: Exception, address: str, target: str) -> ConnectError:
        """Everything before SSH itself: names, routes, refused and silent ports."""
        if isinstance(exc, socket.gaierror):
            return ConnectError(
                self.host_name,
                f"cannot resolve {address!r}: {exc.strerror}",
                hint="check the host's address in the inventory (a Host alias of your ssh "
                "config?), the ssh config file, and this machine's DNS",
            )
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            codes = {getattr(e, "errno", None) for e in exc.errors.values()}
            if errno.ECONNREFUSED in codes:
                return ConnectError(
                    self.host_name,
                    f"connection refused by {target}",
                    hint="is sshd running there, and is ssh_port right?",
                )
            return ConnectError(self.host_name, f"cannot connect to {target}: {exc}")
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return ConnectError(
                self.host_name,
                f"no answer from {target} within {self.settings.ssh_connect_timeout:g} s",
                hint="the host is down, or a firewall drops SSH packets",
            )
        if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return ConnectError(
                self.host_name,
                f"{address} is unreachable: {exc.strerror}",
                hint="check the address and this machine's routes",
            )
        if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
            return ConnectError(self.host_name, f"connection refused by {target}")
        return ConnectError(self.host_name, f"cannot connect to {target}: {exc}")

    def _known_hosts_name(self) -> str:
        port = self.connection.port
        return self.host.address if port == 22 else f"[{self.host.address}]:{port}"

    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        self.open()
        command = shlex.join(argv)  # one quoted word per argument: nothing is interpreted
        try:
            result = self.connection.run(
                command, hide=True, warn=True, pty=False, in_stream=False, timeout=timeout
            )
        except invoke.exceptions.CommandTimedOut as exc:
            raise HostError(
                self.host_name, f"'{self.describe(argv)}' did not finish within {timeout:.0f} s"
            ) from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(self.host_name, f"the SSH connection failed: {exc}") from exc
        return CommandResult(
            self.host_name, tuple(argv), result.exited, result.stdout, result.stderr
        )

    def stream(self, argv: Sequence[str]) -> Iterator[str]:
        self.open()
        transport = self.connection.client.get_transport()
        assert transport is not None
        channel = transport.open_session(timeout=self.settings.ssh_connect_timeout)
        try:
            # A pty makes sshd hang up the remote command when this channel closes; without one
            # a remote `tail -F` would outlive the controller.
            channel.get_pty()
            channel.exec_command(shlex.join(argv))
            for raw in channel.makefile("rb"):
                yield raw.decode("utf-8", "replace").rstrip("\r\n")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(self.host_name, f"the SSH connection failed: {exc}") from exc
        finally:
            channel.close()

    def session(self, argv: Sequence[str]) -> LineSession:
        self.open()
        transport = self.connection.client.get_transport()
        assert transport is not None
        try:
            channel = transport.open_session(timeout=self.settings.ssh_connect_timeout)
            channel.exec_command(shlex.join(argv))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(self.host_name, f"the SSH connection failed: {exc}") from exc
        stdin = channel.makefile_stdin("wb")
        stderr = channel.makefile_stderr("rb")

        def recv(timeout: float) -> bytes:
            channel.settimeout(timeout)  # a socket.timeout is a TimeoutError
            return bytes(channel.recv(CHUNK))

        def close(wait: bool = True) -> None:
            # End of input ends the remote program; closing the channel ends the rest. The
            # files are closed first: paramiko would flush them into a closed channel later.
            with contextlib.suppress(OSError, EOFError, ValueError, paramiko.SSHException):
                stdin.close()  # sends EOF (shutdown_write)
                deadline = time.monotonic() + 10
                while wait and not channel.exit_status_ready() and time.monotonic() < deadline:
                    time.sleep(0.01)
            with contextlib.suppress(OSError, ValueError):
                stderr.close()
            channel.close()

        return LineSession(
            self.host_name,
            stdin,
            LineReader(recv).read_line,
            close,
            lambda: bytes(stderr.read()),
            drop=lambda: close(wait=False),
        )

    def put(self, local: str, remote: str) -> None:
        self.open()
        if self._use_sftp():
            try:
                self.connection.put(local, remote)
                return
            except (OSError, paramiko.SSHException) as exc:
                raise HostError(
                    self.host_name, f"cannot upload {local} to {remote}: {exc}"
                ) from exc
        with open(local, "rb") as source:
            self._exec_copy(["sh", "-c", 'cat > "$1"', "sh", remote], source, None, remote)

    def get(self, remote: str, local: str) -> None:
        self.open()
        if self._use_sftp():
            try:
                self.connection.get(remote, local)
                return
            except (OSError, paramiko.SSHException) as exc:
                raise HostError(self.host_name, f"cannot download {remote}: {exc}") from exc
        with open(local, "wb") as target:
            self._exec_copy(["cat", remote], None, target, remote)

    def _use_sftp(self) -> bool:
        """Whether the host offers SFTP. Hardened servers drop the subsystem; then files travel
        through `cat` on an exec channel instead, over the same checked connection."""
        if self._sftp is None:
            try:
                self.connection.sftp()
                self._sftp = True
            except (paramiko.SSHException, EOFError, OSError):
                self._sftp = False
        return self._sftp

    def _exec_copy(self, argv: Sequence[str], source: Any, target: Any, remote: str) -> None:
        transport = self.connection.client.get_transport()
        assert transport is not None
        try:
            channel = transport.open_session(timeout=self.settings.ssh_connect_timeout)
            channel.exec_command(shlex.join(argv))
            if source is not None:
                while chunk := source.read(COPY_CHUNK):
                    channel.sendall(chunk)
                channel.shutdown_write()
            if target is not None:
                while chunk := channel.recv(COPY_CHUNK):
                    target.write(chunk)
            status = channel.recv_exit_status()
            error = bytes(channel.makefile_stderr("rb").read()).decode("utf-8", "replace")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(self.host_name, f"cannot copy {remote} (no SFTP): {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                channel.close()
        if status != 0:
            raise HostError(
                self.host_name,
                f"cannot copy {remote}: the host offers no SFTP subsystem and "
                f"'{' '.join(argv[:1])}' exited {status}: {error.strip()[-200:]}",
                hint="enable 'Subsystem sftp' in the host's sshd_config, or check the path",
            )

    def close(self) -> None:
        self.connection.close()
