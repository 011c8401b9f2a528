"""The worker image and the three-container cluster of docker/, for real (root, Docker's engine).

Once per session `docker/cluster.sh up --stand-in-base` goes from nothing to three running
containers: it starts dockerd (--iptables=false, so the namespace test clusters keep their
forwarding), builds a stand-in for python:3.11-slim from Debian packages (no image registry is
reachable here) unless one is there, builds docker/Dockerfile itself with BuildKit, and starts one
container per service of docker/compose.yaml on a user-defined network. Then, through the real
CLI: `orchestrate check` on docker/inventory.yaml, training the bundled example across the three
containers, a worker killed inside its container, the supervisor's restart from the checkpoint to
exactly the target step; last, `docker/cluster.sh down` and a look that nothing is left.

What the containers run is checked against docker/compose.yaml read here (image, environment,
addresses, mounts, init), so cluster.sh and compose.yaml cannot drift apart. The extra-CA build
argument is tested with throwaway self-signed CAs. All traffic goes to the containers' addresses
on the bridge this session creates.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests import phase_log
from tests.conftest import Cli, snapshot_when

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
CLUSTER_SH = DOCKER_DIR / "cluster.sh"
DOCKER = "/usr/bin/docker"  # Debian's docker.io CLI: BuildKit built in (see docker/cluster.py)
LABEL = "org.orchestrate.cluster"
STEPS = 400
CHECKPOINT_EVERY = 40
CA_TEST_IMAGE = "orchestrate-worker-ca-test:local"


def _unavailable() -> str | None:
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    for tool in (DOCKER, "/usr/sbin/dockerd", "/usr/sbin/debootstrap"):
        if not Path(tool).exists():
            problems.append(f"no {tool}")
    if shutil.which("ip") is None:
        problems.append("no ip (iproute2)")
    if not problems:
        return None
    needs = "needs root, docker.io and debootstrap (scripts/ci-system-deps.sh)"
    return f"{needs}: {'; '.join(problems)}"


UNAVAILABLE = _unavailable()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.tf,
    pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or ""),
]


# --------------------------------------------------------------------------- helpers


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [DOCKER, *args],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, DOCKER_BUILDKIT="1"),
    )
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {result.stdout}{result.stderr}")
    return result


def cluster_sh(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    # The same Python as the tests: it has PyYAML, as an installed orchestrate does.
    return subprocess.run(
        [str(CLUSTER_SH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=dict(os.environ, PYTHON=sys.executable),
    )


def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER_DIR / "compose.yaml").read_text())


def container_name(service: str) -> str:
    return f"{compose()['name']}-{service}-1"


def inspect(name: str) -> dict[str, Any]:
    (info,) = json.loads(docker("inspect", name).stdout)
    return info


def processes(name_prefix: str) -> list[int]:
    """Live (not zombie) processes whose name starts with name_prefix."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().startswith(name_prefix):
                state = (entry / "stat").read_text().rsplit(") ", 1)[1][0]
                if state != "Z":
                    found.append(int(entry.name))
    return found


def dockerd_started_by_cluster_sh() -> bool:
    """cluster.sh keeps the pid of the dockerd it started (docker/cluster.py our_dockerd)."""
    state_dir = Path(os.environ.get("ORCHESTRATE_DOCKER_STATE", "/run/orchestrate-docker"))
    try:
        return int((state_dir / "dockerd.pid").read_text()) in dockerd_pids()
    except (OSError, ValueError):
        return False


def dockerd_pids() -> list[int]:
    return processes("dockerd")


@dataclass
class DockerCluster:
    started_dockerd: bool  # False: a dockerd that was already running serves the tests
    up_seconds: float
    up_output: str


@pytest.fixture(scope="session")
def docker_cluster() -> Iterator[DockerCluster]:
    # A dockerd that cluster.sh started (scripts/test.sh's `build` ahead of the tests) is the
    # tests' own: `down` must stop it. Only one started otherwise is left running.
    already_running = bool(dockerd_pids()) and not dockerd_started_by_cluster_sh()
    started = time.monotonic()
    with phase_log.phase("cluster", "Docker cluster up (waits for a build still running)"):
        result = cluster_sh("up", "--stand-in-base")
    elapsed = time.monotonic() - started
    try:
        assert result.returncode == 0, result.stdout + result.stderr[-6000:]
        # Its step lines (dockerd, stand-in, image, containers, with times) for the CI log.
        steps = [line for line in result.stderr.splitlines() if line.startswith("cluster:")]
        print("", *steps, f"docker/cluster.sh up took {elapsed:.0f} s", sep="\n", file=sys.stderr)
        yield DockerCluster(not already_running, elapsed, result.stdout + result.stderr)
    finally:
        # Idempotent: a no-op when the last test already took it down.
        cluster_sh("down", "--volumes", timeout=180)


# --------------------------------------------------------------------------- the image


def test_containers_are_the_compose_services(docker_cluster: DockerCluster) -> None:
    document = compose()
    project = document["name"]
    ((network_key, network),) = document["networks"].items()
    (ipam,) = network["ipam"]["config"]
    net = inspect(f"{project}_{network_key}")
    assert net["Driver"] == network["driver"]
    assert net["IPAM"]["Config"][0]["Subnet"] == ipam["subnet"]
    assert net["IPAM"]["Config"][0]["Gateway"] == ipam["gateway"]
    assert set(docker("ps", "-q", "--filter", f"label={LABEL}={project}").stdout.split()) == {
        inspect(container_name(name))["Id"][:12] for name in document["services"]
    }
    for name, service in document["services"].items():
        info = inspect(container_name(name))
        assert info["State"]["Running"], name
        assert info["Config"]["Image"] == service["image"]
        assert info["Config"]["Hostname"] == service["hostname"]
        assert info["HostConfig"]["Init"] is service["init"]
        env = dict(item.split("=", 1) for item in info["Config"]["Env"])
        assert {k: env[k] for k in service["environment"]} == service["environment"]
        addresses = info["NetworkSettings"]["Networks"][f"{project}_{network_key}"]
        assert addresses["IPAddress"] == service["networks"][network_key]["ipv4_address"]
        mounts = {m["Destination"]: m for m in info["Mounts"]}
        assert set(mounts) == {v["target"] for v in service["volumes"]}
        for volume in service["volumes"]:
            mount = mounts[volume["target"]]
            assert mount["Type"] == volume["type"]
            assert mount["RW"] is not volume.get("read_only", False)
            if volume["type"] == "volume":
                assert mount["Name"] == f"{project}_{volume['source']}"
            else:
                assert mount["Source"] == str((DOCKER_DIR / volume["source"]).resolve())
        assert "Ports" not in info["HostConfig"] or not info["HostConfig"]["PortBindings"]


def test_image_exposes_the_inventory_ports_and_has_the_worker(
    docker_cluster: DockerCluster,
) -> None:
    inventory = yaml.safe_load((DOCKER_DIR / "inventory.yaml").read_text())
    (service,) = {s["image"] for s in compose()["services"].values()}
    exposed = set(inspect(service)["Config"]["ExposedPorts"])
    defaults = inventory["defaults"]
    assert {f"{defaults['port']}/tcp", f"{defaults['ssh_port']}/tcp"} <= exposed
    version = docker(
        "run", "--rm", service, defaults["python"], "-c",
        "import tensorflow as tf, orchestrator, worker; print(tf.__version__)",
    ).stdout.split()  # fmt: skip
    pinned = re.findall(r'"tensorflow==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert version[-1:] == pinned


def _self_signed_ca(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate it signed: (ca.pem, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    # A CA may sign certificates (and CRLs) and nothing else.
    usage = dict.fromkeys(
        ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement"), False
    )
    ca_usage = x509.KeyUsage(
        digital_signature=True, key_cert_sign=True, crl_sign=True, encipher_only=False,
        decipher_only=False, **usage,
    )  # fmt: skip
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"orchestrate test CA {name}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(ca_usage, critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}.invalid")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"{name}.invalid")]), False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = (directory / f"{name}-ca.pem", directory / f"{name}.pem", directory / f"{name}.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


# Inside the image: a TLS handshake over a socket pair, the client trusting only the store that
# pip uses (PIP_CERT), for the server name the throwaway CA signed.
HANDSHAKE = textwrap.dedent(
    """
    import os, socket, ssl, sys, threading
    certs, name = sys.argv[1], sys.argv[2]
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(f"{certs}/{name}.pem", f"{certs}/{name}.key")
    client_ctx = ssl.create_default_context(cafile=os.environ["PIP_CERT"])
    a, b = socket.socketpair()
    def serve():
        with server_ctx.wrap_socket(b, server_side=True) as s:
            s.sendall(b"hello")
    threading.Thread(target=serve, daemon=True).start()
    with client_ctx.wrap_socket(a, server_hostname=f"{name}.invalid") as c:
        print("verified", c.recv(5).decode())
    """
)


def test_extra_ca_build_argument_puts_the_certificates_in_the_trust_store(
    docker_cluster: DockerCluster, tmp_path: Path
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    first = _self_signed_ca(certs, "first")
    second = _self_signed_ca(certs, "second")
    (certs / "handshake.py").write_text(HANDSHAKE)
    bundle = first[0].read_text() + second[0].read_text()
    # The Dockerfile's first stage only: the trust store is set up there, before any download.
    built = docker(
        "build", "--network=host", "--target", "system", "--tag", CA_TEST_IMAGE,
        "--file", str(DOCKER_DIR / "Dockerfile"), "--build-arg", f"EXTRA_CA_CERTS={bundle}",
        str(REPO), check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    try:

        def in_image(*command: str) -> subprocess.CompletedProcess[str]:
            return docker(
                "run", "--rm", "--mount", f"type=bind,source={certs},target=/certs,readonly",
                "--entrypoint", command[0], CA_TEST_IMAGE, *command[1:], check=False,
            )  # fmt: skip

        store = in_image("cat", "/etc/ssl/certs/ca-certificates.crt").stdout
        for ca, _, _ in (first, second):
            body = ca.read_text().strip()
            assert body in store, f"{ca.name} is missing from the image's trust store"
        listed = in_image("sh", "-c", "ls /usr/local/share/ca-certificates").stdout.split()
        assert listed == ["orchestrate-extra-1.crt", "orchestrate-extra-2.crt"]
        for name in ("first", "second"):
            handshake = in_image("python", "/certs/handshake.py", "/certs", name)
            assert handshake.stdout.strip() == "verified hello", handshake.stderr
        # Without the argument the same server is not trusted: the check can fail.
        plain = docker(
            "run", "--rm", "--mount", f"type=bind,source={certs},target=/certs,readonly",
            "--entrypoint", "python", compose()["services"]["worker-0"]["image"],
            "/certs/handshake.py", "/certs", "first", check=False,
        )  # fmt: skip
        assert plain.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in plain.stderr
    finally:
        docker("image", "rm", "--force", CA_TEST_IMAGE, check=False)


def test_extra_ca_build_argument_without_a_certificate_fails_the_build(
    docker_cluster: DockerCluster,
) -> None:
    built = docker(
        "build", "--network=host", "--target", "system", "--progress=plain",
        "--file", str(DOCKER_DIR / "Dockerfile"), "--build-arg", "EXTRA_CA_CERTS=not a cert",
        str(REPO), check=False,
    )  # fmt: skip
    assert built.returncode != 0
    assert "EXTRA_CA_CERTS holds no PEM certificate" in built.stderr


def test_worker_image_trusts_this_machines_extra_cas(docker_cluster: DockerCluster) -> None:
    # cluster.sh passes the certificates this machine added (a TLS-intercepting proxy's CA, if
    # any); without them pip in the build fails behind such a proxy.
    local = sorted(Path("/usr/local/share/ca-certificates").rglob("*.crt"))
    image = compose()["services"]["worker-0"]["image"]
    store = docker("run", "--rm", "--entrypoint", "cat", image,
                   "/etc/ssl/certs/ca-certificates.crt").stdout  # fmt: skip
    for path in local:
        for block in path.read_text().split("-----END CERTIFICATE-----")[:-1]:
            assert block.strip() + "\n-----END CERTIFICATE-----" in store, path
    if local:
        assert f"trusting {len(local)} extra CA certificate(s)" in docker_cluster.up_output


def test_up_again_keeps_the_running_containers(docker_cluster: DockerCluster) -> None:
    names = [container_name(name) for name in compose()["services"]]
    before = {name: inspect(name)["Id"] for name in names}
    again = cluster_sh("up", "--stand-in-base")
    assert again.returncode == 0, again.stderr[-4000:]
    assert {name: inspect(name)["Id"] for name in names} == before
    assert again.stderr.count("running, unchanged") == len(names)


# --------------------------------------------------------------------------- orchestrate


def write_inventory(cli: Cli) -> Path:
    """docker/inventory.yaml with the key made by cluster.sh, a known_hosts of the test's own,
    and a shorter job with a name of this run's own: the work volumes may keep the checkpoints
    of earlier jobs (docker/README.md's `orchestrate up docker/inventory.yaml`, an earlier run
    of this test), and a job of the same name would resume from them."""
    inventory = yaml.safe_load((DOCKER_DIR / "inventory.yaml").read_text())
    inventory["defaults"]["ssh_key"] = str(DOCKER_DIR / "client_key")
    inventory["defaults"]["ssh_known_hosts"] = str(cli.cwd / "known_hosts")
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    inventory["job"]["name"] = f"{inventory['job']['name']}-test-{started}-{secrets.token_hex(3)}"
    inventory["job"].update(
        steps=STEPS,
        checkpoint_every=CHECKPOINT_EVERY,
        log_every=10,
        stall_timeout=60,
        restart_backoff=1,
        # A task's default, which the tests otherwise turn off ($ORCHESTRATE_WARM_RESTARTS=0):
        # here the run keeps standbys in the containers for its restart over SSH, as a user's does.
        warm_restarts=True,
    )
    path = cli.cwd / "inventory.yaml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def inventory_port(path: Path) -> int:
    return int(yaml.safe_load(path.read_text())["defaults"]["port"])


def killable(status: dict[str, Any]) -> bool:
    """The chief has a checkpoint and the workers are well short of STEPS, or the run ended
    (which the test then fails on: the kill came too late)."""
    if status["state"] in ("succeeded", "failed", "stopped"):
        return True
    steps = [w["step"] or 0 for w in status["workers"]]
    ready = (status["workers"][0]["checkpoint_step"] or 0) >= CHECKPOINT_EVERY
    return status["state"] == "running" and ready and max(steps) < STEPS - 150


def host_process(container: str, pid: int) -> psutil.Process:
    """The process that is `pid` inside `container`, as this machine sees it (NSpid's last)."""
    init = psutil.Process(int(docker("inspect", "--format", "{{.State.Pid}}", container).stdout))
    for process in init.children(recursive=True):
        with contextlib.suppress(OSError, psutil.Error):
            status = Path(f"/proc/{process.pid}/status").read_text()
            nspids = next(line for line in status.splitlines() if line.startswith("NSpid:"))
            if int(nspids.split()[-1]) == pid:
                return process
    raise AssertionError(f"no process {pid} in {container}")


def test_check_then_train_and_recover_from_a_killed_worker(
    docker_cluster: DockerCluster, cli: Cli
) -> None:
    inventory = write_inventory(cli)
    check = cli("check", str(inventory), timeout=180)
    assert check.returncode == 0, check.stdout + check.stderr
    hosts = [h["name"] for h in yaml.safe_load(inventory.read_text())["hosts"]]
    assert f"preflight passed on {len(hosts)} host(s)" in check.stderr
    for host in hosts:
        assert f"port {inventory_port(inventory)} reachable from" in check.stderr
        assert host in check.stderr

    up = cli.popen("up", "--skip-checks", str(inventory))
    victim = hosts[1]
    try:
        # What the supervisor itself saw (a `status` poll can take seconds on a busy machine,
        # longer than this run has left); every worker is held right then, the victim killed.
        status = snapshot_when(cli, killable, timeout=240)
        assert status["state"] == "running", f"ended before the kill: {status}"
        checkpoint_at_kill = status["workers"][0]["checkpoint_step"]
        workers = {w["name"]: host_process(container_name(w["name"]), w["pid"])
                   for w in status["workers"]}  # fmt: skip
        for worker in workers.values():
            worker.suspend()
        assert "worker" in " ".join(workers[victim].cmdline())
        workers[victim].kill()
        for name, worker in workers.items():
            if name != victim:
                worker.resume()
        out, err = up.communicate(timeout=300)
    finally:
        up.kill()
    assert up.returncode == 0, out + err
    assert f"{victim}" in out and "restarting the cluster (1/" in out
    assert f"succeeded at step {STEPS} after 1 restart(s)" in err
    final = cli.status()
    assert [(w["name"], w["step"]) for w in final["workers"]] == [(h, STEPS) for h in hosts]
    assert final["restarts"] == 1 and final["last_restart"]["worker"] == victim
    logs = cli("tail", "-n", "400", check=True).stdout
    restored = [
        int(line.split("restored checkpoint at step ")[1].split()[0])
        for line in logs.splitlines()
        if "restored checkpoint at step" in line
    ]
    # Every worker of the second attempt resumed from the checkpoint seen before the kill or a
    # later one, not from step 0.
    assert len(restored) == len(hosts), logs
    assert all(checkpoint_at_kill <= step < STEPS for step in restored), restored


# --------------------------------------------------------------------------- down


def test_down_leaves_nothing(docker_cluster: DockerCluster) -> None:
    project = compose()["name"]
    result = cluster_sh("down", "--volumes", timeout=180)
    assert result.returncode == 0, result.stderr
    assert "cluster down" in result.stdout
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True,
                                      check=True).stdout)  # fmt: skip
    names = {link["ifname"] for link in links}
    assert "docker0" not in names
    assert not [n for n in names if n.startswith(("br-", "veth"))], names
    if docker_cluster.started_dockerd:
        # The dockerd that up started, its containerd and the containers' shims are gone.
        assert dockerd_pids() == []
        assert processes("containerd") == []
        assert not Path("/var/run/docker.sock").exists() or docker("info", check=False).returncode
    else:
        assert docker("ps", "-aq", "--filter", f"label={LABEL}={project}").stdout == ""
        assert docker("network", "ls", "-q", "--filter", f"name={project}_").stdout == ""
    # And it is idempotent: a second down finds nothing to do.
    assert cluster_sh("down", "--volumes", timeout=60).returncode == 0
