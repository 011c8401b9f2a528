"""`connection: ssh` (the default): workers run on hosts reached over SSH (Fabric).

The user's OpenSSH client configuration is honoured: `~/.ssh/config`, or the file named by
`ssh_config` (like `ssh -F FILE`). A host's `address` may be a `Host` alias of that file: the
alias is what SSH connects to (so its User, Port, IdentityFile and ProxyJump apply), and its
`HostName` becomes the address the workers use in TF_CONFIG, since the other workers cannot
resolve the alias.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.boundedread import SSH_FILE_CAP, check_regular
from orchestrator.machines.kinds.base import Kind, ReportProblem, SyncTransport
from orchestrator.machines.sshsettings import SshSettings, ssh_settings
from orchestrator.model.inventory import LoginDetails
from orchestrator.paths import controller_path
from orchestrator.values import PORT, Checker, Key, checkers, choice, integer, string

if TYPE_CHECKING:
    from orchestrator.machines.runner import Runner
    from orchestrator.model.inventory import WorkerSlot

DEFAULT_SSH_CONFIG = "~/.ssh/config"

# The SSH kind's own host keys (and `slurm.login:`'s). `ssh_host`, the alias SSH connects to when
# `address` is a Host alias of the ssh config, is derived by prepare(), never read from the file.
SSH_KEY_ENTRIES: tuple[Key, ...] = (
    Key("ssh_user", "string", "from `~/.ssh/config`",
        "the user to log in as", string),
    Key("ssh_port", "integer, 1 to 65535", "from `~/.ssh/config`, else 22",
        "the SSH port", PORT),
    Key("ssh_key", "string (a path on this machine)", "from `~/.ssh/config`, default keys",
        "the private key; an explicit key is the only one tried", string),
    Key("ssh_known_hosts", "string (a path on this machine)", "`~/.ssh/known_hosts`",
        "where host keys are checked", string),
    Key("ssh_host_key_policy", "`strict` or `accept-new`", "`strict`",
        "`strict`: an unknown key is an error; `accept-new`: record keys of new hosts. A changed "
        "key is always an error", choice("strict", "accept-new")),
    Key("ssh_connect_timeout", "integer, 1 to 600", "`10`",
        "seconds to wait for the connection", integer(1, 600)),
    Key("ssh_config", "string (a path on this machine)", "`~/.ssh/config`",
        "another OpenSSH client config file to read instead (like `ssh -F`)", string),
)  # fmt: skip


class SshKind(Kind):
    name: ClassVar[str] = "ssh"
    key_entries: ClassVar[tuple[Key, ...]] = SSH_KEY_ENTRIES
    keys: ClassVar[Mapping[str, Checker]] = checkers(SSH_KEY_ENTRIES)
    settings_type: ClassVar[type] = SshSettings
    controller_paths: ClassVar[tuple[str, ...]] = ("ssh_key", "ssh_known_hosts", "ssh_config")
    login_check: ClassVar[str | None] = "ssh"

    def prepare(self, values: dict[str, Any], problem: ReportProblem, base: Path) -> None:
        super().prepare(values, problem, base)
        for key in self.controller_paths:  # read by paramiko, whole: a fifo would block it
            given = values.get(key)
            path = controller_path(given, base) if isinstance(given, str) else None
            try:
                if path is not None and path.exists():
                    check_regular(path, SSH_FILE_CAP)
            except OSError as exc:
                problem(key, f"cannot read {path}: {exc.strerror or exc}")
                return
        if "ssh_config" in values:
            path = controller_path(values["ssh_config"], base)
            if not path.is_file():
                problem("ssh_config", f"no such file: {path}")
                return
        else:
            path = Path(DEFAULT_SSH_CONFIG).expanduser()
            if not path.is_file():
                return
        if "address" not in values:
            return
        try:
            found = ssh_config_entry(str(path), values["address"])
        except ValueError as exc:
            problem("ssh_config" if "ssh_config" in values else "address",
                    f"cannot read the ssh config {path}: {exc}")  # fmt: skip
            return
        hostname = found.get("hostname")
        if hostname and hostname != values["address"]:
            values["ssh_host"] = values["address"]
            values["address"] = hostname

    def settings(self, values: Mapping[str, Any]) -> Any:
        known = (*self.keys, "ssh_host")
        return SshSettings(**{key: values[key] for key in known if key in values})

    def machine_key(self, host: WorkerSlot) -> tuple[str, ...]:
        ssh = ssh_settings(host)
        return ("ssh", host.address, str(ssh.ssh_port or ""), ssh.ssh_user or "")

    def runner(self, host: WorkerSlot) -> Runner:
        from orchestrator.machines.ssh import (
            SshRunner,  # Fabric/paramiko load only when a host needs them
        )

        return SshRunner(host)

    def login_port(self, host: WorkerSlot) -> int | None:
        return ssh_settings(host).ssh_port or _config_port(host) or 22

    def login_details(self, host: WorkerSlot) -> LoginDetails | None:
        try:
            return resolved(host)
        except ValueError:  # an unreadable ssh config: the inventory check reported it
            return None

    def sync_transport(self, host: WorkerSlot) -> SyncTransport:
        return SyncTransport(
            shell=openssh_argv(host), target=ssh_settings(host).target or host.address
        )


def config_path(settings: SshSettings) -> str | None:
    """The ssh config file that applies to a host, if there is one."""
    path = Path(settings.ssh_config or DEFAULT_SSH_CONFIG).expanduser()
    return str(path) if path.is_file() else None


@functools.lru_cache(maxsize=64)
def _parsed_config(path: str, mtime: float) -> Any:
    import paramiko  # only inventories that meet an ssh config pay for the import

    try:
        return paramiko.SSHConfig.from_path(path)
    except (paramiko.ssh_exception.ConfigParseError, OSError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from exc


def ssh_config_entry(path: str, name: str) -> dict[str, Any]:
    """What an OpenSSH client config says about `name` (lower-case keys, like paramiko's)."""
    return dict(_parsed_config(path, Path(path).stat().st_mtime).lookup(name))


def resolved(host: WorkerSlot) -> LoginDetails:
    """The SSH user, port, key and jump host that really apply, for `orchestrate hosts`."""
    settings = ssh_settings(host)
    path = config_path(settings)
    entry = ssh_config_entry(path, settings.target or host.address) if path else {}
    keys = entry.get("identityfile") or []
    return LoginDetails(
        user=settings.ssh_user or entry.get("user"),
        port=settings.ssh_port or int(entry.get("port", 22)),
        key=settings.ssh_key or (keys[0] if keys else None),
        jump=entry.get("proxyjump"),
        alias=settings.ssh_host,
        # Where SSH connects: not the address for a Slurm task, which stands for its login node.
        hostname=entry.get("hostname") or settings.target or host.address,
    )


def _config_port(host: WorkerSlot) -> int | None:
    settings = ssh_settings(host)
    path = config_path(settings)
    if path is None:
        return None
    try:
        port = ssh_config_entry(path, settings.target or host.address).get("port")
    except ValueError:
        return None
    return int(port) if port else None


def openssh_argv(host: WorkerSlot) -> list[str]:
    """An OpenSSH `ssh` command line (without the destination) with this host's settings, so a
    tool that runs over OpenSSH (rsync's `-e`) checks host keys exactly as the runner does.

    A ProxyJump of the ssh config becomes an explicit ProxyCommand with the same host-key
    options: OpenSSH would pass only `-F` on to the jump connection, not the `-o` options.
    """
    settings = ssh_settings(host)
    path = config_path(settings)
    common = _common_options(settings, path)
    argv = ["ssh", *common]
    if settings.ssh_port:
        argv += ["-p", str(settings.ssh_port)]
    if settings.ssh_user:
        argv += ["-l", settings.ssh_user]
    if settings.ssh_key:
        argv += ["-i", str(Path(settings.ssh_key).expanduser()), "-o", "IdentitiesOnly=yes"]
    entry = ssh_config_entry(path, settings.target or host.address) if path else {}
    jump = entry.get("proxyjump")
    if jump and jump.lower() != "none":
        first, *rest = jump.split(",")
        hop = ["ssh", *common, *(["-J", ",".join(rest)] if rest else []), *_hop_args(first)]
        argv += ["-o", "ProxyCommand=" + shlex.join([*hop, "-W", "%h:%p"])]
    return argv


def _common_options(settings: SshSettings, path: str | None) -> list[str]:
    strict = "accept-new" if settings.ssh_host_key_policy == "accept-new" else "yes"
    options = ["-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={strict}",
               "-o", f"ConnectTimeout={int(settings.ssh_connect_timeout)}"]  # fmt: skip
    if settings.ssh_known_hosts:
        known = str(Path(settings.ssh_known_hosts).expanduser())
        options += ["-o", f"UserKnownHostsFile={known}"]
    return (["-F", path] if path else []) + options


def _hop_args(hop: str) -> list[str]:
    """`[user@]host[:port]` of a ProxyJump hop as ssh arguments."""
    user, _, rest = hop.rpartition("@")
    host, _, port = rest.partition(":") if rest.count(":") == 1 else (rest, "", "")
    return [*(["-l", user] if user else []), *(["-p", port] if port else []), host]


__all__ = ["ReportProblem", "SshKind", "openssh_argv", "resolved"]
