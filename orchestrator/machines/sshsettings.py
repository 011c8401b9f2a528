"""The SSH kind's settings of a host: plain data, shared by the kind (kinds/ssh.py) and the
Fabric runner (ssh.py) without either importing the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from orchestrator.model.inventory import KindSettings, WorkerSlot


@dataclass(frozen=True)
class SshSettings(KindSettings):
    ssh_user: str | None = None
    ssh_port: int | None = None
    ssh_key: str | None = None
    ssh_known_hosts: str | None = None
    ssh_host_key_policy: Literal["strict", "accept-new"] = "strict"
    ssh_connect_timeout: float = 10.0
    ssh_config: str | None = None  # an OpenSSH client config file instead of ~/.ssh/config
    ssh_host: str | None = None  # the ssh config alias the inventory named (address: its HostName)

    @property
    def target(self) -> str | None:
        """The name SSH connects to and looks up in the ssh config, when not the address."""
        return self.ssh_host


def ssh_settings(host: WorkerSlot) -> SshSettings:
    """The host's SSH settings; the defaults for a host made without any (in code, not read
    from an inventory)."""
    return host.settings if isinstance(host.settings, SshSettings) else SshSettings()
