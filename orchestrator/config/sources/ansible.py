"""`ansible:` as a host source: the workers are the hosts of a group of an Ansible inventory.

ansible-core's own InventoryManager and VariableManager read the inventory (an optional extra,
the `ansible` extra), so host ranges (`gpu[01:04]`), children groups, group_vars/host_vars
and templated variables mean exactly what they mean to Ansible; no INI parser of our own.

Each host becomes an inventory host entry and goes through the same checks as a `hosts:` entry:

    inventory_hostname            -> name
    ansible_host                  -> address (else the inventory hostname)
    {port_var} (default tf_port)  -> port   (else `port` under this inventory's `defaults:`)
    ansible_port                  -> ssh_port
    ansible_user                  -> ssh_user
    ansible_ssh_private_key_file  -> ssh_key
    ansible_python_interpreter    -> python (auto, auto_silent, ...: our default)
    ansible_connection: local     -> connection: local
    orchestrate_KEY               -> KEY, for any other host key (orchestrate_workdir, ...)
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

from orchestrator.boundedread import ANSIBLE_FILE_CAP, ANSIBLE_FILES_CAP, check_tree
from orchestrator.config.report import Report
from orchestrator.config.sources.base import HostSource, Placed, RoleRule
from orchestrator.config.sources.hosts import host_keys, parse_host
from orchestrator.contract import install_hint
from orchestrator.paths import controller_path
from orchestrator.values import Key, key_names, string
from orchestrator.yamlsource import LineMap

ANSIBLE_HINT = install_hint("ansible")
# `ansible:`'s keys; the manual's key reference is written from these entries.
ANSIBLE_KEY_ENTRIES: tuple[Key, ...] = (
    Key("inventory", "string (a path on this machine)", "required",
        "an INI or YAML file, or a directory, read by ansible-core; relative to the inventory"),
    Key("group", "string", "`all`", "the group whose hosts are the workers, in Ansible's order, "
        "chief first"),
    Key("port_var", "string", "`tf_port`",
        "the Ansible variable that holds each host's TensorFlow port; else `port` under "
        "`defaults:`"),
)  # fmt: skip
ANSIBLE_KEYS = key_names(ANSIBLE_KEY_ENTRIES)
DIRECT = {
    "ansible_port": "ssh_port",
    "ansible_user": "ssh_user",
    "ansible_ssh_private_key_file": "ssh_key",
}
AUTO_INTERPRETERS = ("auto", "auto_silent", "auto_legacy", "auto_legacy_silent")
# Ansible's connection plugins -> our connection kinds (anything else is rejected by the checker).
CONNECTIONS = {"ssh": "ssh", "paramiko": "ssh", "smart": "ssh", "local": "local"}
_DIGITS = re.compile(r"^\d+$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class AnsibleInventoryError(Exception):
    """Ansible could not read the inventory; the message is Ansible's own."""


class MissingGroup(Exception):
    def __init__(self, groups: list[str]) -> None:
        super().__init__(", ".join(groups))
        self.groups = groups


def parse_ansible(
    document: LineMap, defaults: LineMap, report: Report, base: Path
) -> tuple[list[Placed], None]:
    """The host source's entry point (its SOURCE's parser): the workers, no scheduler."""
    return _ansible_hosts(document, defaults, report, base), None


def _ansible_hosts(
    document: LineMap, defaults: LineMap, report: Report, base: Path
) -> list[Placed]:

    block = document["ansible"]
    line = document.key_lines.get("ansible")
    if not isinstance(block, LineMap):
        report.add(line, "ansible", "expected a mapping with 'inventory' (and 'group', "
                   "'port_var')")  # fmt: skip
        return []
    report.unknown_keys(block, ANSIBLE_KEYS, "ansible")
    values = {}
    for key, default in (("inventory", None), ("group", "all"), ("port_var", "tf_port")):
        value, problem = string(block.get(key, default))
        if problem:
            report.add(block.key_lines.get(key, block.line), f"ansible.{key}",
                       problem + ("; the path of an Ansible inventory (file or directory)"
                                  if key == "inventory" else ""))  # fmt: skip
            return []
        values[key] = value
    where_line = block.key_lines.get("inventory", block.line)
    path = controller_path(values["inventory"], base)
    if not path.exists():
        report.add(where_line, "ansible.inventory", f"no such file or directory: {path}")
        return []
    refused = _unreadable(path)
    if refused:
        report.add(where_line, "ansible.inventory", refused)
        return []
    try:
        found = read_hosts(path, values["group"], values["port_var"])
    except ImportError:
        report.add(line, "ansible", "needs ansible-core to read Ansible inventories: "
                   + ANSIBLE_HINT)  # fmt: skip
        return []
    except AnsibleInventoryError as exc:
        report.add(where_line, "ansible.inventory", f"Ansible cannot read {path}: {exc}")
        return []
    except MissingGroup as exc:
        report.add(block.key_lines.get("group", block.line), "ansible.group",
                   f"no group {values['group']!r} in {path}; its groups: "
                   f"{', '.join(exc.groups)}")  # fmt: skip
        return []
    if not found:
        report.add(block.key_lines.get("group", block.line), "ansible.group",
                   f"group {values['group']!r} of {path} has no hosts")  # fmt: skip
        return []
    return _placed(found, block, port_var=values["port_var"], defaults=defaults, report=report,
                   base=base)  # fmt: skip


def _placed(
    found: list[tuple[str, dict[str, Any]]], block: LineMap, *, port_var: str,
    defaults: LineMap, report: Report, base: Path,
) -> list[Placed]:  # fmt: skip
    """The Ansible hosts read from the `ansible:` block's inventory, as the inventory's workers."""
    where_line = block.key_lines.get("inventory", block.line)
    placed: list[Placed] = []
    known = host_keys()
    for name, variables in found:
        where = f"ansible[{name}]"
        entry = host_entry(name, variables, port_var, known)
        entry.line = block.line
        if "port" not in entry and "port" not in defaults:
            report.add(where_line, f"{where}.port", f"missing; set the host variable "
                       f"{port_var!r} in the Ansible inventory, or 'port' under "
                       "defaults:")  # fmt: skip
            continue
        host = parse_host(entry, defaults, report, where, base)
        if host is not None:
            placed.append((where, where_line, host))
    return placed


def host_entry(name: str, variables: dict[str, Any], port_var: str, known: Any) -> LineMap:
    """One host's Ansible variables as an inventory host entry. Pure."""
    entry = LineMap()
    entry["name"] = name
    entry["address"] = variables.get("ansible_host") or name
    if port_var in variables:
        entry["port"] = _number(variables[port_var])
    for ansible_key, key in DIRECT.items():
        if ansible_key in variables:
            entry[key] = _number(variables[ansible_key]) if key == "ssh_port" else \
                variables[ansible_key]  # fmt: skip
    python = variables.get("ansible_python_interpreter")
    if python is not None and str(python) not in AUTO_INTERPRETERS:
        entry["python"] = python
    connection = variables.get("ansible_connection")
    if connection is not None:
        entry["connection"] = CONNECTIONS.get(str(connection), f"ansible_connection={connection}")
    for variable, value in variables.items():
        if variable.startswith("orchestrate_") and variable[len("orchestrate_") :] in known:
            entry[variable[len("orchestrate_") :]] = value
    return entry


def _number(value: Any) -> Any:
    # INI values that look like numbers are numbers to Ansible; templated ones come back as text.
    return int(value) if isinstance(value, str) and _DIGITS.fullmatch(value) else value


MAPPED = ("ansible_host", *DIRECT, "ansible_python_interpreter", "ansible_connection")


def _unreadable(path: Path) -> str | None:
    """Why Ansible must not read the inventory at `path`: it reads whatever it finds (a fifo
    blocks it, a device fills memory). Beside a file inventory it reads group_vars/ and
    host_vars/ too (a directory's own are inside it)."""
    beside = () if path.is_dir() else (path.parent / "group_vars", path.parent / "host_vars")
    try:
        for tree in (path, *(found for found in beside if found.exists())):
            check_tree(tree, ANSIBLE_FILE_CAP, ANSIBLE_FILES_CAP)
    except OSError as exc:
        return f"cannot read {exc.filename}: {exc.strerror or exc}"
    return None


def read_hosts(path: Path, group: str, port_var: str) -> list[tuple[str, dict[str, Any]]]:
    """The hosts of `group` in Ansible's order with their variables (group_vars, host_vars and
    templates resolved). Raises ImportError without ansible-core."""
    from ansible import constants
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    captured = io.StringIO()
    # Ansible reports parse failures as warnings on the terminal and then raises a generic
    # error: keep what it printed, it is the useful part.
    with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
        constants.INVENTORY_ANY_UNPARSED_IS_FAILED = True
        wanted = {*MAPPED, port_var}
        loader = DataLoader()
        try:
            manager = InventoryManager(loader=loader, sources=[str(path)])
            if group not in manager.groups:
                raise MissingGroup(sorted(manager.groups))
            variables = VariableManager(loader=loader, inventory=manager)
            found = []
            for host in manager.groups[group].get_hosts():
                values = variables.get_vars(host=host, include_hostvars=False)
                templar = Templar(loader=loader, variables=values)
                # Only what we map is templated: another variable may need a play's context.
                mapped = {k: templar.template(v) for k, v in values.items()
                          if k in wanted or k.startswith("orchestrate_")}  # fmt: skip
                found.append((host.name, mapped))
        except AnsibleError as exc:
            raise AnsibleInventoryError(_ansible_message(exc, captured.getvalue())) from exc
    return found


def _ansible_message(exc: Exception, printed: str) -> str:
    plain = _ANSI.sub("", printed)  # Ansible colours its output when it thinks it may
    said = [line.removeprefix("[WARNING]:").strip() for line in plain.splitlines()
            if line.startswith("[WARNING]:")]  # fmt: skip
    details = list(dict.fromkeys(said))[:4]
    message = getattr(exc, "message", None) or str(exc)
    return "; ".join([*details, message]) if details else message


SOURCE = HostSource(
    Key("ansible", "mapping (`ansible:` keys)", "",
        "the workers from an Ansible inventory, read by ansible-core"),
    parse_ansible,
    blocks=(("ansible", "an Ansible inventory instead of `hosts:` (the `ansible` extra)",
             ANSIBLE_KEY_ENTRIES),),
    roles=RoleRule(
        strategy="parameter-server needs roles, which an Ansible inventory lacks; list them in "
        "'hosts:'",
        host="{role}: the hosts of an Ansible inventory are all workers; list the hosts with "
        "'hosts:' to give them roles",
    ),
)  # fmt: skip
