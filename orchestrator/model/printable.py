"""What the controller shows of what it did not write itself: a host's answer, a file name in a
lease directory, a worker's log line, a stack, a webhook's error body. Pure.

A terminal obeys the control characters it is sent: ESC starts a sequence that retitles the
window, clears the screen, moves the cursor or, on some terminals, sets the clipboard; CR writes
over a line; BEL rings. Rich drops BEL and CR from its text but passes ESC on. So every such
text goes through `printable` before it is printed or logged: each control character becomes a
visible escape (ESC shows as the four characters \\x1b), and what is left only displays.

And what `--json` prints is strict JSON: `strict_json` has no NaN or Infinity (Python's json
writes them, and no other JSON parser reads them).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# C0 controls but tab and newline; DEL; C1 controls (U+0080-U+009F: some terminals take U+009B
# for CSI); the bidirectional marks, embeddings, overrides and isolates, which reorder what is
# shown after them (the "Trojan Source" trick); and lone surrogates (bytes that were not UTF-8,
# read with surrogateescape: printing one raises UnicodeEncodeError).
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_IN_A_LINE = re.compile(f"[{_CONTROLS}\n]")  # one line: a newline is shown too
_IN_LINES = re.compile(f"[{_CONTROLS}]")  # a text of several lines keeps its newlines
_NAMED = {"\n": "\\n", "\r": "\\r"}


def printable(text: str, *, multiline: bool = False) -> str:
    """`text` with every control character shown as an escape (\\x1b, \\x07, \\r, \\u202e);
    tabs stay, newlines too where `multiline` (a stack, a message of several lines). Applying
    it twice changes nothing more: its output holds no control character."""
    return (_IN_LINES if multiline else _IN_A_LINE).sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def finite(value: Any) -> Any:
    """A JSON-able `value` with every non-finite float (NaN, infinities) as None, in any
    dict, list or tuple of it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def strict_json(value: Any, indent: int | None = None) -> str:
    """`value` as JSON that every parser reads: a non-finite number is null."""
    return json.dumps(finite(value), indent=indent, allow_nan=False)
