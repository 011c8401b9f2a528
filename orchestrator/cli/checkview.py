"""`check` and `firewall` as the terminal shows them: the findings table, the hints, the
firewall script. Apart from render.py so that `check` imports no run status (the CLI's start:
tests/unit/test_cli_start.py)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from orchestrator.cli.format import shown
from orchestrator.model.findings import PreflightReport, Status
from orchestrator.model.firewall import HostRules
from orchestrator.model.printable import printable

FINDING_STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def findings_table(report: PreflightReport) -> Table:
    table = Table(title="preflight", title_justify="left")
    for column in ("host", "check", "status", "detail"):
        table.add_column(column, overflow="fold")
    for finding in report.findings:
        status = finding.status.value
        table.add_row(
            shown(finding.host), shown(finding.check), Text(status, FINDING_STYLES[status]),
            shown(finding.detail),
        )  # fmt: skip
    return table


def finding_hints(report: PreflightReport) -> list[str]:
    return [
        printable(f"{f.host} {f.check}: {f.hint}")
        for f in report.findings
        if f.status is not Status.OK and f.hint
    ]


def firewall_script(rules: list[HostRules], fmt: str) -> str:
    lines = [
        f"# {fmt} rules for each host, to run on that host as root.",
        "# The TensorFlow gRPC port is unauthenticated: anyone who can reach it can join or",
        "# disturb the job, so it is opened to the cluster's own addresses only, and then",
        "# dropped for every other source (an INPUT policy of ACCEPT would let anyone in).",
    ]
    for entry in rules:
        lines.append("")
        lines.append(f"## {entry.host.name} ({entry.host.address})")
        lines.extend(entry.commands)
    return "\n".join(lines)
