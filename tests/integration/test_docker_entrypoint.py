"""docker/entrypoint.sh, run directly on this machine instead of in a container.

No Docker engine runs on the development machines, so the image's entry point is tested as a
plain process: the same script, with its paths and port pointed at temporary directories and a
free port on 127.0.0.1 through its environment variables. It starts a real sshd; a paramiko
client (what orchestrate uses) logs in with a key, password login is refused, and stopping the
process stops sshd. Only ever 127.0.0.1.

Starting sshd needs root and /usr/sbin/sshd (CI runs as root after scripts/ci-system-deps.sh);
without them those tests skip. The checks that the script refuses to start run anywhere.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
MAKE_CLIENT_KEY = REPO / "docker" / "make-client-key.sh"
SSHD = Path("/usr/sbin/sshd")
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 10.0


def _sshd_unavailable() -> str | None:
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root")
    if not SSHD.exists():
        problems.append(f"no {SSHD}")
    if shutil.which("ssh-keygen") is None:
        problems.append("no ssh-keygen")
    if not problems:
        return None
    return (
        "starting the entry point's sshd needs root and openssh-server "
        f"(scripts/ci-system-deps.sh): {'; '.join(problems)}"
    )


def _root_locked() -> bool:
    # With UsePAM no, sshd refuses key logins to an account whose password field starts with
    # '!'; the entry point then refuses to start. scripts/ci-system-deps.sh unlocks root ('*').
    with contextlib.suppress(OSError):
        for line in Path("/etc/shadow").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == "root":
                return fields[1].startswith("!")
    return False


requires_sshd = pytest.mark.skipif(_sshd_unavailable() is not None, reason=str(_sshd_unavailable()))


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def ssh_banner(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5) as conn:
            conn.settimeout(0.5)
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def refuses(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return False
    except ConnectionRefusedError:
        return True


def strict_modes_ok(path: Path) -> bool:
    """sshd's StrictModes walk: every directory up to / root-owned, not group/world-writable."""
    for directory in (path, *path.parents):
        info = directory.stat()
        if info.st_uid != 0 or info.st_mode & 0o022:
            return False
    return True


def run_entrypoint(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def base_env(**settings: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin", "LANG": "C"}
    env.update(settings)
    return env


@dataclass
class Setup:
    """Everything one entry-point run needs, in temporary directories."""

    base: Path  # StrictModes-clean: holds SSHD_CONFIG_DIR
    tmp: Path
    client_key: Path
    port: int

    @property
    def host_key_dir(self) -> Path:
        return self.tmp / "host-keys"

    @property
    def config_dir(self) -> Path:
        return self.base / "sshd"

    def env(self, user: str, **extra: str) -> dict[str, str]:
        return base_env(
            SSH_USER=user,
            SSHD_PORT=str(self.port),
            SSHD_LISTEN_ADDRESS=LOOPBACK,
            SSHD_CONFIG_DIR=str(self.config_dir),
            SSHD_HOST_KEY_DIR=str(self.host_key_dir),
            WORK_DIR=str(self.tmp / "work"),
            AUTHORIZED_KEYS_FILE=str(self.client_key) + ".pub",
            **extra,
        )


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    reason = _sshd_unavailable()
    if reason:
        pytest.skip(reason)
    # SSHD_CONFIG_DIR holds authorized_keys, which sshd's StrictModes only reads when no
    # directory above it is group/world-writable: /tmp (pytest's tmp_path) is. /run is root's.
    parent = Path("/run")
    if not strict_modes_ok(parent):
        pytest.skip(f"{parent} is not root-owned and closed to others; sshd's StrictModes")
    base = Path(tempfile.mkdtemp(prefix="orch-entrypoint-", dir=parent))
    try:
        key = tmp_path / "client_key"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test-client", "-f", str(key)],
            check=True,
            timeout=30,
        )
        yield Setup(base=base, tmp=tmp_path, client_key=key, port=free_port())
    finally:
        shutil.rmtree(base, ignore_errors=True)


def exited(pid: int) -> bool:
    """True once the child has exited, leaving it unreaped: its pid still names its group."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


@contextlib.contextmanager
def running(argv: list[str], env: dict[str, str], log: Path, port: int) -> Iterator[int]:
    """Start the entry point, wait for sshd's banner, yield its pid; always stop it."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ssh_banner(port):
            if exited(proc.pid) or time.monotonic() > deadline:
                raise AssertionError(f"no SSH banner on {LOOPBACK}:{port}:\n{log.read_text()}")
            time.sleep(0.05)
        yield proc.pid
        # The script exec'd sshd -D: the process started is sshd, and SIGTERM ends it.
        proc.terminate()
        deadline = time.monotonic() + 10
        while not exited(proc.pid):
            assert time.monotonic() < deadline, "sshd ignored SIGTERM"
            time.sleep(0.05)
        assert refuses(port), f"something still listens on {LOOPBACK}:{port}"
    finally:
        # Kill what is left of the session this test started: a running sshd after a failure,
        # or one that outlived the script because it was not exec'd. The leader is not reaped
        # yet, so its pid still names this process group and no other.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def connect(port: int) -> paramiko.Transport:
    transport = paramiko.Transport(socket.create_connection((LOOPBACK, port), timeout=5))
    transport.start_client(timeout=5)
    return transport


def run_command(transport: paramiko.Transport, command: str) -> str:
    channel = transport.open_session(timeout=5)
    channel.settimeout(10)
    channel.exec_command(command)
    output = channel.makefile("r").read().decode()
    assert channel.recv_exit_status() == 0, output
    channel.close()
    return output


def host_key_of(setup: Setup) -> str:
    return (setup.host_key_dir / "ssh_host_ed25519_key.pub").read_text().split()[1]


def assert_key_only_login(setup: Setup, user: str) -> str:
    """Key login works, nothing but publickey is offered, a password is refused; the output."""
    key = paramiko.Ed25519Key.from_private_key_file(str(setup.client_key))
    transport = connect(setup.port)
    try:
        # The server presents the key the entry point created in SSHD_HOST_KEY_DIR.
        assert transport.get_remote_server_key().get_base64() == host_key_of(setup)
        with pytest.raises(paramiko.BadAuthenticationType) as offered:
            transport.auth_none(user)
        assert offered.value.allowed_types == ["publickey"]
        with pytest.raises(paramiko.AuthenticationException):
            transport.auth_password(user, "any password")
        assert transport.auth_publickey(user, key) == []  # [] = fully authenticated
        return run_command(transport, "echo ok; id -un")
    finally:
        transport.close()


# --------------------------------------------------------------------------- sshd runs


@requires_sshd
def test_root_key_login_and_stop(setup: Setup) -> None:
    if _root_locked():
        pytest.skip(
            "root's password field in /etc/shadow starts with '!': sshd (UsePAM no) refuses its "
            "key logins; scripts/ci-system-deps.sh unlocks it with usermod -p '*' root"
        )
    env = setup.env("root")
    with running(["sh", str(ENTRYPOINT)], env, setup.tmp / "sshd.log", setup.port):
        assert assert_key_only_login(setup, "root") == "ok\nroot\n"
    log = (setup.tmp / "sshd.log").read_text()
    assert "created host key" in log
    assert "Accepted publickey for root" in log
    config = (setup.config_dir / "sshd_config").read_text()
    for line in ("PasswordAuthentication no", "PermitRootLogin prohibit-password", "UsePAM no"):
        assert f"\n{line}\n" in config
    assert stat.S_IMODE((setup.host_key_dir / "ssh_host_ed25519_key").stat().st_mode) == 0o600
    assert (setup.tmp / "work").is_dir()

    # A second start (a recreated container on the same volume) keeps the host key.
    first_key = host_key_of(setup)
    with running(["sh", str(ENTRYPOINT)], env, setup.tmp / "sshd2.log", setup.port):
        transport = connect(setup.port)
        try:
            assert transport.get_remote_server_key().get_base64() == first_key
        finally:
            transport.close()
    assert "created host key" not in (setup.tmp / "sshd2.log").read_text()


def _unused_uid() -> int:
    for uid in range(64100, 64900):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no free uid in 64100..64899")


def _copy_etc(destination: Path) -> None:
    # useradd and userdel leave and remove lock and backup files in /etc: a copy taken at that
    # moment fails on a file that vanished under it, and the next one finds /etc settled.
    for _ in range(5):
        if subprocess.run(["cp", "-a", "/etc", str(destination)], check=False).returncode == 0:
            return
        shutil.rmtree(destination, ignore_errors=True)
        time.sleep(0.2)
    raise AssertionError("could not copy /etc: it kept changing under the copy")


def with_test_user(setup: Setup, user: str, password_field: str) -> tuple[list[str], Path, int]:
    """An argv running the entry point in a private mount namespace where `user` exists.

    A copy of /etc with the user added to passwd, shadow and group is bind-mounted over /etc
    inside that namespace only: the machine's accounts stay untouched. The whole directory, not
    the three files: a file's bind mount leaves the namespace when the host replaces that file,
    as useradd and userdel do by renaming, and the namespace sees the host's passwd again (a
    test beside this one adding its own user made `id -un` fail here).
    """
    uid = _unused_uid()
    home = setup.base / "home"
    home.mkdir()
    files = setup.base / "accounts"
    files.mkdir(mode=0o700)  # the shadow copy holds the machine's password hashes
    etc = files / "etc"
    _copy_etc(etc)
    entries = {
        "passwd": f"{user}:x:{uid}:{uid}:orchestrate test:{home}:/bin/sh\n",
        "shadow": f"{user}:{password_field}:19000:0:99999:7:::\n",
        "group": f"{user}:x:{uid}:\n",
    }
    for name, entry in entries.items():
        with (etc / name).open("a") as copy:
            copy.write(entry)
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind {etc} /etc && exec sh "$0"', str(ENTRYPOINT)]  # fmt: skip
    return argv, home, uid


@pytest.fixture
def unshare_available() -> None:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount (util-linux, mount) for a private mount namespace")


@requires_sshd
@pytest.mark.usefixtures("unshare_available")
def test_non_root_user_like_the_image(setup: Setup) -> None:
    user = "orchtestuser"
    argv, home, uid = with_test_user(setup, user, "*")
    # The user reads authorized_keys under SSHD_CONFIG_DIR, below the private base directory.
    setup.base.chmod(0o755)
    # The key comes from AUTHORIZED_KEYS this time; WORK_DIR defaults to ~user/orchestrate.
    env = setup.env(user, AUTHORIZED_KEYS=(setup.client_key.with_suffix(".pub")).read_text())
    env["AUTHORIZED_KEYS_FILE"] = str(setup.tmp / "absent")
    del env["WORK_DIR"]
    with running(argv, env, setup.tmp / "sshd.log", setup.port):
        assert assert_key_only_login(setup, user) == f"ok\n{user}\n"
        # Only that user: root is refused even with the right key.
        key = paramiko.Ed25519Key.from_private_key_file(str(setup.client_key))
        transport = connect(setup.port)
        try:
            with pytest.raises(paramiko.AuthenticationException):
                transport.auth_publickey("root", key)
        finally:
            transport.close()
    work = home / "orchestrate"
    assert work.is_dir()
    assert work.stat().st_uid == uid, "WORK_DIR is handed to the login user"
    assert "\nPermitRootLogin no\n" in (setup.config_dir / "sshd_config").read_text()
    assert f"AllowUsers {user}" in (setup.config_dir / "sshd_config").read_text()


@requires_sshd
@pytest.mark.usefixtures("unshare_available")
def test_locked_account_is_refused(setup: Setup) -> None:
    argv, _, _ = with_test_user(setup, "orchlocked", "!")
    result = subprocess.run(
        argv, env=setup.env("orchlocked"), capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "orchlocked is locked" in result.stderr
    assert "usermod -p '*' orchlocked" in result.stderr
    assert refuses(setup.port)


# --------------------------------------------------------------------------- refusals (anywhere)


def _refusal_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    defaults = {
        "SSHD_PORT": str(free_port()),
        "SSHD_LISTEN_ADDRESS": LOOPBACK,
        "SSHD_CONFIG_DIR": str(tmp_path / "sshd"),
        "SSHD_HOST_KEY_DIR": str(tmp_path / "host-keys"),
        "WORK_DIR": str(tmp_path / "work"),
    }
    return base_env(**{**defaults, **settings})


def test_refuses_to_start_without_an_authorized_key(tmp_path: Path) -> None:
    env = _refusal_env(tmp_path, AUTHORIZED_KEYS_FILE=str(tmp_path / "missing.pub"))
    result = run_entrypoint(env)
    assert result.returncode == 2
    assert "no authorized key" in result.stderr
    assert "make-client-key.sh" in result.stderr
    assert "AUTHORIZED_KEYS" in result.stderr
    assert not (tmp_path / "sshd").exists(), "nothing is written before the checks pass"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("# only a comment\n\n", "no authorized key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaA==\n", "PRIVATE key"),
        ("ssh-ed25519 not-base64 someone\n", "line 1 is not a public key"),
    ],
)
def test_refuses_bad_authorized_keys(tmp_path: Path, content: str, message: str) -> None:
    if shutil.which("ssh-keygen") is None and "line 1" in message:
        pytest.skip("needs ssh-keygen to validate key lines")
    keys = tmp_path / "authorized_keys"
    keys.write_text(content)
    result = run_entrypoint(_refusal_env(tmp_path, AUTHORIZED_KEYS_FILE=str(keys)))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_refuses_a_directory_where_the_key_file_should_be(tmp_path: Path) -> None:
    # What Docker leaves when a bind-mounted file is missing on the host.
    (tmp_path / "client_key.pub").mkdir()
    env = _refusal_env(tmp_path, AUTHORIZED_KEYS_FILE=str(tmp_path / "client_key.pub"))
    result = run_entrypoint(env)
    assert result.returncode == 2
    assert "is a directory" in result.stderr


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("SSHD_PORT", "70000", "not between 1 and 65535"),
        ("SSHD_PORT", "22x", "not a port number"),
        ("SSH_USER", "a b", "not a plain user name"),
        ("SSHD_CONFIG_DIR", "/tmp/with space", "without spaces"),
        ("SSHD_HOST_KEY_DIR", "relative", "absolute path"),
    ],
)
def test_refuses_bad_settings(tmp_path: Path, setting: str, value: str, message: str) -> None:
    result = run_entrypoint(_refusal_env(tmp_path, **{setting: value}))
    assert result.returncode == 2
    assert message in result.stderr


def test_arguments_run_instead_of_sshd(tmp_path: Path) -> None:
    result = run_entrypoint(_refusal_env(tmp_path), "echo", "hello from the image")
    assert (result.returncode, result.stdout) == (0, "hello from the image\n")


# --------------------------------------------------------------------------- make-client-key.sh


def test_make_client_key_creates_once(tmp_path: Path) -> None:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs ssh-keygen")
    script = tmp_path / "make-client-key.sh"  # it writes next to itself
    shutil.copy(MAKE_CLIENT_KEY, script)
    first = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    private, public = tmp_path / "client_key", tmp_path / "client_key.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert public.read_text().startswith("ssh-ed25519 ")
    before = private.read_bytes()
    again = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=False)
    assert again.returncode == 0
    assert "keeping" in again.stdout
    assert private.read_bytes() == before
