"""A host answer is bounded as a whole (issue 54): the timeout is for the whole line, not its
first byte; an answer that is not the request's (one too many came before it) is refused; a
machine that fails is asked again only after a pause that doubles."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from orchestrator.errors import HostAnswerError
from orchestrator.machines import runner
from orchestrator.machines.pool import BACKOFF_FIRST, Machines
from orchestrator.machines.runner import LineReader, LineSession


def test_an_answer_that_dribbles_in_times_out_as_a_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count()  # one second passes per look at the clock
    monkeypatch.setattr(runner.time, "monotonic", lambda: float(next(clock)))
    reader = LineReader(lambda _timeout: b"x")  # a byte whenever asked, never an end of line
    with pytest.raises(TimeoutError, match=r"no whole answer \(\d+ bytes of one came\) within 5 s"):
        reader.read_line(5.0, 1000)


def test_lines_are_cut_at_their_end_and_the_rest_is_kept() -> None:
    chunks = [b'{"a": 1}\n{"b"', b": 2}\n", b""]
    reader = LineReader(lambda _timeout: chunks.pop(0))
    assert reader.read_line(5.0, 100) == b'{"a": 1}\n'
    assert reader.read_line(5.0, 100) == b'{"b": 2}\n'
    assert reader.read_line(5.0, 100) == b""


def test_a_line_over_the_limit_is_cut_at_the_limit() -> None:
    reader = LineReader(lambda _timeout: b"y" * 64)
    assert reader.read_line(5.0, 10) == b"y" * 10


def _session(answers: list[dict[str, Any]]) -> LineSession:
    lines = [json.dumps(answer).encode() + b"\n" for answer in answers]

    class Writer:
        def write(self, data: bytes) -> None:
            pass

        def flush(self) -> None:
            pass

    return LineSession("alpha", Writer(), lambda _t, _l: lines.pop(0), lambda: None)  # type: ignore[arg-type]


def test_an_answer_to_another_request_is_refused() -> None:
    # The first request's answer came twice: the second request reads the copy.
    session = _session([{"runs": {}, "id": 1}, {"runs": {}, "id": 1}, {"runs": {}, "id": 2}])
    assert session.request({"verb": "probe"}, timeout=5) == {"runs": {}}
    with pytest.raises(HostAnswerError, match="an answer to another request"):
        session.request({"verb": "probe"}, timeout=5)


def test_an_answer_without_an_id_is_refused() -> None:
    with pytest.raises(HostAnswerError, match="an answer to another request"):
        _session([{"runs": {}}]).request({"verb": "probe"}, timeout=5)


def test_the_pause_after_failures_doubles_up_to_a_cap() -> None:
    machines = Machines()
    key = ("local",)
    assert machines.backoff(key) == BACKOFF_FIRST
    machines._failures[key] = 4
    assert machines.backoff(key) == BACKOFF_FIRST * 8
    machines._failures[key] = 1000
    assert machines.backoff(key) == BACKOFF_FIRST * 1024
