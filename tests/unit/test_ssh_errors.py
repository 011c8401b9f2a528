"""Connection failures become HostErrors that name the host and say what to do.

Most of these are exercised against real sshd servers in tests/integration/test_ssh_hosts.py;
name resolution is tested here because a real lookup would leave the machine."""

from __future__ import annotations

import errno
import socket

import paramiko

from orchestrator.machines.ssh import SshRunner
from orchestrator.machines.sshsettings import SshSettings
from orchestrator.model.inventory import Host


def runner() -> SshRunner:
    return SshRunner(
        Host(name="gpu-a", address="gpu-a.example", port=20000, settings=SshSettings(ssh_user="me"))
    )


def test_name_resolution_failure() -> None:
    error = runner()._connect_error(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert error.message == "gpu-a: cannot resolve 'gpu-a.example': Name or service not known"
    assert "address" in (error.hint or "")


def test_unreachable_network() -> None:
    error = runner()._connect_error(OSError(errno.EHOSTUNREACH, "No route to host"))
    assert "gpu-a.example is unreachable: No route to host" in error.message


def test_refused_on_every_address() -> None:
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "refused")
    error = runner()._connect_error(
        paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.1", 22): refused})
    )
    assert error.message == "gpu-a: connection refused by me@gpu-a.example:22"
    assert "sshd" in (error.hint or "")


def test_host_keys_are_never_auto_added() -> None:
    # Fabric's own default is AutoAddPolicy; the runner must replace it.
    policy = runner().connection.client._policy
    assert isinstance(policy, paramiko.RejectPolicy)
