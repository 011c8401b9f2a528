"""Firewall commands that open each host's TensorFlow port to the other cluster hosts only. Pure.

The TensorFlow gRPC port is unauthenticated: anyone who can reach it can join or disturb the job,
so it is opened to the cluster's own addresses (and the host itself), never to the world. Accept
rules alone close nothing on a host whose INPUT policy is ACCEPT (most machines without a
configured firewall), so each host's block ends with a rule that drops the port for everyone
else, placed after the accepts.
"""

from __future__ import annotations

import ipaddress

from orchestrator.machines.kinds import kind_of
from orchestrator.model.firewall import FORMATS, HostRules
from orchestrator.model.inventory import Inventory


def _is_ipv6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 6
    except ValueError:
        return False


Ports = int | tuple[int, int]  # one port, or `port: auto`'s range


def _spec(fmt: str, port: Ports) -> str:
    """A port, or a range as each tool writes one (iptables and ufw LOW:HIGH, else LOW-HIGH)."""
    if isinstance(port, int):
        return str(port)
    return f"{port[0]}{':' if fmt in ('iptables', 'ufw') else '-'}{port[1]}"


def _rule(fmt: str, source: str, ports: Ports, position: int = 1) -> str:
    v6 = _is_ipv6(source)
    port = _spec(fmt, ports)
    if fmt == "iptables":
        # -I at fixed positions: the ACCEPTs, in order, before any DROP/REJECT in the chain.
        tool = "ip6tables" if v6 else "iptables"
        return f"{tool} -I INPUT {position} -p tcp -s {source} --dport {port} -j ACCEPT"
    if fmt == "nftables":
        family = "ip6" if v6 else "ip"
        return f"nft insert rule inet filter input {family} saddr {source} tcp dport {port} accept"
    if fmt == "ufw":
        return f"ufw allow proto tcp from {source} to any port {port}"
    family = "ipv6" if v6 else "ipv4"
    rich = (
        f'rule family="{family}" source address="{source}" port port="{port}" protocol="tcp" accept'
    )
    return f"firewall-cmd --permanent --add-rich-rule='{rich}'"


def _drops(fmt: str, ports: Ports, sources: list[str]) -> list[str]:
    """The port closed to every source the accepts did not name: evaluated after them."""
    port = _spec(fmt, ports)
    families = sorted({_is_ipv6(source) for source in sources}) or [False]
    if fmt == "iptables":
        # Right below this port's ACCEPTs (-I at the next position), so an ACCEPT-all further
        # down the chain cannot shadow it; a position per family, as the chains are separate.
        rules = []
        for v6 in families:
            tool = "ip6tables" if v6 else "iptables"
            count = sum(1 for source in sources if _is_ipv6(source) == v6)
            rules.append(f"{tool} -I INPUT {count + 1} -p tcp --dport {port} -j DROP")
        return rules
    if fmt == "nftables":
        return [f"nft add rule inet filter input tcp dport {port} drop"]  # appended: after
    if fmt == "ufw":
        return [f"ufw deny proto tcp to any port {port}"]  # ufw matches rules in order
    # Rich rules of priority 0 run deny before allow; a positive priority runs after them.
    return [
        f'firewall-cmd --permanent --add-rich-rule=\'rule family="{"ipv6" if v6 else "ipv4"}" '
        f'priority="32767" port port="{port}" protocol="tcp" drop\''
        for v6 in families
    ]


def _preamble(fmt: str) -> list[str]:
    if fmt == "nftables":
        # `add` is a no-op for a table or chain that exists already.
        return [
            "nft add table inet filter",
            "nft add chain inet filter input '{ type filter hook input priority 0; }'",
        ]
    return []


def _epilogue(fmt: str) -> list[str]:
    return ["firewall-cmd --reload"] if fmt == "firewalld" else []


def host_rules(inventory: Inventory, fmt: str, controller: str | None = None) -> list[HostRules]:
    """Per host: accept its TensorFlow port from every cluster address (itself included: a worker
    also dials its own address) and its SSH port from the controller."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown firewall format {fmt!r}; expected one of {', '.join(FORMATS)}")
    addresses = list(dict.fromkeys(h.address for h in inventory.hosts))
    result = []
    for host in inventory.hosts:
        commands = _preamble(fmt)
        # port: auto: the whole range, since the port is leased only at `up`.
        port: Ports = host.port_range or host.port
        what = f"ports {_spec('nftables', port)} (port: auto)" if host.port_range else \
            f"port {host.port}"  # fmt: skip
        commands.append(f"# TensorFlow {what} from the cluster's hosts only")
        positions: dict[bool, int] = {}
        for source in addresses:
            family = _is_ipv6(source)
            positions[family] = positions.get(family, 0) + 1
            commands.append(_rule(fmt, source, port, positions[family]))
        commands.append("# ... and from nowhere else (an ACCEPT policy would let anyone in)")
        commands += _drops(fmt, port, addresses)
        login_port = kind_of(host).login_port(host)
        if controller and login_port:
            commands.append("# SSH from the controller (skip if it is open already)")
            commands.append(_rule(fmt, controller, login_port))
        commands += _epilogue(fmt)
        result.append(HostRules(host, tuple(addresses), tuple(commands)))
    return result


def reaches(address: str, port: int, timeout: float) -> bool:
    """Whether this machine can open a TCP connection to address:port within `timeout`."""
    import socket

    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def controller_towards(inventory: Inventory) -> str | None:
    """This machine's address as the first host it logs in to sees it (for the SSH rule); None
    when it logs in to none."""
    remote = [h for h in inventory.hosts if kind_of(h).login_port(h)]
    return controller_address(remote[0].address) if remote else None


def controller_address(target: str) -> str | None:
    """The source address this machine uses towards `target`. A UDP connect sends no packet:
    it only asks the kernel's routing table."""
    import socket

    family = socket.AF_INET6 if _is_ipv6(target) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None
