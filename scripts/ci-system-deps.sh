#!/usr/bin/env bash
# Install the Debian packages the root-only integration tests need: sshd, iproute2 and
# iptables for the network-namespace hosts (tests/integration/test_netns_cluster.py,
# tests/cluster/); Docker's engine and debootstrap for the container cluster
# (tests/integration/test_docker_cluster.py, docker/cluster.sh); Slurm and munge for the Slurm
# tests (tests/integration/test_slurm.py, tests/cluster/slurm.py); Chromium and its driver for
# the dashboard's browser test; python3-venv for the unprivileged unit-test run;
# rsync for `sync:` (rsync over OpenSSH; both ends need it).
#
# Idempotent: installs only what is missing and never starts a system service (sshd,
# dockerd). The tests start their own sshd inside each network namespace, and
# docker/cluster.sh starts dockerd with the flags that leave the namespace bridges alone.
#
# Usage (as root, Debian/Ubuntu): scripts/ci-system-deps.sh
set -euo pipefail

# docker.io is Debian's engine and CLI (20.10, with BuildKit built in); debootstrap builds the
# stand-in base image, as no image registry is reachable in CI. chromium + chromium-driver:
# the dashboard test drives a real headless browser. slurmctld slurmd slurm-client munge: a
# real Slurm cluster; the policy-rc.d below keeps their services from starting.
readonly PACKAGES=(
    openssh-server openssh-client iproute2 iptables procps shellcheck python3-venv
    docker.io debootstrap chromium chromium-driver rsync
    slurmctld slurmd slurm-client munge util-linux
)
readonly POLICY_RC=/usr/sbin/policy-rc.d

if [[ "$(id -u)" -ne 0 ]]; then
    echo "ci-system-deps: must run as root (it installs packages and creates /run/sshd)" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ci-system-deps: apt-get not found; this script supports Debian/Ubuntu only" >&2
    exit 1
fi

missing_packages() {
    local pkg
    for pkg in "${PACKAGES[@]}"; do
        # dpkg-query prints "install ok installed" only for a fully installed package.
        if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" != "install ok installed" ]]
        then
            echo "$pkg"
        fi
    done
}

# Installing openssh-server (or docker.io) runs its postinst, which starts the system sshd (or
# dockerd, with iptables rules that cut the namespace bridges) through
# invoke-rc.d/deb-systemd-invoke unless a policy-rc.d forbids it (exit 101). Provide a
# temporary one when the machine has none, and remove it again afterwards.
temporary_policy=0
remove_temporary_policy() {
    if [[ "$temporary_policy" -eq 1 ]]; then
        rm -f "$POLICY_RC"
    fi
}
trap remove_temporary_policy EXIT

mapfile -t missing < <(missing_packages)
action="nothing to install"
if [[ "${#missing[@]}" -gt 0 ]]; then
    if [[ ! -e "$POLICY_RC" ]]; then
        printf '#!/bin/sh\n# temporary, from ci-system-deps.sh: do not start services\nexit 101\n' \
            >"$POLICY_RC"
        chmod 755 "$POLICY_RC"
        temporary_policy=1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    action="installed ${missing[*]}"
    # What this script added to the machine, for scripts/make-cold.sh (a cold run's measure).
    mkdir -p /var/lib/orchestrate-ci
    printf '%s\n' "${missing[@]}" >>/var/lib/orchestrate-ci/installed-packages
fi

# sshd refuses to start without its privilege-separation directory; /run is a tmpfs on most
# systems, so it has to be recreated after every boot.
mkdir -p /run/sshd
chmod 755 /run/sshd

# With UsePAM no (as the tests configure it) sshd treats a shadow password starting with "!"
# as a locked account and refuses even key logins; some images ship root that way. "*" keeps
# password login impossible but lets key authentication through.
root_note=""
if [[ "$(getent shadow root | cut -d: -f2)" == '!'* ]]; then
    usermod -p '*' root
    root_note="; unlocked root for key-only login (password field '!' -> '*')"
fi

echo "ci-system-deps: ${action}; /run/sshd ready${root_note}; no system sshd or dockerd started"
