"""Connection failures become HostErrors that name the host and say what to do.

Most of these are exercised against real sshd servers in tests/integration/test_ssh_hosts.py;
name resolution is tested here because a real lookup would leave the machine."""

from __future__ import annotations

import base64
import errno
import hashlib
import shutil
import socket
import subprocess

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.machines.ssh import SshRunner, fingerprint
from orchestrator.machines.sshsettings import SshSettings
from orchestrator.model.inventory import WorkerSlot


def runner() -> SshRunner:
    return SshRunner(
        WorkerSlot(
            name="gpu-a", address="gpu-a.example", port=20000, settings=SshSettings(ssh_user="me")
        )
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


def ed25519_public_line() -> str:
    """A fresh Ed25519 public key as a known_hosts / .pub line: `ssh-ed25519 BASE64`."""
    return (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def openssh_fingerprint(line: str) -> str:
    """What `ssh-keygen -l` prints for the key, computed here from the line's blob."""
    digest = hashlib.sha256(base64.b64decode(line.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def test_changed_host_key_shows_both_fingerprints() -> None:
    recorded_line, offered_line = ed25519_public_line(), ed25519_public_line()
    recorded = paramiko.Ed25519Key(data=base64.b64decode(recorded_line.split()[1]))
    offered = paramiko.Ed25519Key(data=base64.b64decode(offered_line.split()[1]))
    exc = paramiko.BadHostKeyException("gpu-a.example", offered, recorded)
    error = runner()._connect_error(exc)
    old, new = openssh_fingerprint(recorded_line), openssh_fingerprint(offered_line)
    assert old != new and "=" not in old + new
    assert "gpu-a: the host key of gpu-a.example has CHANGED" in error.message
    assert f"(recorded ssh-ed25519 {old}, offered ssh-ed25519 {new})" in error.message
    assert "ssh-keygen" in (error.hint or "") and "-R gpu-a.example" in (error.hint or "")


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen (openssh-client)")
def test_fingerprint_is_the_one_ssh_keygen_prints() -> None:
    line = ed25519_public_line()
    key = paramiko.Ed25519Key(data=base64.b64decode(line.split()[1]))
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", "-"],
        input=line + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert fingerprint(key) == f"ssh-ed25519 {listed[1]}"
