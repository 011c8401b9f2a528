"""Firewall rules as data: the tools they are written for and one host's commands. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.model.inventory import WorkerSlot

FORMATS = ("iptables", "nftables", "ufw", "firewalld")


@dataclass(frozen=True)
class HostRules:
    host: WorkerSlot
    sources: tuple[str, ...]  # addresses allowed to reach the TensorFlow port
    commands: tuple[str, ...]
