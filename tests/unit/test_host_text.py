"""Text the controller did not write (a host's answer, a lease file's name, a worker's log line,
a stack, a webhook's error body) reaches no terminal raw (issue 41): model/printable.py's
sanitiser, and the CLI's rendering and consoles that apply it."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.model.printable import finite, printable, strict_json

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
