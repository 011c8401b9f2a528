"""The `slurm:` host source: a top-level mapping instead of `hosts:`, validated as strictly.

    slurm:
      nodes: 2                 # N nodes, one worker (task) per node (or roles:)
      roles: {chief: 1, worker: 2, ps: 1}   # optional: tasks by TF_CONFIG type, one per node
      partition: gpu           # optional, as sbatch's --partition
      account: lab             # optional, --account
      time: "2:00:00"          # optional, --time (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]])
      port: 20000              # the TensorFlow gRPC port on every node
      python: python3          # the interpreter on the nodes
      workdir: /shared/me/orchestrate   # on the filesystem every node and this machine see
      gpus_per_node: 1         # optional, --gpus-per-node
      sbatch_args: ["--qos=high", "--exclusive"]   # verbatim #SBATCH lines, never a shell
      login:                   # optional: drive Slurm from a laptop, through a login node
        address: login.hpc.example.org   # or a Host alias of ~/.ssh/config (or ssh_config)
        ssh_user: me           # the same keys as a host's: ssh_port, ssh_key, ssh_known_hosts,
        ssh_key: ~/.ssh/hpc    # ssh_host_key_policy, ssh_connect_timeout, ssh_config
        python: python3        # runs orchestrate's small host programs on the login node

Its workers are named task0..task{N-1}, in SLURM_PROCID order (with `roles:` the chief first, then
the workers, the ps and the evaluator, each the role's count); they run where Slurm puts them, and
the controller reads their files on the shared filesystem from the login node: this machine, or
`login:`'s machine over SSH (every Slurm command then runs there too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config.report import Report, line_of
from orchestrator.config.sources.base import HostSource, Placed
from orchestrator.contract import STRATEGY_PS
from orchestrator.machines import kinds
from orchestrator.model.inventory import (
    DEFAULT_CONNECTION,
    ROLE_CHIEF,
    ROLE_EVALUATOR,
    ROLE_PS,
    ROLE_WORKER,
    Job,
    WorkerSlot,
)
from orchestrator.model.slurm import (
    DEFAULT_PORT,
    LoginNode,
    SlurmSpec,
    end_marker_in,
    end_marker_problem,
)
from orchestrator.paths import controller_path
from orchestrator.values import (
    PORT,
    POSITIVE,
    Checked,
    Checker,
    Key,
    checkers,
    describe,
    integer,
    string,
)
from orchestrator.yamlsource import LineList, LineMap

if TYPE_CHECKING:
    from orchestrator.model.records import SettingsReader

# Slurm's --time formats.
TIME_PATTERN = re.compile(r"^(\d+(:\d{2}){0,2}|\d+-\d+(:\d{2}){0,2})$")
NAME_PART = re.compile(r"^[A-Za-z0-9_.:-]+$")
# Options the batch script sets itself from the inventory: a second value would contradict it.
OWNED_OPTIONS = {
    "-N": "nodes", "--nodes": "nodes", "-n": "nodes", "--ntasks": "nodes",
    "--ntasks-per-node": "nodes", "-p": "partition", "--partition": "partition",
    "-A": "account", "--account": "account", "-t": "time", "--time": "time",
    "--requeue": "", "--no-requeue": "", "-o": "", "--output": "", "-e": "", "--error": "",
    "-a": "", "--array": "", "-J": "", "--job-name": "", "--gpus-per-node": "gpus_per_node",
}  # fmt: skip


def _time(value: Any) -> Checked:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(text, str) and TIME_PATTERN.fullmatch(text):
        return text, None
    return None, (f"expected a Slurm time limit (minutes, MM:SS, HH:MM:SS or D-HH:MM:SS), "
                  f"got {describe(value)}")  # fmt: skip


def _slurm_name(value: Any) -> Checked:
    text, problem = string(value)
    if problem:
        return None, problem
    if not NAME_PART.fullmatch(text):
        return None, f"expected a Slurm name (letters, digits, _ . : -), got {describe(value)}"
    return text, None


def _workdir(value: Any) -> Checked:
    text, problem = string(value)
    if problem:
        return None, problem
    if not (text.startswith("/") or text == "~" or text.startswith("~/")):
        return None, (f"expected an absolute path on the shared filesystem (or ~/...), "
                      f"got {describe(value)}")  # fmt: skip
    return text, None


# `slurm:`'s keys; the manual's key reference is written from these entries.
SLURM_KEY_ENTRIES: tuple[Key, ...] = (
    Key("nodes", "integer, at least 1", "required (or the sum of `roles`)",
        "one worker (task) per node; with `roles`, if given, their sum", POSITIVE),
    Key("roles", "mapping (`slurm.roles:` keys)", "every task a worker",
        "the tasks by TF_CONFIG type, one per node: `{chief: 1, worker: 2, ps: 1}` under "
        "`job.strategy: parameter-server`, or `{worker: 2, evaluator: 1}` beside a multi-worker "
        "job", string),  # a mapping, checked by _roles
    Key("partition", "Slurm name", "", "sbatch's `--partition`", _slurm_name),
    Key("account", "Slurm name", "", "sbatch's `--account`", _slurm_name),
    Key("time", "Slurm time limit", "",
        "sbatch's `--time` (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]])", _time),
    Key("port", "integer, 1 to 65535", f"`{DEFAULT_PORT}`",
        "the TensorFlow gRPC port on every node", PORT),
    Key("python", "string", "`python3`", "the interpreter on the nodes", string),
    Key("workdir", "absolute path (or `~/...`)", "`~/orchestrate`",
        "must be on the filesystem every node (and the login node) sees", _workdir),
    Key("gpus_per_node", "integer, at least 1", "", "sbatch's `--gpus-per-node`", integer(1)),
    Key("sbatch_args", "list of sbatch options", "`[]`",
        "verbatim `#SBATCH` lines, never through a shell (options orchestrate sets itself are "
        "refused)", string),  # checked per item
    Key("login", "mapping (`slurm.login:` keys)", "",
        "drive Slurm from a laptop: every Slurm command and file of the run goes through this "
        "login node over SSH", string),  # a mapping, checked by _login
)  # fmt: skip
SLURM_KEYS: dict[str, Checker] = checkers(SLURM_KEY_ENTRIES)

# `slurm.login:`'s own keys; the SSH kind's keys (machines/kinds/ssh.py) follow them.
LOGIN_KEY_ENTRIES: tuple[Key, ...] = (
    Key("address", "string", "required",
        "the login node: a name, an address, or a Host alias of `~/.ssh/config`", string),
    Key("python", "string", "`python3`",
        "on the login node, for orchestrate's small stdlib programs (the workers use "
        "`slurm.python` on the nodes)", string),
)  # fmt: skip


# `slurm.roles:`'s keys, in task order: TensorFlow's order of a cluster spec (chief, worker, ps),
# the evaluator (in no cluster list) last, as config/roles.chief_first orders hosts.
ROLE_KEY_ENTRIES: tuple[Key, ...] = (
    Key(ROLE_CHIEF, "0 or 1", "`0`",
        "the ParameterServerStrategy chief (task0): it drives the training and checkpoints",
        integer(0, 1)),
    Key(ROLE_WORKER, "integer, at least 0", "`0`",
        "workers: under parameter-server each runs the chief's steps and restarts by itself "
        "(`job.max_worker_restarts`); under multi-worker they are the cluster", integer(0)),
    Key(ROLE_PS, "integer, at least 0", "`0`",
        "parameter servers (parameter-server only): they hold the variables", integer(0)),
    Key(ROLE_EVALUATOR, "0 or 1", "`0`",
        "an evaluator of the chief's checkpoints on the shared filesystem, in no cluster list",
        integer(0, 1)),
)  # fmt: skip
ROLE_KEYS: dict[str, Checker] = checkers(ROLE_KEY_ENTRIES)


def parse_slurm(document: LineMap, report: Report, base: Path) -> SlurmSpec | None:

    block = document.get("slurm")
    if not isinstance(block, LineMap):
        report.add(line_of(document, "slurm"), "slurm",
                   f"expected a mapping with at least 'nodes', got {describe(block)}")  # fmt: skip
        return None
    report.unknown_keys(block, SLURM_KEYS, "slurm")
    before = len(report.problems)
    values = report.checked(block, SLURM_KEYS, "slurm", skip=("sbatch_args", "login", "roles"))
    if "roles" in block:
        values["roles"] = _roles(block, values.get("nodes"), report)
        values.setdefault("nodes", len(values["roles"]))
    elif "nodes" not in block:
        report.add(block.line, "slurm.nodes", "missing; say how many nodes (one worker each)")
    if "sbatch_args" in block:
        values["sbatch_args"] = _sbatch_args(block, report)
    if "login" in block:
        values["login"] = _login(block, report, base)
    for key in ("defaults", "spares"):
        if key in document:
            report.add(line_of(document, key), key,
                       "applies to 'hosts:'; with 'slurm:' Slurm chooses the nodes")  # fmt: skip
    if len(report.problems) > before:
        return None
    return SlurmSpec(**values)


def _roles(block: LineMap, nodes: int | None, report: Report) -> tuple[str, ...]:
    """`slurm.roles:` as each task's role, in task order (ROLE_KEY_ENTRIES'); what the roles
    mean for the job (its strategy) is config/roles.py's to check."""
    raw = block["roles"]
    if not isinstance(raw, LineMap):
        report.add(line_of(block, "roles"), "slurm.roles", "expected a mapping of role: count, "
                   f"e.g. {{chief: 1, worker: 2, ps: 1}}, got {describe(raw)}")  # fmt: skip
        return ()
    report.unknown_keys(raw, ROLE_KEYS, "slurm.roles")
    counts = report.checked(raw, ROLE_KEYS, "slurm.roles")
    roles = tuple(role for role in ROLE_KEYS for _ in range(counts.get(role, 0)))
    if not roles and len(counts) == len(raw):
        report.add(line_of(block, "roles"), "slurm.roles",
                   "no task: give at least one worker (or a chief) a count")  # fmt: skip
    elif nodes is not None and roles and nodes != len(roles):
        report.add(line_of(block, "nodes"), "slurm.nodes",
                   f"{nodes}, but slurm.roles asks for {len(roles)} task(s), one per node: "
                   f"leave nodes out or make it {len(roles)}")  # fmt: skip
    return roles


def _sbatch_option(value: str) -> Checked:
    if not value.startswith("-") or "\n" in value:
        return None, f"expected one sbatch option such as '--qos=high', got {describe(value)}"
    option = value.split("=", 1)[0]
    if option in OWNED_OPTIONS:
        key = OWNED_OPTIONS[option]
        return None, (
            f"{option} is set from slurm.{key}; set that key instead"
            if key
            else f"{option} is set by orchestrate (one job per attempt, its own logs)"
        )
    return value, None


def _sbatch_args(block: LineMap, report: Report) -> tuple[str, ...]:
    return report.checked_list(block["sbatch_args"], line_of(block, "sbatch_args"),
                               "slurm.sbatch_args", string,
                               not_a_list="expected a list of strings, e.g. ['--qos=high']",
                               extra=_sbatch_option)  # fmt: skip


def _login(block: LineMap, report: Report, base: Path) -> LoginNode | None:
    """`slurm.login:`, read with the SSH kind's own keys, checkers and ssh-config resolution,
    so `ssh_user: x` means here what it means on a host."""

    raw = block["login"]
    if not isinstance(raw, LineMap):
        report.add(line_of(block, "login"), "slurm.login",
                   f"expected a mapping with at least 'address', got {describe(raw)}")  # fmt: skip
        return None
    keys: dict[str, Checker] = {**checkers(LOGIN_KEY_ENTRIES), **_SSH.keys}
    report.unknown_keys(raw, keys, "slurm.login")
    before = len(report.problems)
    values = report.checked(raw, keys, "slurm.login")
    if "address" not in raw:
        report.add(raw.line, "slurm.login.address",
                   "missing; the login node's name, address or ssh config alias")  # fmt: skip
    if len(report.problems) > before:
        return None

    def problem(key: str, message: str) -> None:
        report.add(line_of(raw, key), f"slurm.login.{key}", message)

    _SSH.prepare(values, problem, base)
    if len(report.problems) > before:
        return None
    for key in _SSH.controller_paths:
        if key in values:
            values[key] = str(controller_path(values[key], base))
    return LoginNode(values["address"], values["python"], _SSH.settings(values))


def slurm_workers(spec: SlurmSpec, base: Path) -> list[Placed]:
    """One worker per node. They are reached through the login node, which sees the shared
    filesystem (this machine, or `login:` over SSH); Slurm decides later which node each one
    runs on."""

    placed: list[Placed] = []
    for index in range(spec.nodes):
        name = spec.worker_name(index)
        if spec.login is None:
            host = WorkerSlot(name=name, address=name, port=spec.port, connection=_LOCAL.name,
                              python=spec.python, workdir=spec.workdir,
                              role=spec.role_of(index))  # fmt: skip
        else:  # whatever reaches the task's "host" reaches the login node
            login = spec.login
            settings = replace(login.settings, ssh_host=login.settings.target or login.address)
            host = WorkerSlot(name=name, address=name, port=spec.port, connection=_SSH.name,
                              python=spec.python, workdir=spec.workdir, settings=settings,
                              role=spec.role_of(index))  # fmt: skip
        placed.append((f"slurm.{name}", None, host))  # config/roles.py finds roles: lines
    return placed


def check_batch_script_values(job: Job, document: LineMap, report: Report) -> None:
    """The job's values the batch script carries (its env, args and script) hold none of the
    script's end markers (model/slurm.END_MARKERS): said with their lines, before `up`
    starts anything or `export` prints a script."""
    block = document["job"]
    env, args = block.get("env"), block.get("args")
    lines = args.item_lines if isinstance(args, LineList) else []
    values = [*((line_of(env, k), f"job.env.{k}", f"{k}={v}") for k, v in job.env.items()),
              *((lines[i] if i < len(lines) else None, "job.args", arg)
                for i, arg in enumerate(job.args)),
              (line_of(block, "script"), "job.script", job.script or "")]  # fmt: skip
    for line, key, value in values:
        marker = end_marker_in(value)
        if marker is not None:
            report.add(line, key, end_marker_problem(marker))


# Without `login:` the files of a Slurm run are read where `orchestrate` runs (the login node);
# with it, over SSH: the default connection kind, whose keys `login:` takes.


def slurm_source(
    document: LineMap, _defaults: LineMap, report: Report, base: Path
) -> tuple[list[Placed], SlurmSpec | None]:
    spec = parse_slurm(document, report, base)
    return (slurm_workers(spec, base) if spec else []), spec


def check_slurm_roles(
    placed: Sequence[Placed], job: Job, document: LineMap, report: Report
) -> None:
    """`slurm.roles:` against the job (config/roles.py checks the job's keys): chief and ps
    under parameter-server only, which needs them; an evaluator beside tasks that train (it
    reads the chief's checkpoints on the shared filesystem, from any node)."""
    slurm, job_block = (document.get(key) for key in ("slurm", "job"))
    raw = slurm.get("roles") if isinstance(slurm, LineMap) else None
    roles: LineMap = raw if isinstance(raw, LineMap) else LineMap()
    # Counted from the mapping, not the tasks: a block with another problem (nodes against
    # roles) placed none, and "found 0 chief" would then contradict what the file says.
    count = {role: _count(roles.get(role)) if isinstance(raw, LineMap)
             else sum(1 for p in placed if p[2].role == role) for role in ROLE_KEYS}  # fmt: skip
    if job.strategy == STRATEGY_PS:
        if not isinstance(raw, LineMap):
            line = line_of(job_block, "strategy") if isinstance(job_block, LineMap) else None
            report.add(line, "job.strategy", "parameter-server on Slurm needs slurm.roles, "
                       "e.g. {chief: 1, worker: 2, ps: 1} (one task per node)")  # fmt: skip
        elif count[ROLE_CHIEF] != 1 or not count[ROLE_PS] or not count[ROLE_WORKER]:
            have = ", ".join(f"{count[r]} {r}" for r in (ROLE_CHIEF, ROLE_PS, ROLE_WORKER))
            report.add(line_of(slurm, "roles"), "slurm.roles", "job.strategy: parameter-server "
                       f"needs chief: 1, at least one ps and one worker; found {have}")  # fmt: skip
    else:
        for role in (ROLE_CHIEF, ROLE_PS):
            if count[role]:
                report.add(line_of(roles, role), f"slurm.roles.{role}", (
                    f"needs job.strategy: parameter-server; under {job.strategy} task0 is "
                    "the chief: give the tasks as workers"
                    if role == ROLE_CHIEF else "needs job.strategy: parameter-server"))  # fmt: skip
    if count[ROLE_EVALUATOR] and not count[ROLE_WORKER] + count[ROLE_CHIEF]:
        report.add(line_of(roles, ROLE_EVALUATOR), "slurm.roles.evaluator",
                   "an evaluator needs tasks that train: give workers a count")  # fmt: skip


def _count(value: object) -> int:
    """A role's count as slurm.roles gives it; 0 for what is no count (refused elsewhere)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def spec_from_json(data: Mapping[str, Any], settings: SettingsReader) -> SlurmSpec:
    """The SlurmSpec a run record kept (`login:`'s settings are the SSH kind's, read back as a
    host's are)."""
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    login = fields.get("login")
    if login is not None:
        ssh = settings(DEFAULT_CONNECTION, login.get("settings") or {})
        fields["login"] = LoginNode(login["address"], login.get("python", "python3"), ssh)
    return SlurmSpec(**fields)


_LOCAL = next(kinds.get(name) for name in kinds.names()
              if kinds.get(name).shares_files_with_controller)  # fmt: skip
_SSH = kinds.get(DEFAULT_CONNECTION)

SOURCE = HostSource(
    Key("slurm", "mapping (`slurm:` keys)", "",
        "Slurm places the workers: one per node of one batch job"),
    slurm_source,
    blocks=(
        ("slurm", "a Slurm cluster instead of `hosts:`", SLURM_KEY_ENTRIES),
        ("slurm.roles", "the tasks of the Slurm job by TF_CONFIG type, one per node",
         ROLE_KEY_ENTRIES),
        ("slurm.login", "the login node Slurm is driven through, with the SSH keys of a host",
         (*LOGIN_KEY_ENTRIES, *_SSH.key_entries)),
    ),
    check_roles=check_slurm_roles,
    no_setup="applies to hosts reached over SSH (hosts: or ansible:); on Slurm, prepare the "
    "nodes' shared environment",
    check_job=check_batch_script_values,
    settings_from_json=spec_from_json,
)  # fmt: skip
__all__ = ["DEFAULT_PORT", "parse_slurm", "slurm_workers"]
