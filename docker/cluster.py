"""Bring the docker/compose.yaml cluster up with plain `docker run`, and take it down to nothing.

    docker/cluster.sh up [--stand-in-base] [--extra-ca FILE ... | --no-extra-ca]
    docker/cluster.sh build [--stand-in-base] [--extra-ca FILE ... | --no-extra-ca]
    docker/cluster.sh down [--volumes] [--images]
    docker/cluster.sh status

Why not `docker compose`: Compose v2 is not packaged for Debian bookworm (its docker-compose 1.29
rejects compose.yaml), so this script reads compose.yaml itself and turns each service into one
`docker run` on one user-defined network. It understands exactly the keys compose.yaml uses and
refuses any other, so the two cannot drift apart. Object names follow Compose's scheme (network
`<project>_<net>`, volumes `<project>_<vol>`, containers `<project>-<service>-1`): the host keys
kept in the volumes are the same whichever of the two started the containers. Use one or the other
at a time.

`up`, as root, from nothing:
  1. dockerd, unless one answers already: started with --iptables=false --ip-forward=false
     --ip-masq=false --bridge=none, so it leaves the machine's forwarding and firewall alone (a
     default dockerd sets the FORWARD policy to DROP, which cuts other bridges, like those of the
     namespace test clusters) and creates no docker0. Its pid goes to STATE_DIR; `down` stops it.
  2. with --stand-in-base, and only if the base image (the Dockerfile's FROM) is missing: a
     stand-in for it built from Debian packages (debootstrap from this machine's apt mirror), for
     machines that reach no image registry.
  3. the image, from docker/Dockerfile with BuildKit and --network=host (the containers have no
     route out; the build needs PyPI). Extra CA certificates go in as the EXTRA_CA_CERTS build
     argument: by default those this machine added to its own trust store.
  4. docker/client_key (docker/make-client-key.sh), the network, then one container per service;
     a container already running the same image and settings is kept (its label says which).
  5. waits until every sshd answers, then keeps the inventory's known_hosts (docker/known_hosts)
     in step: an entry for a container's address that holds another key than the one the
     container has now (read with `docker exec`; a new volume made a new one) is replaced. An
     address not recorded yet is left to orchestrate's accept-new policy. Then it prints the
     orchestrate commands.

`build`: steps 1 to 3 alone (dockerd, the base, the image), so that the image can be built ahead
of the first `up` (scripts/test.sh builds it at the start of the run, beside the checks). A build
holds STATE_DIR/build.lock: an `up` that starts meanwhile waits for it and then finds the image
built, instead of building the same layers (and a second stand-in base) beside it.

`down`: removes the containers and the network, stops the dockerd that `up` started (by its pid;
one it did not start is left alone), deletes a leftover docker0, and checks that nothing is left.
The images stay (the next `up` builds in seconds) unless --images; the volumes (host keys, work
directories) stay unless --volumes, which also removes the cluster's addresses from the
inventory's known_hosts (their host keys are gone with the volumes).

Exit status: 0 done, 1 a step failed (the message says which and what to do), 2 bad usage.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

DOCKER_DIR = Path(__file__).resolve().parent
REPO = DOCKER_DIR.parent
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
STAND_IN_DOCKERFILE = DOCKER_DIR / "stand-in-base.Dockerfile"
MAKE_CLIENT_KEY = DOCKER_DIR / "make-client-key.sh"
INVENTORY_FILE = DOCKER_DIR / "inventory.yaml"
STATE_DIR = Path(os.environ.get("ORCHESTRATE_DOCKER_STATE", "/run/orchestrate-docker"))
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))

# Every object this script creates carries this label, so `down` finds them all.
LABEL = "org.orchestrate.cluster"
CONFIG_LABEL = "org.orchestrate.config"
STAND_IN_LABEL = "org.orchestrate.stand-in"
ROOTFS_IMAGE = "orchestrate-stand-in-rootfs:bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DOCKERD_FLAGS = ("--iptables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none")
DOCKERD_START_TIMEOUT_S = 60.0
DOCKERD_STOP_TIMEOUT_S = 30.0
SSHD_TIMEOUT_S = 60.0
# Where entrypoint.sh keeps the container's host key (its SSHD_HOST_KEY_DIR default; on a volume).
HOST_KEY_DIR = "/etc/ssh/host-keys"
HOST_KEY_FILE = "ssh_host_ed25519_key.pub"

# The compose keys this script turns into `docker run` options; any other key is an error.
SERVICE_KEYS = {"build", "image", "init", "environment", "hostname", "networks", "volumes"}
VOLUME_KEYS = {"type", "source", "target", "read_only", "bind"}


class ClusterError(Exception):
    """A step failed; the message says what happened and what to do."""


# --------------------------------------------------------------------------- compose.yaml


@dataclass(frozen=True)
class Service:
    name: str
    container: str
    image: str
    hostname: str
    network: str
    address: str
    init: bool
    environment: dict[str, str]
    mounts: tuple[str, ...]  # `--mount` values

    def run_args(self, label: str) -> list[str]:
        """`docker run` arguments, without the config label (see config_hash)."""
        args = ["run", "--detach", "--name", self.container, "--hostname", self.hostname]
        args += ["--network", self.network, "--ip", self.address, "--label", label]
        if self.init:
            args.append("--init")
        for key, value in sorted(self.environment.items()):
            args += ["--env", f"{key}={value}"]
        for mount in self.mounts:
            args += ["--mount", mount]
        return args


@dataclass(frozen=True)
class Cluster:
    """What compose.yaml asks for, in `docker run` terms."""

    project: str
    image: str
    dockerfile: Path
    context: Path
    network: str
    subnet: str
    gateway: str
    services: tuple[Service, ...]
    volumes: tuple[str, ...]


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClusterError(f"{COMPOSE_FILE}: {where} must be a mapping")
    return value


def _mount(project: str, volume: dict[str, Any], compose_dir: Path, where: str) -> str:
    unknown = set(volume) - VOLUME_KEYS
    if unknown:
        raise ClusterError(f"{COMPOSE_FILE}: {where}: cluster.py does not handle {sorted(unknown)}")
    kind = volume["type"]
    if kind == "bind":
        source = (compose_dir / volume["source"]).resolve()
        if _mapping(volume.get("bind", {}), where).get("create_host_path", True) is not False:
            raise ClusterError(f"{COMPOSE_FILE}: {where}: set bind.create_host_path: false")
        parts = [f"type=bind,source={source}"]
    elif kind == "volume":
        parts = [f"type=volume,source={project}_{volume['source']}"]
    else:
        raise ClusterError(f"{COMPOSE_FILE}: {where}: volume type {kind!r} is not handled")
    parts.append(f"target={volume['target']}")
    if volume.get("read_only"):
        parts.append("readonly")
    return ",".join(parts)


def parse_compose(document: dict[str, Any], compose_dir: Path) -> Cluster:
    """compose.yaml as plain `docker run` settings; refuses keys it would silently drop."""
    project = document["name"]
    networks = _mapping(document["networks"], "networks")
    if len(networks) != 1:
        raise ClusterError(f"{COMPOSE_FILE}: expected one network, found {sorted(networks)}")
    ((network_key, network),) = networks.items()
    if network.get("driver") != "bridge":
        raise ClusterError(f"{COMPOSE_FILE}: network {network_key} must use the bridge driver")
    (ipam,) = network["ipam"]["config"]
    services: list[Service] = []
    images: set[str] = set()
    builds: set[tuple[Path, Path]] = set()
    for name, raw in _mapping(document["services"], "services").items():
        service = _mapping(raw, f"services.{name}")
        unknown = set(service) - SERVICE_KEYS
        if unknown:
            raise ClusterError(
                f"{COMPOSE_FILE}: services.{name}: cluster.py does not handle {sorted(unknown)};"
                " teach docker/cluster.py to or drop them"
            )
        build = _mapping(service["build"], f"services.{name}.build")
        # The one build argument, EXTRA_CA_CERTS, is interpolated by Compose; here --extra-ca.
        if set(build) - {"context", "dockerfile", "args"} or set(build.get("args", {})) - {
            "EXTRA_CA_CERTS"
        }:
            raise ClusterError(f"{COMPOSE_FILE}: services.{name}.build: unknown settings")
        context = (compose_dir / build["context"]).resolve()
        builds.add((context, (context / build["dockerfile"]).resolve()))
        images.add(service["image"])
        ((service_network, settings),) = _mapping(service["networks"], "networks").items()
        if service_network != network_key:
            raise ClusterError(f"{COMPOSE_FILE}: services.{name}: unknown network")
        services.append(
            Service(
                name=name,
                container=f"{project}-{name}-1",
                image=service["image"],
                hostname=service.get("hostname", name),
                network=f"{project}_{network_key}",
                address=settings["ipv4_address"],
                init=bool(service.get("init", False)),
                environment={k: str(v) for k, v in service.get("environment", {}).items()},
                mounts=tuple(
                    _mount(project, volume, compose_dir, f"services.{name}.volumes")
                    for volume in service.get("volumes", [])
                ),
            )
        )
    if len(images) != 1 or len(builds) != 1:
        raise ClusterError(f"{COMPOSE_FILE}: every service must build the same one image")
    ((context, dockerfile),) = builds
    return Cluster(
        project=project,
        image=images.pop(),
        dockerfile=dockerfile,
        context=context,
        network=f"{project}_{network_key}",
        subnet=ipam["subnet"],
        gateway=ipam["gateway"],
        services=tuple(services),
        volumes=tuple(f"{project}_{name}" for name in document.get("volumes", {})),
    )


def load_cluster(path: Path = COMPOSE_FILE) -> Cluster:
    return parse_compose(yaml.safe_load(path.read_text()), path.parent)


def base_image(dockerfile: Path) -> str:
    """The image the Dockerfile's first FROM names."""
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words and words[0].upper() == "FROM":
            return words[1]
    raise ClusterError(f"{dockerfile}: no FROM line")


def config_hash(service: Service, image_id: str) -> str:
    """Identifies a container's settings and image: `up` keeps a container whose label matches."""
    text = json.dumps([service.run_args(""), service.image, image_id])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- known_hosts


@dataclass(frozen=True)
class KnownHost:
    """Where the inventory records one host's key: its known_hosts file and the name in it."""

    host: str  # the inventory's host name, which is the compose service's
    file: Path
    name: str  # the address, or [address]:port off port 22 (OpenSSH's and paramiko's form)


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def known_hosts_of(document: dict[str, Any], base: Path) -> list[KnownHost]:
    """inventory.yaml's hosts that name an ssh_known_hosts (itself or in defaults); relative paths
    are relative to the inventory's directory, as orchestrate reads them."""
    defaults = document.get("defaults") or {}
    found: list[KnownHost] = []
    for host in document.get("hosts") or []:
        settings = {**defaults, **host}
        if not settings.get("ssh_known_hosts"):
            continue  # ~/.ssh/known_hosts: the user's own file, not this script's to edit
        path = Path(str(settings["ssh_known_hosts"])).expanduser()
        name = known_hosts_name(str(settings["address"]), int(settings.get("ssh_port", 22)))
        file = path if path.is_absolute() else base / path
        found.append(KnownHost(str(host["name"]), file, name))
    return found


def fingerprint(key: str) -> str:
    """`TYPE BASE64` as OpenSSH shows it: the type and SHA256: with the unpadded base64 of the
    SHA-256 of the key blob."""
    kind, blob = key.split()[:2]
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return f"{kind} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


def _hashed_match(pattern: str, name: str) -> bool:
    """Whether a hashed known_hosts name (`|1|salt|hash`, HashKnownHosts) is `name`."""
    parts = pattern.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, recorded = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except ValueError:
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), "sha1").digest(), recorded)


def _entry(line: str) -> tuple[list[str], str] | None:
    """A key line's host patterns and its `TYPE BASE64`; None for comments, blank lines, marker
    lines (@cert-authority, @revoked) and anything else this script leaves as it is."""
    fields = line.split()
    if len(fields) < 3 or fields[0].startswith(("#", "@")):
        return None
    return fields[0].split(","), f"{fields[1]} {fields[2]}"


def _matches(patterns: list[str], name: str) -> bool:
    return any(p == name or (p.startswith("|") and _hashed_match(p, name)) for p in patterns)


def update_known_hosts(
    text: str, wanted: Mapping[str, str | None]
) -> tuple[str, dict[str, tuple[str, list[str]]]]:
    """known_hosts text with the entries of `wanted`'s names in step: name -> the `TYPE BASE64`
    the host has now, or None for a host whose key is gone. Returns the new text and, per name,
    what was done ("removed", "replaced", "unchanged" or "absent": not recorded, left to
    accept-new) with the keys that were recorded. Other lines and other names on a shared line
    stay as they are; a replaced entry takes the place of the name's first line."""
    lines = text.splitlines(keepends=True)
    recorded: dict[str, list[str]] = {name: [] for name in wanted}
    for line in lines:
        entry = _entry(line)
        if entry is None:
            continue
        for name, keys in recorded.items():
            if _matches(entry[0], name):
                keys.append(entry[1])
    done: dict[str, tuple[str, list[str]]] = {}
    for name, key in wanted.items():
        if not recorded[name]:
            done[name] = ("absent", [])
        elif key is None:
            done[name] = ("removed", recorded[name])
        elif set(recorded[name]) == {key}:
            done[name] = ("unchanged", recorded[name])
        else:
            done[name] = ("replaced", recorded[name])
    dropped = {name for name, (action, _) in done.items() if action in ("removed", "replaced")}
    out: list[str] = []
    placed: set[str] = set()
    for line in lines:
        entry = _entry(line)
        ours = {name for name in dropped if entry and _matches(entry[0], name)}
        if not entry or not ours:
            out.append(line)
            continue
        patterns, key = entry
        rest = [p for p in patterns if not any(_matches([p], name) for name in ours)]
        if rest:  # other hosts share the line: keep it for them
            fields = line.split(maxsplit=1)
            out.append(",".join(rest) + " " + fields[1])
        for name in sorted(ours - placed, key=list(wanted).index):
            if done[name][0] == "replaced":
                out.append(f"{name} {wanted[name]}\n")
                placed.add(name)
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    return "".join(out), done


def write_keeping_mode(path: Path, text: str) -> None:
    """Replace the file's text atomically, keeping its mode and owner (orchestrate, run as the
    user who ran sudo, appends to it)."""
    path = path.resolve()
    stat = path.stat()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        os.chmod(temporary, stat.st_mode & 0o7777)
        with contextlib.suppress(PermissionError):
            os.chown(temporary, stat.st_uid, stat.st_gid)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


# --------------------------------------------------------------------------- the machine


def log(message: str) -> None:
    print(f"cluster: {message}", file=sys.stderr, flush=True)


def record_phase(name: str, started: float) -> None:
    """A build step's wall time for scripts/test.sh's phase table (scripts/phase_table.py), when
    it set ORCHESTRATE_PHASE_LOG; `started` is a time.time()."""
    path = os.environ.get("ORCHESTRATE_PHASE_LOG")
    if path:
        entry = {"kind": "image", "name": name, "start": started, "end": time.time()}
        with contextlib.suppress(OSError), open(path, "a") as phase_log:
            phase_log.write(json.dumps(entry) + "\n")


def docker_cli() -> str:
    # Debian's docker.io CLI has BuildKit built in. Another `docker` earlier on PATH (a newer CLI
    # without the buildx plugin) would refuse DOCKER_BUILDKIT=1 or fall back to the legacy
    # builder, which ignores Dockerfile.dockerignore and sends .git and the client key along.
    configured = os.environ.get("DOCKER")
    if configured:
        return configured
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and Path(candidate).exists():
            return candidate
    raise ClusterError("no docker CLI found: apt-get install docker.io (Debian/Ubuntu)")


def docker_env() -> dict[str, str]:
    return dict(os.environ, DOCKER_BUILDKIT="1")


def docker(*args: str, check: bool = True, quiet: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [docker_cli(), *args]
    result = subprocess.run(
        argv,
        env=docker_env(),
        text=True,
        stdout=subprocess.PIPE if quiet else None,
        stderr=subprocess.PIPE if quiet else None,
        check=False,
    )
    if check and result.returncode != 0:
        details = (result.stderr or "").strip()
        raise ClusterError(f"`docker {' '.join(args[:3])}` failed: {details[-2000:]}")
    return result


def docker_answers() -> bool:
    try:
        return docker("info", "--format", "{{.ServerVersion}}", check=False).returncode == 0
    except ClusterError:
        return False


def alive(process: psutil.Process) -> bool:
    """Running, not a zombie: a dockerd that exited stays one until something reaps it."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def dockerd_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "dockerd" and alive(p)]


def our_dockerd() -> psutil.Process | None:
    """The dockerd `up` started, if it still runs."""
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        process = psutil.Process(int((STATE_DIR / "dockerd.pid").read_text()))
        if process.name() == "dockerd" and alive(process):
            return process
    return None


def start_dockerd() -> None:
    if docker_answers():
        if our_dockerd() is None:
            log(
                "a dockerd that this script did not start answers; using it as it is (down"
                " will leave it running). If it was started without --iptables=false it may"
                " have set the FORWARD policy to DROP."
            )
        return
    others = dockerd_processes()
    if others:
        raise ClusterError(
            f"dockerd runs (pid {', '.join(str(p.pid) for p in others)}) but does not answer on the"
            " default socket; stop it or set DOCKER_HOST"
        )
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not Path(dockerd).exists():
        raise ClusterError("dockerd not found: apt-get install docker.io (Debian/Ubuntu)")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    log_path = STATE_DIR / "dockerd.log"
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            [dockerd, *DOCKERD_FLAGS, "--pidfile", str(STATE_DIR / "dockerd.docker-pid")],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # outlives this script, like a service
        )
    (STATE_DIR / "dockerd.pid").write_text(f"{process.pid}\n")
    deadline = time.monotonic() + DOCKERD_START_TIMEOUT_S
    while not docker_answers():
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            stop_dockerd()
            raise ClusterError("dockerd did not start; its log ends:\n" + "\n".join(tail))
        time.sleep(0.3)
    log(f"started dockerd (pid {process.pid}, {' '.join(DOCKERD_FLAGS)}; log {log_path})")


def stop_dockerd() -> None:
    dockerd = our_dockerd()
    if dockerd is None:
        if docker_answers() or dockerd_processes():
            log("leaving the dockerd this script did not start running")
        with contextlib.suppress(FileNotFoundError):
            (STATE_DIR / "dockerd.pid").unlink()
        return
    # dockerd stops the containerd it started; wait for that one too, so that nothing is left.
    family = [dockerd, *dockerd.children(recursive=True)]
    dockerd.terminate()
    _, running = psutil.wait_procs(family, timeout=DOCKERD_STOP_TIMEOUT_S)
    running = [p for p in running if alive(p)]
    if running:
        log(f"killing what ignored SIGTERM for {DOCKERD_STOP_TIMEOUT_S:.0f} s: {running}")
        for process in running:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(running, timeout=5)
    (STATE_DIR / "dockerd.pid").unlink()
    log(f"stopped dockerd (pid {dockerd.pid})")


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def check_subnet_free(cluster: Cluster) -> None:
    """Refuse a subnet that any route on this machine already covers (but our own network)."""
    subnet = ipaddress.ip_network(cluster.subnet)
    routes = json.loads(subprocess.run(["ip", "-j", "route"], capture_output=True, text=True,
                                       check=True).stdout)  # fmt: skip
    for route in routes:
        dst = route.get("dst", "")
        if dst in ("default", "") or route.get("dev", "").startswith("br-"):
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.ip_network(dst, strict=False).overlaps(subnet):
                raise ClusterError(
                    f"the compose network's subnet {subnet} overlaps {dst} on"
                    f" {route.get('dev')}: change the subnet and the addresses in"
                    " docker/compose.yaml and docker/inventory.yaml"
                )


# --------------------------------------------------------------------------- images


def image_id(name: str) -> str | None:
    result = docker("image", "inspect", "--format", "{{.Id}}", name, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    files: list[Path] = []
    for source in APT_SOURCES:
        files += sorted(source.glob("*")) if source.is_dir() else [source]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"^\s*URIs:\s*(\S+)|^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M):
            uri = (match[1] or match[2]).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


def build_stand_in_base(name: str) -> None:
    """A stand-in for the official Python image, from Debian bookworm packages."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ClusterError("debootstrap not found: apt-get install debootstrap")
    mirror = apt_mirror()
    started, wall_started = time.monotonic(), time.time()
    with tempfile.TemporaryDirectory(prefix="orchestrate-rootfs-") as rootfs:
        log(f"debootstrap bookworm from {mirror} (about a minute)")
        result = subprocess.run(
            [debootstrap, "--variant=minbase", "bookworm", rootfs, mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ClusterError(f"debootstrap failed: {(result.stdout + result.stderr)[-2000:]}")
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            [docker_cli(), "import", "--change", f"LABEL {STAND_IN_LABEL}=1", "-", ROOTFS_IMAGE],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            env=docker_env(),
            check=False,
        )
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise ClusterError(f"docker import of the root file system failed: {imported.stderr}")
        shutil.rmtree(rootfs)
        os.mkdir(rootfs)
        (Path(rootfs) / "empty").mkdir()
        # An empty context: the stand-in copies nothing (and docker/ holds the client key).
        build(["--file", str(STAND_IN_DOCKERFILE), "--tag", name,
               "--label", f"{STAND_IN_LABEL}=1"], context=Path(rootfs) / "empty")  # fmt: skip

    log(f"stand-in base image {name} built in {time.monotonic() - started:.0f} s")
    record_phase("stand-in base image (debootstrap, docker import, python3)", wall_started)


def build(args: list[str], *, context: Path) -> None:
    result = docker("build", "--network=host", "--progress=plain", *args, str(context),
                    check=False, quiet=False)  # fmt: skip
    if result.returncode != 0:
        raise ClusterError(
            "docker build failed (its output is above). Behind a TLS-intercepting proxy pass"
            " its CA certificate: --extra-ca FILE"
        )


def extra_ca_pem(files: Sequence[Path] | None) -> str:
    """The certificates for EXTRA_CA_CERTS: the given files, or this machine's own additions."""
    if files is None:
        files = sorted(LOCAL_CA_DIR.rglob("*.crt")) if LOCAL_CA_DIR.is_dir() else []
    pem = ""
    for path in files:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ClusterError(f"cannot read the CA certificate {path}: {exc}") from exc
        if "PRIVATE KEY" in text:
            raise ClusterError(f"{path} holds a private key; give the CA's certificate only")
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise ClusterError(f"{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        pem += text.strip() + "\n"
    return pem


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One image build at a time on this machine: a second waits and then finds it built."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with (STATE_DIR / "build.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another build of the image runs (cluster.sh build): waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def dockerd_and_image(cluster: Cluster, ca_files: Sequence[Path] | None, stand_in: bool) -> str:
    """Steps 1 to 3, under the build lock (a dockerd still starting does not answer yet)."""
    with build_lock():
        start_dockerd()
        return build_image(cluster, ca_files, stand_in)


def build_image(cluster: Cluster, ca_files: Sequence[Path] | None, stand_in: bool) -> str:
    base = base_image(cluster.dockerfile)
    if image_id(base) is None:
        if not stand_in:
            log(f"base image {base} is not here: docker build will pull it")
        else:
            build_stand_in_base(base)
    args = ["--file", str(cluster.dockerfile), "--tag", cluster.image]
    args += ["--label", f"{LABEL}={cluster.project}"]  # down --images finds old builds by it
    pem = extra_ca_pem(ca_files)
    if pem:
        args += ["--build-arg", f"EXTRA_CA_CERTS={pem}"]
        log(f"trusting {pem.count('BEGIN CERTIFICATE')} extra CA certificate(s) in the build")
    started, wall_started = time.monotonic(), time.time()
    build(args, context=cluster.context)
    log(f"image {cluster.image} ready in {time.monotonic() - started:.0f} s")
    record_phase(f"worker image {cluster.image} (docker/Dockerfile)", wall_started)
    built = image_id(cluster.image)
    assert built is not None
    return built


# --------------------------------------------------------------------------- up / down


def volume_exists(name: str) -> bool:
    return docker("volume", "inspect", name, check=False).returncode == 0


def containers(cluster: Cluster, *, all_states: bool = True) -> list[str]:
    args = ["ps", "--quiet", "--filter", f"label={LABEL}={cluster.project}"]
    if all_states:
        args.append("--all")
    return docker(*args).stdout.split()


def ensure_network(cluster: Cluster) -> None:
    found = docker("network", "inspect", cluster.network, check=False)
    if found.returncode == 0:
        (network,) = json.loads(found.stdout)
        configs = network["IPAM"]["Config"] or [{}]
        if configs[0].get("Subnet") != cluster.subnet:
            raise ClusterError(
                f"network {cluster.network} exists with subnet {configs[0].get('Subnet')}, not"
                f" {cluster.subnet}: `docker/cluster.sh down` removes it"
            )
        return
    check_subnet_free(cluster)
    docker("network", "create", "--driver", "bridge", "--subnet", cluster.subnet,
           "--gateway", cluster.gateway, "--label", f"{LABEL}={cluster.project}",
           cluster.network)  # fmt: skip
    log(f"network {cluster.network} ({cluster.subnet})")


def ensure_container(cluster: Cluster, service: Service, built: str) -> None:
    wanted = config_hash(service, built)
    found = docker("container", "inspect", service.container, check=False)
    if found.returncode == 0:
        (info,) = json.loads(found.stdout)
        if info["State"]["Running"] and info["Config"]["Labels"].get(CONFIG_LABEL) == wanted:
            log(f"{service.container}: running, unchanged")
            return
        docker("rm", "--force", service.container)
    for mount in service.mounts:
        source = dict(part.split("=", 1) for part in mount.split(",") if "=" in part)
        if source["type"] == "bind" and not Path(source["source"]).exists():
            raise ClusterError(f"{source['source']} is missing (docker/make-client-key.sh)")
    args = service.run_args(f"{LABEL}={cluster.project}")
    docker(*args, "--label", f"{CONFIG_LABEL}={wanted}", service.image)
    log(f"{service.container}: started at {service.address}")


def sshd_answers(address: str) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, 22), timeout=2) as conn:
        return conn.recv(4).startswith(b"SSH-")
    return False


def wait_for_sshd(cluster: Cluster) -> None:
    deadline = time.monotonic() + SSHD_TIMEOUT_S
    waiting = list(cluster.services)
    while waiting:
        waiting = [s for s in waiting if not sshd_answers(s.address)]
        if not waiting:
            break
        if time.monotonic() > deadline:
            logs = docker("logs", "--tail", "20", waiting[0].container, check=False)
            raise ClusterError(
                f"sshd of {', '.join(s.name for s in waiting)} did not answer within"
                f" {SSHD_TIMEOUT_S:.0f} s; {waiting[0].container}'s log ends:\n"
                f"{logs.stdout}{logs.stderr}"
            )
        time.sleep(0.3)


def container_host_key(service: Service) -> str | None:
    """The `TYPE BASE64` of the host key the container's sshd offers (entrypoint.sh created it)."""
    directory = service.environment.get("SSHD_HOST_KEY_DIR", HOST_KEY_DIR)
    result = docker("exec", service.container, "cat", f"{directory}/{HOST_KEY_FILE}", check=False)
    fields = result.stdout.split()
    return " ".join(fields[:2]) if result.returncode == 0 and len(fields) >= 2 else None


def sync_known_hosts(cluster: Cluster, *, keys_gone: bool) -> None:
    """Keep the inventory's known_hosts (docker/known_hosts) in step with the containers' host
    keys: after `up`, replace an entry that holds another key than its container's; with
    keys_gone (`down --volumes` removed the host-key volumes), remove the cluster's entries."""
    try:
        targets = known_hosts_of(yaml.safe_load(INVENTORY_FILE.read_text()), INVENTORY_FILE.parent)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        log(f"known_hosts left as it is: cannot read {INVENTORY_FILE}: {exc}")
        return
    services = {service.name: service for service in cluster.services}
    wanted: dict[Path, dict[str, str | None]] = {}
    for target in targets:
        if target.host not in services:
            continue
        key = None if keys_gone else container_host_key(services[target.host])
        if key is None and not keys_gone:
            log(f"{target.name}: cannot read {services[target.host].container}'s host key")
            continue
        wanted.setdefault(target.file, {})[target.name] = key
    for file, keys in wanted.items():
        shown = os.path.relpath(file)
        if not file.exists():
            if not keys_gone:
                log(f"{shown}: not there yet (orchestrate records the host keys at first contact)")
            continue
        before = file.read_text()
        text, done = update_known_hosts(before, keys)
        if text != before:
            write_keeping_mode(file, text)
        by_action: dict[str, list[str]] = {}
        for name, (action, recorded) in done.items():
            by_action.setdefault(action, []).append(name)
            if action == "replaced":
                old = ", ".join(fingerprint(key) for key in recorded)
                log(
                    f"{shown}: {name} has a new host key: replaced the recorded {old} with"
                    f" {fingerprint(str(keys[name]))}"
                )
        if by_action.get("removed"):
            log(f"{shown}: removed {', '.join(by_action['removed'])} (their host keys are gone)")
        if by_action.get("unchanged"):
            log(f"{shown}: {', '.join(by_action['unchanged'])}: the recorded host keys are right")
        if by_action.get("absent"):
            what = "nothing to remove" if keys_gone else "orchestrate records them at first contact"
            log(f"{shown}: {', '.join(by_action['absent'])} not recorded ({what})")


def make_client_key() -> None:
    """docker/client_key(.pub); under sudo, owned by the user who ran it: orchestrate, run as that
    user, reads the private key."""
    subprocess.run(["sh", str(MAKE_CLIENT_KEY)], check=True, stdout=subprocess.DEVNULL)
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if uid and gid and uid.isdigit() and gid.isdigit():
        for path in (DOCKER_DIR / "client_key", DOCKER_DIR / "client_key.pub"):
            os.chown(path, int(uid), int(gid))


def up(cluster: Cluster, ca_files: Sequence[Path] | None, stand_in: bool) -> None:
    if os.geteuid() != 0:
        raise ClusterError("must run as root: it starts dockerd and builds images")
    built = dockerd_and_image(cluster, ca_files, stand_in)
    make_client_key()
    ensure_network(cluster)
    for service in cluster.services:
        ensure_container(cluster, service, built)
    wait_for_sshd(cluster)
    sync_known_hosts(cluster, keys_gone=False)
    inventory = os.path.relpath(INVENTORY_FILE)
    hosts = ", ".join(f"{s.name} {s.address}" for s in cluster.services)
    print(f"cluster up: {hosts}\nnext: orchestrate check {inventory}", flush=True)


def leftovers(cluster: Cluster) -> list[str]:
    """What `down` should have removed and is still there."""
    found: list[str] = []
    if docker_answers():
        found += [f"container {c}" for c in containers(cluster)]
        if docker("network", "inspect", cluster.network, check=False).returncode == 0:
            found.append(f"network {cluster.network}")
    dockerd = our_dockerd()
    if dockerd is not None:
        found.append(f"dockerd pid {dockerd.pid}")
    if link_exists("docker0") and not dockerd_processes():
        found.append("link docker0")
    return found


def down(cluster: Cluster, volumes: bool, images: bool) -> None:
    if os.geteuid() != 0:
        raise ClusterError("must run as root: it stops dockerd")
    if images and not docker_answers():
        start_dockerd()  # images can only be removed through a dockerd; stopped again below
    if docker_answers():
        ids = containers(cluster)
        if ids:
            docker("rm", "--force", "--volumes", *ids)
            log(f"removed {len(ids)} container(s)")
        if docker("network", "inspect", cluster.network, check=False).returncode == 0:
            docker("network", "rm", cluster.network)
            log(f"removed network {cluster.network}")
        if volumes:
            present = [v for v in cluster.volumes if volume_exists(v)]
            if present:
                docker("volume", "rm", *present)
                log(f"removed {len(present)} volume(s)")
            sync_known_hosts(cluster, keys_gone=True)
        if images:
            # Ours: the worker image (old builds too) and the stand-ins, never a real base image.
            for label in (f"{LABEL}={cluster.project}", STAND_IN_LABEL):
                pruned = docker("image", "prune", "--all", "--force", "--filter", f"label={label}")
                # prune lists "untagged: NAME" per image and one "deleted: ID" per layer.
                names = [line.split(": ", 1)[1] for line in pruned.stdout.splitlines()
                         if line.startswith("untagged: ")]  # fmt: skip
                if names:
                    log(f"removed the images {', '.join(names)}")
            docker("builder", "prune", "--all", "--force")
    stop_dockerd()
    # A dockerd started without --bridge=none leaves docker0 behind when it stops.
    if link_exists("docker0") and not dockerd_processes():
        subprocess.run(["ip", "link", "delete", "docker0"], check=True)
        log("deleted docker0")
    left = leftovers(cluster)
    if left:
        raise ClusterError(f"still there after down: {', '.join(left)}")
    print("cluster down: no containers, network or dockerd of ours left", flush=True)


def status(cluster: Cluster) -> int:
    if not docker_answers():
        print("no dockerd answers")
        return 1
    dockerd = our_dockerd()
    print(f"dockerd: started by cluster.sh, pid {dockerd.pid}" if dockerd else "dockerd: not ours")
    result = docker("ps", "--all", "--filter", f"label={LABEL}={cluster.project}",
                    "--format", "{{.Names}}\t{{.Status}}")  # fmt: skip
    print(result.stdout.strip() or "no containers")
    return 0 if len(containers(cluster, all_states=False)) == len(cluster.services) else 1


@contextlib.contextmanager
def errors_reported() -> Iterator[None]:
    try:
        yield
    except ClusterError as exc:
        log(f"error: {exc}")
        raise SystemExit(1) from None


def _add_image_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stand-in-base",
        action="store_true",
        help="if the Dockerfile's base image is missing, build a stand-in from Debian packages"
        " (debootstrap from this machine's apt mirror) instead of pulling it",
    )
    parser.add_argument(
        "--extra-ca",
        action="append",
        type=Path,
        metavar="FILE",
        help="PEM CA certificate the image trusts (repeatable); default: the certificates in"
        f" {LOCAL_CA_DIR}",
    )
    parser.add_argument(
        "--no-extra-ca", action="store_true", help="add no CA certificate to the image"
    )


def build_only(cluster: Cluster, ca_files: Sequence[Path] | None, stand_in: bool) -> None:
    if os.geteuid() != 0:
        raise ClusterError("must run as root: it starts dockerd and builds images")
    dockerd_and_image(cluster, ca_files, stand_in)
    print(f"image {cluster.image} built; next: docker/cluster.sh up", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="docker/cluster.sh",
        description="The docker/compose.yaml cluster with plain `docker run`, from nothing and"
        " back to nothing (as root).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser(
        "up", help="start dockerd, build the image, start the containers (idempotent)"
    )
    build_parser = commands.add_parser(
        "build", help="start dockerd and build the image (and the stand-in base), no containers"
    )
    for image_parser in (up_parser, build_parser):
        _add_image_options(image_parser)
    down_parser = commands.add_parser(
        "down", help="remove the containers and network, stop the dockerd that up started"
    )
    down_parser.add_argument(
        "--volumes", action="store_true", help="also remove the volumes (host keys, work dirs)"
    )
    down_parser.add_argument(
        "--images", action="store_true", help="also remove the images and the build cache"
    )
    commands.add_parser("status", help="show the containers; exit 1 unless all run")
    args = parser.parse_args(argv)
    with errors_reported():
        cluster = load_cluster()
        if args.command in ("up", "build"):
            ca_files: list[Path] | None = [] if args.no_extra_ca else args.extra_ca
            (up if args.command == "up" else build_only)(cluster, ca_files, args.stand_in_base)
        elif args.command == "down":
            down(cluster, args.volumes, args.images)
        else:
            return status(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
