"""docker/: the compose file, its inventory, the Dockerfile and the scripts agree with each other.

No Docker engine is needed: the files are parsed and cross-checked, the inventory is loaded with
orchestrate's own loader, docker/cluster.py's translation of compose.yaml into `docker run` is
checked as a pure function, and the shell scripts are syntax-checked.
tests/integration/test_docker_entrypoint.py runs the entry point itself;
tests/integration/test_docker_cluster.py builds the image and trains across the containers.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from orchestrator.backends.registry import load_inventory
from orchestrator.machines.sshsettings import SshSettings
from orchestrator.model.inventory import Inventory

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
SCRIPTS = ("entrypoint.sh", "make-client-key.sh", "cluster.sh")


# --------------------------------------------------------------------------- parsing helpers


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined, comments gone."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in (DOCKER / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment between continuation lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends in a continuation line"
    return instructions


def instruction_args(keyword: str) -> list[str]:
    return [rest for key, rest in dockerfile_instructions() if key == keyword]


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in instruction_args("ENV"):
        for word in shlex.split(rest):
            name, _, value = word.partition("=")
            env[name] = value
    return env


def exposed_ports() -> set[int]:
    return {int(word.split("/")[0]) for rest in instruction_args("EXPOSE") for word in rest.split()}


def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def worker_services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def network_of(service: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((name, settings),) = service["networks"].items()
    return name, settings


def volume_targets(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {volume["target"]: volume for volume in service["volumes"]}


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    # Must load without a single problem. ssh_key is a controller path that only
    # make-client-key.sh creates; the loader resolves it but does not require the file.
    return load_inventory(DOCKER / "inventory.yaml")


# --------------------------------------------------------------------------- inventory vs compose


def test_inventory_hosts_are_the_compose_services_one_to_one(inventory: Inventory) -> None:
    services = worker_services()
    assert [host.name for host in inventory.hosts] == list(services)
    assert len(inventory.hosts) == 3
    for host in inventory.hosts:
        _, settings = network_of(services[host.name])
        assert host.address == settings["ipv4_address"], host.name
        assert host.connection == "ssh"


def test_addresses_lie_in_the_compose_network(inventory: Inventory) -> None:
    document = compose()
    networks = document["networks"]
    for host in inventory.hosts:
        name, _ = network_of(document["services"][host.name])
        assert networks[name]["driver"] == "bridge"
        (ipam,) = networks[name]["ipam"]["config"]
        subnet = ipaddress.ip_network(ipam["subnet"])
        address = ipaddress.ip_address(host.address)
        assert address in subnet, f"{host.name}: {address} is outside {subnet}"
        assert address not in (subnet.network_address, subnet.broadcast_address)
        assert address != ipaddress.ip_address(ipam["gateway"]), "the gateway is the host machine"
        assert subnet.is_private
    assert len({host.address for host in inventory.hosts}) == len(inventory.hosts)


def test_tensorflow_port_is_the_one_the_image_exposes(inventory: Inventory) -> None:
    tf_ports = exposed_ports() - {22}
    assert tf_ports == {20000}
    assert {host.port for host in inventory.hosts} == tf_ports


def test_ssh_settings_match_the_image(inventory: Inventory) -> None:
    env = dockerfile_env()
    services = worker_services()
    (user_run,) = [rest for rest in instruction_args("RUN") if "useradd" in rest]
    for host in inventory.hosts:
        service = services[host.name]
        user = service["environment"]["SSH_USER"]
        assert isinstance(host.settings, SshSettings)
        assert host.settings.ssh_user == user == env["SSH_USER"]
        assert re.search(rf"useradd .*\b{user}\b", user_run)
        assert f"usermod -p '*' {user}" in user_run  # not locked: sshd (UsePAM no) takes keys
        assert host.settings.ssh_port == int(env["SSHD_PORT"]) == 22
        assert 22 in exposed_ports()
        # The key: the controller holds docker/client_key; compose mounts its .pub read-only
        # where the entry point reads the authorized keys.
        assert host.settings.ssh_key == str(DOCKER / "client_key")
        volumes = volume_targets(service)
        key_mount = volumes[service["environment"]["AUTHORIZED_KEYS_FILE"]]
        assert key_mount["target"] == env["AUTHORIZED_KEYS_FILE"]
        assert key_mount["type"] == "bind"
        assert key_mount["read_only"] is True
        assert key_mount["bind"]["create_host_path"] is False
        assert (DOCKER / key_mount["source"]).resolve() == Path(host.settings.ssh_key + ".pub")
        # Fresh containers have keys never seen before; a volume keeps them across re-creation.
        assert host.settings.ssh_host_key_policy == "accept-new"
        assert host.settings.ssh_known_hosts == str(DOCKER / "known_hosts")
        assert volumes[env["SSHD_HOST_KEY_DIR"]]["type"] == "volume"
        # The image's Python; ~ of the inventory's workdir is the login user's home.
        assert host.python == "/usr/local/bin/python"
        assert host.workdir == "~/orchestrate"
        assert volumes[f"/home/{user}/orchestrate"]["type"] == "volume"


def test_every_service_builds_the_image_and_has_its_own_volumes() -> None:
    document = compose()
    named: list[str] = []
    for name, service in document["services"].items():
        build = service["build"]
        assert (DOCKER / build["context"]).resolve() == REPO, name
        assert (REPO / build["dockerfile"]).resolve() == DOCKER / "Dockerfile", name
        assert service["image"] == "orchestrate-worker:local"
        assert service["init"] is True, f"{name}: workers re-parented to PID 1 must be reaped"
        assert service["hostname"] == name
        assert "ports" not in service, "nothing is published on the host machine's interfaces"
        named += [v["source"] for v in service["volumes"] if v["type"] == "volume"]
    assert len(named) == len(set(named)), "each container needs its own host keys and workdir"
    assert set(named) == set(document["volumes"])


def test_job_is_the_bundled_example(inventory: Inventory) -> None:
    job = inventory.job
    assert job.task == "worker.examples.shapes:task"
    assert job.steps is not None and 100 <= job.steps <= 1000
    assert job.batch_size % len(inventory.hosts) == 0, "the global batch splits evenly"


def test_generated_files_are_git_ignored() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(path: str) -> bool:
        result = subprocess.run(
            ["git", "-C", str(REPO), "check-ignore", "-q", "--no-index", path], check=False
        )
        return result.returncode == 0

    for path in ("docker/client_key", "docker/client_key.pub", "docker/known_hosts"):
        assert ignored(path), path
    for path in ("docker/compose.yaml", "docker/inventory.yaml", "docker/entrypoint.sh"):
        assert not ignored(path), path


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_base_sshd_and_worker_extra() -> None:
    # Two stages: `system` (trust store, sshd, user), then the Python packages on top of it.
    assert instruction_args("FROM") == ["python:3.11-slim AS system", "system"]
    runs = instruction_args("RUN")
    (apt,) = [rest for rest in runs if "apt-get install" in rest]
    assert re.search(r"apt-get install -y --no-install-recommends openssh-server\b", apt)
    assert "rm -f /etc/ssh/ssh_host_*_key" in apt, "build-time host keys would be shared"
    assert "rm -rf /var/lib/apt/lists/*" in apt
    assert any(rest.endswith("pip install --no-cache-dir --find-links /wheels '.[worker]'")
               for rest in runs)  # fmt: skip


WHEELS_MOUNT = "--mount=type=bind,source=docker/wheels,target=/wheels "


def requirements_run() -> str:
    """The RUN that installs the dependencies, its continuation lines' spaces made single."""
    (run,) = [" ".join(rest.split()) for rest in instruction_args("RUN") if "tomllib" in rest]
    return run


def test_dependencies_come_from_docker_wheels_when_it_holds_wheels() -> None:
    # scripts/test.sh fills docker/wheels/ from its own install, so that a cold run downloads
    # TensorFlow once; an empty directory (a user's clone) leaves pip to the index.
    run = requirements_run()
    assert run.startswith(WHEELS_MOUNT), "a bind mount: the wheels add no layer to the image"
    assert "pip install --no-cache-dir --no-index --find-links /wheels -r" in run
    assert "else pip install --no-cache-dir -r /tmp/requirements.txt" in run
    assert (DOCKER / "wheels" / "README.md").is_file(), "a bind mount's source must exist"
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!docker/wheels/" in ignored


def test_the_wheels_test_sh_fetches_are_the_dockerfiles_requirements() -> None:
    run = requirements_run()
    dockerfile_program = re.search(r'python (-c "[^"]+")', run)
    script = (REPO / "scripts" / "test.sh").read_text()
    # test.sh reads pyproject.toml this way for other lists too (the tracking server's)
    script_programs = re.findall(r'\.venv/bin/python (-c "[^"]+")', script)
    assert dockerfile_program and script_programs
    assert dockerfile_program[1] in script_programs


def test_dockerfile_entrypoint_is_docker_entrypoint_sh() -> None:
    copies = {
        words[0]: words[-1]
        for words in (shlex.split(rest) for rest in instruction_args("COPY"))
        if len(words) == 2
    }
    destination = copies["docker/entrypoint.sh"]
    (entrypoint,) = instruction_args("ENTRYPOINT")
    assert json.loads(entrypoint) == [destination]  # exec form: sshd gets the signals
    assert any(f"chmod 0755 {destination}" in rest for rest in instruction_args("RUN"))
    assert instruction_args("CMD") == []


def test_dockerfile_requirements_are_the_worker_extra(tmp_path: Path) -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11 (the image's)")
    run = requirements_run()
    match = re.match(
        r'python (?P<args>-c "[^"]+") > /tmp/requirements\.txt', run.removeprefix(WHEELS_MOUNT)
    )
    assert match, run
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    # Through sh, as Docker runs a shell-form RUN: the quoting is the image's.
    listed = subprocess.run(
        ["sh", "-c", f"{shlex.quote(sys.executable)} {match['args']}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    worker = project["optional-dependencies"]["worker"]
    assert listed == project["dependencies"] + worker
    assert any(req.startswith("tensorflow==") for req in worker)


def test_extra_ca_certificates_come_before_any_download() -> None:
    instructions = dockerfile_instructions()
    keywords = [key for key, _ in instructions]
    arg = instructions.index(("ARG", 'EXTRA_CA_CERTS=""'))
    ca_run = next(i for i, (_, rest) in enumerate(instructions) if "update-ca-certificates" in rest)
    first_download = next(
        i for i, (key, rest) in enumerate(instructions)
        if key == "RUN" and ("apt-get" in rest or "pip install" in rest)
    )  # fmt: skip
    assert keywords.index("FROM") < arg < ca_run < first_download
    # pip trusts the system store (with the extra certificates), not only its bundled certifi.
    assert dockerfile_env()["PIP_CERT"] == "/etc/ssl/certs/ca-certificates.crt"
    # Compose passes the same argument from the environment.
    args = compose()["x-worker"]["build"]["args"]
    assert args == {"EXTRA_CA_CERTS": "${EXTRA_CA_CERTS:-}"}


def test_stand_in_base_provides_what_the_dockerfile_uses() -> None:
    text = (DOCKER / "stand-in-base.Dockerfile").read_text()
    assert "FROM orchestrate-stand-in-rootfs:bookworm" in text
    for needed in ("python3 python3-venv ca-certificates", "python3 -m venv /usr/local"):
        assert needed in text
    assert cluster_module().ROOTFS_IMAGE == "orchestrate-stand-in-rootfs:bookworm"


def _ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    patterns = []
    for raw in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = str(PurePosixPath(line.lstrip("!")))
        regex = ""
        for part in re.split(r"(\*\*/|\*|\?)", pattern):
            regex += {"**/": "(?:.*/)?", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        patterns.append((include, re.compile(regex + "$")))
    return patterns


def in_build_context(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    keep = True
    for include, regex in _ignore_patterns():
        if any(regex.match(candidate) for candidate in candidates):
            keep = include
    return keep


def test_build_context_holds_what_is_copied_and_never_the_private_key() -> None:
    for rest in instruction_args("COPY"):
        *sources, _ = shlex.split(rest)
        for source in sources:
            assert (REPO / source).exists(), source
            assert in_build_context(source), f"COPY {source} is excluded from the context"
    assert in_build_context("orchestrator/config/loader.py")
    assert in_build_context("worker/examples/shapes.py")
    for path in (
        "docker/client_key",
        "docker/client_key.pub",
        "docker/known_hosts",
        ".venv/bin/python",
        ".git/config",
        ".orchestrate/runs.json",
        "worker/__pycache__/train.cpython-311.pyc",
        "tests/conftest.py",
    ):
        assert not in_build_context(path), path


# --------------------------------------------------------------------------- scripts


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_script_syntax(script: str, shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} not installed")
    result = subprocess.run(
        [shell, "-n", str(DOCKER / script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_is_executable_posix_sh(script: str) -> None:
    path = DOCKER / script
    assert path.read_text().startswith("#!/bin/sh\n")
    assert path.stat().st_mode & 0o111, f"chmod +x docker/{script}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_shellcheck(script: str) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    result = subprocess.run(
        [shellcheck, "--shell=sh", str(DOCKER / script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_gives_both_flows() -> None:
    readme = (DOCKER / "README.md").read_text()
    for command in (
        "sh docker/make-client-key.sh",
        "docker compose -f docker/compose.yaml up -d --build",
        "orchestrate check docker/inventory.yaml",
        "orchestrate up docker/inventory.yaml",
        "orchestrate down",
        "docker compose -f docker/compose.yaml down",
    ):
        assert command in readme, command
    assert "docker/cluster.sh up" in readme and "docker/cluster.sh down" in readme


# --------------------------------------------------------------------------- cluster.py


def cluster_module() -> Any:
    """docker/cluster.py, imported from its path (docker/ is not a package)."""
    name = "orchestrate_docker_cluster"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCKER / "cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_cluster_py_runs_each_compose_service_as_one_docker_run() -> None:
    cluster = cluster_module().load_cluster(DOCKER / "compose.yaml")
    document = compose()
    project = document["name"]
    assert cluster.image == "orchestrate-worker:local"
    assert cluster.dockerfile == DOCKER / "Dockerfile" and cluster.context == REPO
    assert cluster.network == f"{project}_cluster"
    assert (cluster.subnet, cluster.gateway) == ("172.28.0.0/24", "172.28.0.1")
    assert [s.name for s in cluster.services] == list(document["services"])
    for service in cluster.services:
        spec = document["services"][service.name]
        args = service.run_args("L=x")
        assert args[:2] == ["run", "--detach"]
        pairs = dict(zip(args[2::2], args[3::2], strict=False))
        assert pairs["--name"] == f"{project}-{service.name}-1"
        assert pairs["--ip"] == spec["networks"]["cluster"]["ipv4_address"]
        assert pairs["--network"] == cluster.network
        assert "--init" in args
        envs = [args[i + 1] for i, a in enumerate(args) if a == "--env"]
        assert envs == sorted(f"{k}={v}" for k, v in spec["environment"].items())
        mounts = [args[i + 1] for i, a in enumerate(args) if a == "--mount"]
        assert mounts[0] == (
            f"type=bind,source={DOCKER / 'client_key.pub'},"
            "target=/run/secrets/authorized_keys,readonly"
        )
        assert f"type=volume,source={project}_{service.name}-host-keys," in mounts[1]
        assert "-p" not in args and "--publish" not in args


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["services"]["worker-1"].update(ports=["2222:22"]), "does not handle"),
        (lambda d: d["services"]["worker-1"]["volumes"][0]["bind"].clear(), "create_host_path"),
        (lambda d: d["services"]["worker-1"].update(image="other:tag"), "same one image"),
        (lambda d: d["x-worker"]["build"]["args"].update(X="1"), "unknown settings"),
        (lambda d: d["networks"].update(extra={"driver": "bridge"}), "one network"),
    ],
)
def test_cluster_py_refuses_what_it_would_silently_drop(edit: Any, message: str) -> None:
    module = cluster_module()
    # YAML's merge key shares the anchor's values: editing x-worker's build edits every service's.
    document = compose()
    edit(document)
    with pytest.raises(module.ClusterError, match=message):
        module.parse_compose(document, DOCKER)


def test_apt_mirror_is_read_from_either_sources_format(tmp_path: Path, monkeypatch: Any) -> None:
    module = cluster_module()
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb [arch=amd64] http://mirror.example/debian/ bookworm main\n")
    deb822 = tmp_path / "sources.list.d"
    deb822.mkdir()
    (deb822 / "debian.sources").write_text("Types: deb\nURIs: http://other.example/debian\n")
    monkeypatch.setattr(module, "APT_SOURCES", (one_line, deb822))
    assert module.apt_mirror() == "http://mirror.example/debian"
    monkeypatch.setattr(module, "APT_SOURCES", (tmp_path / "missing", deb822))
    assert module.apt_mirror() == "http://other.example/debian"
    monkeypatch.setattr(module, "APT_SOURCES", (tmp_path / "missing",))
    assert module.apt_mirror() == module.DEFAULT_MIRROR


def test_extra_ca_files_are_checked(tmp_path: Path) -> None:
    module = cluster_module()
    cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    good = tmp_path / "ca.pem"
    good.write_text(cert)
    assert module.extra_ca_pem([good, good]) == cert + cert
    assert module.extra_ca_pem([]) == ""
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
    with pytest.raises(module.ClusterError, match="private key"):
        module.extra_ca_pem([key])
    (tmp_path / "junk.pem").write_text("hello")
    with pytest.raises(module.ClusterError, match="no PEM certificate"):
        module.extra_ca_pem([tmp_path / "junk.pem"])
    with pytest.raises(module.ClusterError, match="cannot read"):
        module.extra_ca_pem([tmp_path / "absent.pem"])


def test_config_hash_changes_with_the_image_and_the_settings() -> None:
    module = cluster_module()
    first, second, _ = module.load_cluster(DOCKER / "compose.yaml").services
    assert module.config_hash(first, "sha256:a") == module.config_hash(first, "sha256:a")
    assert module.config_hash(first, "sha256:a") != module.config_hash(first, "sha256:b")
    assert module.config_hash(first, "sha256:a") != module.config_hash(second, "sha256:a")


# --------------------------------------------------------------------------- known_hosts


def public_key_line() -> str:
    """A fresh `ssh-ed25519 BASE64`, like the one entrypoint.sh creates in each container."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def hashed(name: str, salt: bytes = b"0123456789abcdefghij") -> str:
    """`name` as HashKnownHosts writes it: |1|base64(salt)|base64(HMAC-SHA1(salt, name))."""
    import base64
    import hmac

    digest = hmac.new(salt, name.encode(), "sha1").digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_known_hosts_of_the_inventory_are_its_addresses_in_docker_known_hosts() -> None:
    module = cluster_module()
    document = yaml.safe_load((DOCKER / "inventory.yaml").read_text())
    found = module.known_hosts_of(document, DOCKER)
    assert [(k.host, k.file, k.name) for k in found] == [
        (host["name"], DOCKER / "known_hosts", host["address"]) for host in document["hosts"]
    ]
    assert module.INVENTORY_FILE == DOCKER / "inventory.yaml"
    # The containers keep entrypoint.sh's default SSHD_HOST_KEY_DIR, where cluster.py reads keys.
    for service in module.load_cluster(DOCKER / "compose.yaml").services:
        assert "SSHD_HOST_KEY_DIR" not in service.environment
    assert f"SSHD_HOST_KEY_DIR:-{module.HOST_KEY_DIR}}}" in (DOCKER / "entrypoint.sh").read_text()
    # Another port is recorded as [address]:port; a host on ~/.ssh/known_hosts is not touched.
    document["hosts"][1]["ssh_port"] = 2222
    document["hosts"][2]["ssh_known_hosts"] = "/elsewhere/known_hosts"
    del document["defaults"]["ssh_known_hosts"]
    found = module.known_hosts_of(document, DOCKER)
    assert [(k.host, str(k.file), k.name) for k in found] == [
        ("worker-2", "/elsewhere/known_hosts", "172.28.0.12")
    ]
    document["defaults"]["ssh_known_hosts"] = "./kh"
    assert module.known_hosts_of(document, DOCKER)[1].name == "[172.28.0.11]:2222"
    assert module.known_hosts_of(document, DOCKER)[0].file == DOCKER / "kh"


def test_fingerprint_is_openssh_sha256_form() -> None:
    import base64

    import paramiko

    from orchestrator.machines.ssh import fingerprint

    line = public_key_line()
    key = paramiko.Ed25519Key(data=base64.b64decode(line.split()[1]))
    assert cluster_module().fingerprint(line + " comment@host") == fingerprint(key)
    assert cluster_module().fingerprint(line).startswith("ssh-ed25519 SHA256:")
    if shutil.which("ssh-keygen"):
        listed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", "-"], input=line,
                                capture_output=True, text=True, check=True)  # fmt: skip
        assert cluster_module().fingerprint(line) == f"ssh-ed25519 {listed.stdout.split()[1]}"


def test_update_known_hosts_replaces_removes_and_leaves_the_rest() -> None:
    module = cluster_module()
    old0, new0, old1, key2, other = (public_key_line() for _ in range(5))
    text = (
        "# my hosts\n"
        f"gpu-a.example {other}\n"
        f"172.28.0.10 {old0}\n"
        f"{hashed('172.28.0.11')} {old1}\n"
        f"@cert-authority 172.28.0.12 {other}\n"
        f"172.28.0.12,shared.example {key2}\n"
        f"[172.28.0.10]:2222 {other}\n"
        "\n"
        f"172.28.0.100 {other}"  # no newline at the end; .100 is not .10
    )
    wanted = {"172.28.0.10": new0, "172.28.0.11": new0, "172.28.0.12": key2, "10.9.9.9": key2}
    updated, done = module.update_known_hosts(text, wanted)
    assert done == {
        "172.28.0.10": ("replaced", [old0]),
        "172.28.0.11": ("replaced", [old1]),
        "172.28.0.12": ("unchanged", [key2]),
        "10.9.9.9": ("absent", []),
    }
    assert updated == (
        "# my hosts\n"
        f"gpu-a.example {other}\n"
        f"172.28.0.10 {new0}\n"
        f"172.28.0.11 {new0}\n"
        f"@cert-authority 172.28.0.12 {other}\n"
        f"172.28.0.12,shared.example {key2}\n"
        f"[172.28.0.10]:2222 {other}\n"
        "\n"
        f"172.28.0.100 {other}\n"
    )
    assert module.update_known_hosts(updated, wanted)[0] == updated  # in step: nothing to do
    # The volumes are gone: every entry of those names goes, a shared line keeps the others.
    wanted_gone = dict.fromkeys(["172.28.0.10", "172.28.0.11", "172.28.0.12", "10.9.9.9"])
    removed, done = module.update_known_hosts(text, wanted_gone)
    assert [action for action, _ in done.values()] == ["removed", "removed", "removed", "absent"]
    assert removed == (
        "# my hosts\n"
        f"gpu-a.example {other}\n"
        f"@cert-authority 172.28.0.12 {other}\n"
        f"shared.example {key2}\n"
        f"[172.28.0.10]:2222 {other}\n"
        "\n"
        f"172.28.0.100 {other}\n"
    )
    # Two keys recorded for one name, one of them right: the stale one goes.
    two = f"172.28.0.10 {old0}\n172.28.0.10 {new0}\n"
    assert module.update_known_hosts(two, {"172.28.0.10": new0}) == (
        f"172.28.0.10 {new0}\n",
        {"172.28.0.10": ("replaced", [old0, new0])},
    )
    # A line shared with another host: that host keeps its entry.
    shared = f"other.example,172.28.0.10 {old0}\n"
    assert module.update_known_hosts(shared, {"172.28.0.10": new0})[0] == (
        f"other.example {old0}\n172.28.0.10 {new0}\n"
    )
    assert module.update_known_hosts("", {"172.28.0.10": None}) == (
        "",
        {"172.28.0.10": ("absent", [])},
    )


def test_write_keeping_mode(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("old\n")
    path.chmod(0o640)
    cluster_module().write_keeping_mode(path, "new\n")
    assert path.read_text() == "new\n"
    assert path.stat().st_mode & 0o7777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["known_hosts"]


def test_sync_known_hosts_after_up_and_after_down_volumes(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    module = cluster_module()
    cluster = module.load_cluster(DOCKER / "compose.yaml")
    document = yaml.safe_load((DOCKER / "inventory.yaml").read_text())
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(yaml.safe_dump(document))
    monkeypatch.setattr(module, "INVENTORY_FILE", inventory_file)
    addresses = [host["address"] for host in document["hosts"]]
    keys = {service.name: public_key_line() for service in cluster.services}
    read: list[str] = []

    def host_key(service: Any) -> str:
        read.append(service.container)
        return keys[service.name]

    monkeypatch.setattr(module, "container_host_key", host_key)
    # No known_hosts yet: nothing is created (orchestrate's accept-new records the keys).
    module.sync_known_hosts(cluster, keys_gone=False)
    assert not (tmp_path / "known_hosts").exists()
    assert "not there yet" in capsys.readouterr().err
    stale = public_key_line()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(
        f"elsewhere.example {stale}\n{addresses[0]} {stale}\n{addresses[1]} {keys['worker-1']}\n"
    )
    known_hosts.chmod(0o600)
    module.sync_known_hosts(cluster, keys_gone=False)
    assert read[-3:] == [service.container for service in cluster.services]
    assert known_hosts.read_text() == (
        f"elsewhere.example {stale}\n{addresses[0]} {keys['worker-0']}\n"
        f"{addresses[1]} {keys['worker-1']}\n"
    )
    assert known_hosts.stat().st_mode & 0o777 == 0o600
    err = capsys.readouterr().err
    shown = os.path.relpath(known_hosts)
    assert (
        f"cluster: {shown}: {addresses[0]} has a new host key: replaced the recorded"
        f" {module.fingerprint(stale)} with {module.fingerprint(keys['worker-0'])}"
    ) in err
    assert f"cluster: {shown}: {addresses[1]}: the recorded host keys are right" in err
    assert f"{addresses[2]} not recorded (orchestrate records them at first contact)" in err
    # down --volumes: the cluster's entries go, the rest stays; no container is asked.
    read.clear()
    module.sync_known_hosts(cluster, keys_gone=True)
    assert read == []
    assert known_hosts.read_text() == f"elsewhere.example {stale}\n"
    assert known_hosts.stat().st_mode & 0o777 == 0o600
    err = capsys.readouterr().err
    assert f"cluster: {shown}: removed {addresses[0]}, {addresses[1]} (their host keys are" in err
