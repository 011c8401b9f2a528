"""`notify:`: who is told of a run's events (engine/observe/notify.py sends them). Pure apart from
checking that the files it names exist.

Each entry is a webhook (`webhook: URL`, HTTPS with the certificate checked, or http:// to this
machine only) or a command run on this machine with the event's JSON on stdin.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchestrator.config.report import Report, line_of
from orchestrator.model.inventory import DEFAULT_NOTIFY_EVENTS, NOTIFY_EVENTS, NotifyTarget
from orchestrator.paths import controller_path, is_loopback
from orchestrator.values import (
    Checked,
    Key,
    checkers,
    choice,
    describe,
    integer,
    scalar_string,
    string,
)
from orchestrator.yamlsource import LineList, LineMap

# The header that carries the body's HMAC-SHA256 ("sha256=" + hex), as GitHub's
# X-Hub-Signature-256; docs/notifications.md says how to verify it.
SIGNATURE_HEADER = "X-Orchestrate-Signature-256"
# Set by orchestrate on every request: a header of the same name in `headers:` is refused.
RESERVED_HEADERS = frozenset({"host", "content-length", "content-type", SIGNATURE_HEADER.lower()})
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
WEBHOOK_ONLY = ("format", "headers", "secret_env", "ca_file")


def _url(value: Any) -> Checked:
    text, problem = string(value)
    if problem:
        return None, problem
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        return None, f"not a URL ({exc}): {text!r}"
    del port
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return None, f"expected an https:// URL, got {text!r}"
    if parts.username is not None or parts.password is not None:
        return None, (
            "a user or password in the URL is not sent; put credentials in headers: "
            "(Authorization: ...) or sign the body with secret_env:"
        )
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        return None, (
            f"http:// is for this machine only (loopback); {parts.hostname} needs "
            "https:// (the event would cross the network unencrypted)"
        )
    return text, None


def _env_name(value: Any) -> Checked:
    if isinstance(value, str) and ENV_NAME.fullmatch(value):
        return value, None
    return None, (
        f"expected an environment variable name (its value, in the environment of "
        f"'orchestrate up', signs the body), got {describe(value)}"
    )


# One entry of `notify:`; the manual's key reference is written from these entries.
NOTIFY_KEY_ENTRIES: tuple[Key, ...] = (
    Key("webhook", "string (an `https://` URL; `http://` only to loopback)", "",
        "POST each event there as JSON; the server's certificate is checked (exactly one of "
        "`webhook`, `command`)", _url),
    Key("command", "list of strings", "",
        "a program run on this machine (in the inventory's directory) with the event's JSON on "
        "standard input; a non-zero exit counts as not delivered"),
    Key("events", "list of " + ", ".join(f"`{e}`" for e in NOTIFY_EVENTS),
        "all but `queued` and `started`", "which events this target is told of (`queued`: "
        "`up --queue` waits behind another job, with the reason)"),
    Key("format", "`json` or `slack`", "`json`",
        "`slack`: the body is `{\"text\": ...}`, as Slack's (and Mattermost's, Discord's "
        "`/slack`) incoming webhooks take it", choice("json", "slack")),
    Key("headers", "mapping of header names to strings", "`{}`",
        "extra HTTP headers sent with each request (`Authorization: Bearer ...`)"),
    Key("secret_env", "an environment variable name", "",
        f"its value (read on this machine only, never sent to a remote worker) signs each body: "
        f"`{SIGNATURE_HEADER}: sha256=HMAC-SHA256(value, body)` in hex", _env_name),
    Key("ca_file", "string (a file on this machine)", "the system's CAs",
        "PEM certificates of the CAs that signed the server's certificate, instead of the "
        "system's", string),
    Key("timeout", "integer, 1 to 60 (seconds)", "`5`",
        "for each try (three tries, 1 s and 2 s apart, for a webhook; one for a command)",
        integer(1, 60)),
)  # fmt: skip
NOTIFY_KEYS = checkers(NOTIFY_KEY_ENTRIES)
NOTIFY_KEY_NAMES = tuple(key.name for key in NOTIFY_KEY_ENTRIES)


def parse_notify(
    value: Any, line: int | None, report: Report, base: Path
) -> tuple[NotifyTarget, ...]:
    """`notify:` as a list of targets; every problem reported at its line."""
    if not isinstance(value, LineList):
        report.add(
            line,
            "notify",
            f"expected a list of targets (webhook: or command:), got {describe(value)}",
        )
        return ()
    targets = []
    for index, item in enumerate(value):
        where = f"notify[{index}]"
        if not isinstance(item, LineMap):
            report.add(
                value.item_lines[index],
                where,
                "expected a mapping with webhook: URL "
                f"or command: [program, args...], got {describe(item)}",
            )
            continue
        target = _target(item, where, report, base)
        if target is not None:
            targets.append(target)
    return tuple(targets)


def _target(block: LineMap, where: str, report: Report, base: Path) -> NotifyTarget | None:
    before = len(report.problems)
    report.unknown_keys(block, NOTIFY_KEY_NAMES, where)
    values = report.checked(block, NOTIFY_KEYS, where)
    if ("webhook" in block) == ("command" in block):
        report.add(
            block.line,
            where,
            "set exactly one of 'webhook' (a URL to POST the event to) "
            "or 'command' (a program given the event on stdin)",
        )
    fields: dict[str, Any] = {"url": values.get("webhook")}
    if "command" in block:
        fields["command"] = _command(block, where, report, base)
        for key in WEBHOOK_ONLY:
            if key in block:
                report.add(line_of(block, key), f"{where}.{key}", "applies to webhook: only")
    for key in ("format", "secret_env", "timeout"):
        if key in values:
            fields[key] = values[key]
    if "headers" in block:
        fields["headers"] = _headers(block["headers"], line_of(block, "headers"), where, report)
    if "ca_file" in values:
        fields["ca_file"] = _ca_file(values["ca_file"], block, where, report, base)
    if "events" in block:
        fields["events"] = _events(block["events"], line_of(block, "events"), where, report)
    if len(report.problems) > before:
        return None
    return NotifyTarget(**fields)


def _command(block: LineMap, where: str, report: Report, base: Path) -> tuple[str, ...]:
    argv = report.checked_list(
        block["command"],
        line_of(block, "command"),
        f"{where}.command",
        scalar_string,
        non_empty=True,
        not_a_list="expected a list: the program, then its arguments",
    )
    if not argv:
        return ()
    program = str(argv[0])
    if "/" in program:  # a path: relative to the inventory, where the command runs
        path = controller_path(program, base)
        if not path.is_file():
            report.add(line_of(block, "command"), f"{where}.command", f"no such file: {path}")
        program = str(path)
    return (program, *map(str, argv[1:]))


def _headers(raw: Any, line: int | None, where: str, report: Report) -> dict[str, str]:
    if not isinstance(raw, LineMap):
        report.add(line, f"{where}.headers", "expected a mapping of header names to values")
        return {}
    headers = {}
    for name, item in raw.items():
        key = f"{where}.headers.{name}"
        value, problem = scalar_string(item)
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            problem = "expected an HTTP header name (letters, digits, '-')"
        elif name.lower() in RESERVED_HEADERS:
            problem = "is set by orchestrate on every request"
        elif value is not None and ("\r" in value or "\n" in value):
            problem = "a header value must be one line"
        if problem:
            report.add(line_of(raw, name), key, problem)
        else:
            headers[name] = value
    return headers


def _ca_file(value: str, block: LineMap, where: str, report: Report, base: Path) -> str | None:
    path = controller_path(value, base)
    if not path.is_file():
        report.add(line_of(block, "ca_file"), f"{where}.ca_file", f"no such file: {path}")
    url = block.get("webhook")
    if isinstance(url, str) and not url.startswith("https://"):
        report.add(line_of(block, "ca_file"), f"{where}.ca_file", "applies to https:// only")
    return str(path)


def _events(raw: Any, line: int | None, where: str, report: Report) -> tuple[str, ...]:
    seen: set[str] = set()

    def once(item: str) -> Checked:
        if item in seen:
            return None, f"{item} is listed twice"
        seen.add(item)
        return item, None

    events = report.checked_list(
        raw,
        line,
        f"{where}.events",
        choice(*NOTIFY_EVENTS),
        non_empty=True,
        extra=once,
        not_a_list="expected a list of events: " + ", ".join(NOTIFY_EVENTS),
    )
    return events or DEFAULT_NOTIFY_EVENTS
