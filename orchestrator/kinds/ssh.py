"""`connection: ssh` (the default): workers run on hosts reached over SSH (Fabric)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from orchestrator.kinds.base import Kind
from orchestrator.values import PORT, Checker, choice, integer, string

if TYPE_CHECKING:
    from orchestrator.inventory import Host
    from orchestrator.runner import Runner


@dataclass(frozen=True)
class SshSettings:
    ssh_user: str | None = None
    ssh_port: int | None = None
    ssh_key: str | None = None
    ssh_known_hosts: str | None = None
    ssh_host_key_policy: Literal["strict", "accept-new"] = "strict"
    ssh_connect_timeout: float = 10.0


class SshKind(Kind):
    name: ClassVar[str] = "ssh"
    keys: ClassVar[Mapping[str, Checker]] = {
        "ssh_user": string,
        "ssh_port": PORT,
        "ssh_key": string,
        "ssh_known_hosts": string,
        "ssh_host_key_policy": choice("strict", "accept-new"),
        "ssh_connect_timeout": integer(1, 600),
    }
    settings_type: ClassVar[type] = SshSettings
    controller_paths: ClassVar[tuple[str, ...]] = ("ssh_key", "ssh_known_hosts")
    login_check: ClassVar[str | None] = "ssh"

    def machine_key(self, host: Host) -> tuple[str, ...]:
        ssh: SshSettings = host.settings
        return ("ssh", host.address, str(ssh.ssh_port or ""), ssh.ssh_user or "")

    def runner(self, host: Host) -> Runner:
        from orchestrator.ssh import SshRunner  # Fabric/paramiko load only when a host needs them

        return SshRunner(host)

    def login_port(self, host: Host) -> int | None:
        return host.settings.ssh_port or 22
