"""The one decoder of a host program's answer line. Pure.

What a host says is untrusted input: the program at the other end may not be orchestrate's (a
login shell that prints, a planted interpreter), and the bytes may be damaged on the way. So a
line is bounded before it is parsed: its size (read at most LINE_CAP + 1 bytes, never the whole
of a 300 MiB line), its encoding (strict UTF-8), its nesting (json's C parser recurses: a deep
line raises RecursionError, not ValueError) and its shape (one JSON object; an `error` is a
string). Any violation is a HostAnswerError naming the host and the verb, which the callers
handle like any HostError: the session is dropped and the host counts as not answering.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.errors import HostAnswerError

LINE_CAP = 16 * 1024 * 1024  # bytes of one answer line; the largest real answers are ~100 KiB
DEPTH_CAP = 32  # nesting of objects and lists; real answers nest 4 deep
ERROR_CAP = 2000  # characters of an {"error": ...} answer kept for the message


def _size(count: int) -> str:
    return f"{count // (1024 * 1024)} MiB" if count >= 1024 * 1024 else f"{count} bytes"


def _depth(value: Any) -> int:
    """How deep lists and objects nest in a parsed value, without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list):
            continue
        deepest = max(deepest, depth)
        if depth <= DEPTH_CAP:  # one level past the cap is enough to refuse it
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return deepest


def decode_answer(host: str, verb: str, line: bytes, cap: int = LINE_CAP) -> dict[str, Any]:
    """One answer line (read with a limit of cap + 1 bytes) as a JSON object, or a
    HostAnswerError that says what was wrong with it."""
    if len(line) > cap:
        raise HostAnswerError(host, verb, f"a line over {_size(cap)}; the limit is {_size(cap)}")
    if not line.endswith(b"\n"):
        raise HostAnswerError(host, verb, f"{_size(len(line))} and no end of line before its end")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HostAnswerError(host, verb, f"a line that is not UTF-8 (byte {exc.start})") from exc
    try:
        answer = json.loads(text)
    except RecursionError as exc:
        raise HostAnswerError(host, verb, f"JSON nested deeper than {DEPTH_CAP}") from exc
    except ValueError as exc:
        raise HostAnswerError(host, verb, f"a line that is not JSON ({exc})") from exc
    if not isinstance(answer, dict):
        raise HostAnswerError(host, verb, f"JSON {type(answer).__name__}, not an object")
    if _depth(answer) > DEPTH_CAP:
        raise HostAnswerError(host, verb, f"JSON nested deeper than {DEPTH_CAP}")
    if "error" in answer:
        if not isinstance(answer["error"], str):
            raise HostAnswerError(host, verb, "an error that is not a string")
        answer["error"] = answer["error"][:ERROR_CAP]
    return answer
