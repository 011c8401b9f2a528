"""A host's answer is untrusted input (issue 40): one decoder bounds its size, encoding, nesting
and shape, and every violation is a HostAnswerError naming the host and the verb, which the
callers handle as a lost host. The decoder alone, then real sessions whose program at the other
end answers each way, read through the real LocalRunner."""

from __future__ import annotations

import resource
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.errors import HostAnswerError, HostError
from orchestrator.machines.answerline import DEPTH_CAP, LINE_CAP, decode_answer
from orchestrator.machines.runner import LocalRunner

HOSTILE = {
    "deep JSON": (b"[" * 60000 + b"]" * 60000 + b"\n", "nested deeper than"),
    "deep but parseable JSON": (
        b'{"a": ' + b"[" * (DEPTH_CAP + 5) + b"]" * (DEPTH_CAP + 5) + b"}\n",
        "nested deeper than",
    ),
    "a bare number": (b"5\n", "JSON int, not an object"),
    "a list": (b"[1, 2]\n", "JSON list, not an object"),
    "invalid UTF-8": (b'{"pid": "\xff\xfe"}\n', "not UTF-8 (byte 9)"),
    "no end of line": (b'{"pid": 4}', "no end of line"),
    "not JSON": (b"Welcome to gpu-3!\n", "not JSON"),
    "an error that is no string": (b'{"error": {"x": 1}}\n', "an error that is not a string"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_line_is_an_error_naming_host_and_verb(name: str) -> None:
    line, said = HOSTILE[name]
    with pytest.raises(HostAnswerError) as caught:
        decode_answer("gpu-3", "probe", line)
    assert said in caught.value.message
    assert caught.value.message.startswith("gpu-3: answered `probe` with ")
    assert isinstance(caught.value, HostError)  # handled wherever a lost host is


def test_an_over_long_line_names_the_limit() -> None:
    with pytest.raises(HostAnswerError, match=r"a line over 16 MiB; the limit is 16 MiB"):
        decode_answer("gpu-3", "probe", b"x" * (LINE_CAP + 1))


def test_a_real_answer_passes_unchanged_and_a_long_error_is_cut() -> None:
    line = b'{"workers": {"/r/a": {"alive": true, "progress": {"loss": NaN, "step": 4}}}}\n'
    answer = decode_answer("gpu-3", "probe", line)
    assert answer["workers"]["/r/a"]["progress"]["step"] == 4
    long_error = decode_answer("gpu-3", "stop", b'{"error": "' + b"e" * 10000 + b'"}\n')
    assert len(long_error["error"]) == 2000


ANSWERING = """\
import sys
sys.stdin.readline()
sys.stdout.buffer.write({line!r})
sys.stdout.flush()
{after}
"""


def program(tmp_path: Path, line: bytes, after: str = "sys.stdin.read()") -> list[str]:
    script = tmp_path / "answers.py"
    script.write_text(ANSWERING.format(line=line, after=after))
    return [sys.executable, str(script)]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_session_answered_with_a_hostile_line_raises_a_host_error(
    tmp_path: Path, name: str
) -> None:
    line, said = HOSTILE[name]
    # Without an end of line the program must end for the read to return: as a real one might.
    after = "" if not line.endswith(b"\n") else "sys.stdin.read()"
    session = LocalRunner("gpu-3").session(program(tmp_path, line, after))
    try:
        with pytest.raises(HostAnswerError, match=said.replace("(", r"\(").replace(")", r"\)")):
            session.request({"verb": "probe"}, timeout=30)
    finally:
        session.drop()


def test_a_300_mib_line_is_refused_after_16_mib_read(tmp_path: Path) -> None:
    # The program writes 300 MiB without a newline; the controller reads 16 MiB + 1 and stops.
    script = tmp_path / "floods.py"
    script.write_text(
        textwrap.dedent(
            """\
            import sys
            sys.stdin.readline()
            block = b"x" * (1024 * 1024)
            try:
                for _ in range(300):
                    sys.stdout.buffer.write(block)
            except BrokenPipeError:
                pass
            """
        )
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    session = LocalRunner("gpu-3").session([sys.executable, str(script)])
    try:
        with pytest.raises(HostAnswerError, match="a line over 16 MiB; the limit is 16 MiB"):
            session.request({"verb": "probe"}, timeout=60)
    finally:
        session.drop()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 100, f"the controller grew {grown_mib:.0f} MiB reading one answer"
