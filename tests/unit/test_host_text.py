"""Text the controller did not write (a host's answer, a lease file's name, a worker's log line,
a stack, a webhook's error body) reaches no terminal raw (issue 41): model/printable.py's
sanitiser, and the CLI's rendering and consoles that apply it."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

from orchestrator.cli import cli, main
from orchestrator.cli.app import PlainTextConsole
from orchestrator.cli.checkview import finding_hints, findings_table
from orchestrator.cli.render import (
    jobs_table,
    problems,
    progress_line,
    status_table,
)
from orchestrator.engine.observe.notify import NotDelivered, deliver
from orchestrator.engine.observe.status import RunStatus, WorkerStatus
from orchestrator.errors import HostError
from orchestrator.model.findings import Finding, PreflightReport, Status
from orchestrator.model.inventory import NotifyTarget
from orchestrator.model.leases import Holder, JobLeases, Lease, LeaseListing
from orchestrator.model.printable import finite, printable, strict_json
from orchestrator.model.records import Restart
from orchestrator.model.vocabulary import WorkerState

# The file name: retitles the terminal, then clears the screen.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J"
RAW_CONTROLS = [chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))]


def test_escape_sequences_are_shown_as_visible_escapes() -> None:
    assert printable(HOSTILE) == SHOWN
    assert printable(f"step 3 {HOSTILE}done") == f"step 3 {SHOWN}done"


@pytest.mark.parametrize("char", RAW_CONTROLS)
def test_no_c0_or_c1_control_nor_del_survives(char: str) -> None:
    shown = printable(f"a{char}b")
    assert shown.startswith("a\\") and shown.endswith("b")
    assert not any(c in shown for c in RAW_CONTROLS)


def test_names_of_the_usual_ones() -> None:
    assert printable("\r\n\x07\x7f\x9b") == "\\r\\n\\x07\\x7f\\x9b"


def test_a_line_shows_its_newline_and_a_text_of_lines_keeps_them() -> None:
    assert printable("one\ntwo") == "one\\ntwo"
    assert printable("one\ntwo\x1b", multiline=True) == "one\ntwo\\x1b"
    assert printable("a\r\nb", multiline=True) == "a\\r\nb"  # a CR still never goes out raw


def test_tabs_and_ordinary_text_stay() -> None:
    text = "epoch\t1: loss=0.25 ✓ é 日本 [bold]not markup[/]"
    assert printable(text) == text


def test_reordering_marks_and_undecodable_bytes_are_shown() -> None:
    # U+202E reverses what follows on screen; a lone surrogate is a byte that was not UTF-8.
    assert printable("a\u202eb\u2066c") == "a\\u202eb\\u2066c"
    assert printable(b"ok \xff".decode("utf-8", "surrogateescape")) == "ok \\udcff"


def test_twice_is_once() -> None:
    once = printable(HOSTILE + "\n\udcff\u202e")
    assert printable(once) == once and printable(once, multiline=True) == once


def test_strict_json_has_no_nan_nor_infinity() -> None:
    document = {"eta_seconds": math.inf, "loss": math.nan, "steps": [1, -math.inf, 0.5]}
    assert finite(document) == {"eta_seconds": None, "loss": None, "steps": [1, None, 0.5]}
    text = strict_json(document, indent=2)
    assert json.loads(text, parse_constant=_refuse) == finite(document)


def _refuse(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# --- the CLI's rendering: tables and lines of host text, and the consoles that print them ----


def worker(**fields: object) -> WorkerStatus:
    declared = dataclasses.fields(WorkerStatus)
    unset = {f.name: None for f in declared if f.default is dataclasses.MISSING}
    given = {"name": "alpha", "index": 0, "host": "localhost", "state": WorkerState.FAILED,
             "devices": (), "log_tail": ()}  # fmt: skip
    return WorkerStatus(**{**unset, **given, **fields})  # type: ignore[arg-type]


def hostile_status() -> RunStatus:
    """Every field of a status that a host or a worker's files fill, hostile; and markup."""
    failed = worker(reason=f"exit 1: {HOSTILE}[/oops]", hint=f"read {HOSTILE}", note=HOSTILE,
                    host=f"node{HOSTILE}", devices=(f"/device:GPU:0{HOSTILE}",))  # fmt: skip
    restart = Restart(1.0, 0, "alpha", f"exit 1: {HOSTILE}", 3, "crashed")
    return RunStatus("r1", "demo", WorkerState.FAILED, (failed,), attempt=1,
                     restarts=(restart,), outcome=f"gave up: {HOSTILE}")  # fmt: skip


def plain(*renderables: object) -> str:
    """What a console without colours writes: any ESC in it came from the text printed."""
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(*renderables)
    return out.getvalue()


def assert_shown(output: str) -> None:
    assert "\x1b" not in output and "\x07" not in output, repr(output)
    assert SHOWN in output, repr(output)


def test_the_status_table_shows_host_text_escaped_and_as_no_markup() -> None:
    output = plain(status_table(hostile_status()))
    assert_shown(output)
    assert f"node{SHOWN}" in output and f"GPU:0{SHOWN}" in output
    assert f"gave up: {SHOWN}" in output and f"last: alpha at step 3: exit 1: {SHOWN}" in output


def test_the_lines_of_status_and_up_are_printable() -> None:
    status = hostile_status()
    lines = [*problems(status), progress_line(status.workers[0])]
    for line in lines:
        assert printable(line) == line
    assert f"alpha: failed: exit 1: {SHOWN}[/oops]" in lines
    # up's live view prints them as Text: a bracket in a worker's words is not Rich markup.
    assert "[/oops]" in plain(*map(Text, problems(status)))


def test_jobs_and_findings_tables_show_other_users_text_escaped() -> None:
    holder = Holder(user=f"mallory{HOSTILE}", job="j", run_id=f"r{HOSTILE}", controller="c")
    listing = LeaseListing(jobs=(JobLeases(holder, {"h1": Lease("h1", holder, ports=(1,))}),))
    assert_shown(plain(jobs_table(listing)))
    finding = Finding(f"h{HOSTILE}", "python", Status.FAIL, f"{HOSTILE}[/bold]", hint=HOSTILE)
    report = PreflightReport((finding,))
    output = plain(findings_table(report))
    assert_shown(output)
    assert "[/bold]" in output
    assert finding_hints(report) == [f"h{SHOWN} python: {SHOWN}"]


@pytest.mark.parametrize("terminal", [True, False])
def test_the_cli_consoles_never_pass_a_control_character_on(terminal: bool) -> None:
    out = io.StringIO()
    console = PlainTextConsole(file=out, width=300, force_terminal=terminal, highlight=False)
    console.print(f"a log line {HOSTILE}", markup=False)
    console.print(Text(f"a Text built elsewhere {HOSTILE}", style="bold"))
    console.print(f"[red]styled[/] and {HOSTILE}")  # markup of our own still works
    output = out.getvalue()
    assert "\x1b]0;" not in output and "\x1b[2J" not in output and "\x07" not in output
    assert f"a log line {SHOWN}" in output and f"and {SHOWN}" in output
    assert "a Text built elsewhere \\x1b]0;pwned\\x1b[2J" in output  # Rich dropped the BEL
    if terminal:
        assert "\x1b[1m" in output and "\x1b[31m" in output  # its own styles are kept


def test_the_cli_prints_an_error_from_a_host_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    @cli.command(name="fails-with-host-text")
    def fails() -> None:
        raise HostError("h1", f"ssh said {HOSTILE}")

    try:
        with pytest.raises(SystemExit) as exited, _argv("fails-with-host-text"):
            main()
    finally:
        cli.commands.pop("fails-with-host-text")
    assert exited.value.code == HostError.exit_code
    assert_shown(capsys.readouterr().err)


@contextlib.contextmanager
def _argv(*args: str) -> Iterator[None]:
    saved = sys.argv
    sys.argv = ["orchestrate", *args]
    try:
        yield
    finally:
        sys.argv = saved


def test_a_webhooks_or_commands_error_words_are_said_escaped(tmp_path: Path) -> None:
    script = f"import sys; sys.stderr.write({HOSTILE!r} + ' busy'); sys.exit(1)"
    target = NotifyTarget(command=(sys.executable, "-c", script))
    with pytest.raises(NotDelivered) as refused:
        deliver(target, {"event": "x"}, str(tmp_path), {})
    assert refused.value.why == f"exit 1: {SHOWN} busy"
