"""Inventory files for a NamespaceCluster, so tests and scripts point orchestrate at its hosts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.cluster.netns import NamespaceCluster

DEFAULT_PORT = 20000  # the same TensorFlow port on every host: each namespace has its own


def host_entries(cluster: NamespaceCluster, **overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """One inventory host per cluster host, each with its own workdir (they share one disk)."""
    entries = []
    for host in cluster.hosts:
        entry = {"name": host.name, "address": host.address, "workdir": str(host.workdir)}
        entry.update(overrides.get(host.name, {}))
        entries.append(entry)
    return entries


def write_inventory(
    path: Path,
    cluster: NamespaceCluster,
    job: dict[str, Any],
    *,
    defaults: dict[str, Any] | None = None,
    hosts: list[dict[str, Any]] | None = None,
) -> Path:
    settings = {
        "ssh_user": "root",
        "ssh_key": str(cluster.client_key_path),
        "ssh_known_hosts": str(cluster.known_hosts_path),
        "python": sys.executable,  # the namespaces share this machine's file system
        "port": DEFAULT_PORT,
        "ssh_connect_timeout": 3,
        **(defaults or {}),
    }
    lines = "\n".join(f"  - {json.dumps(h)}" for h in (hosts or host_entries(cluster)))
    path.write_text(f"defaults: {json.dumps(settings)}\nhosts:\n{lines}\njob: {json.dumps(job)}\n")
    return path
