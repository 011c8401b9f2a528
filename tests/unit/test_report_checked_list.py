"""Report.checked_list: the one reader of "a YAML list, one problem per bad item" that job.args,
job.files, job.permanent_exit_codes, job.secret_env, setup:, sync.exclude and slurm.sbatch_args
share."""

from __future__ import annotations

from typing import Any

from orchestrator.config.report import Report
from orchestrator.values import Checked, string
from orchestrator.yamlsource import LineMap, parse

DOCUMENT = """\
items:
  - first
  - 5
  - ''
  - second
  - [x]
"""


def found(report: Report) -> list[tuple[int | None, str, str]]:
    return [(p.line, p.key, p.message) for p in report.problems]


def test_good_items_are_kept_and_each_bad_one_is_reported_at_its_own_line() -> None:
    document: LineMap = parse(DOCUMENT)
    report = Report("inv.yaml")
    items = report.checked_list(document["items"], 1, "block.items", string, not_a_list="no")
    assert items == ("first", "second")
    assert found(report) == [
        (3, "block.items[1]", "expected a non-empty string, got 5"),
        (4, "block.items[2]", "expected a non-empty string, got ''"),
        (6, "block.items[4]", "expected a non-empty string, got a list"),
    ]


def test_a_value_that_is_not_a_list_is_one_problem_with_the_callers_message() -> None:
    for value in ("first", None, parse("a: 1"), 5):
        report = Report("inv.yaml")
        items = report.checked_list(value, 7, "block.items", string,
                                    not_a_list="expected a list of things")  # fmt: skip
        assert items == ()
        assert found(report) == [(7, "block.items", "expected a list of things")]


def test_an_empty_list_is_fine_unless_it_must_not_be() -> None:
    empty = parse("items: []")["items"]
    report = Report("inv.yaml")
    assert report.checked_list(empty, 1, "items", string, not_a_list="no") == ()
    assert report.problems == []
    assert report.checked_list(empty, 1, "items", string, not_a_list="empty", non_empty=True) == ()
    assert found(report) == [(1, "items", "empty")]


def test_the_extra_check_runs_on_good_items_only_and_its_value_is_kept() -> None:
    seen: list[Any] = []

    def shout(value: str) -> Checked:
        seen.append(value)
        if value == "second":
            return None, "second is refused"
        return value.upper(), None

    report = Report("inv.yaml")
    document: LineMap = parse(DOCUMENT)
    items = report.checked_list(document["items"], 1, "items", string, not_a_list="no",
                                extra=shout)  # fmt: skip
    assert items == ("FIRST",)
    assert seen == ["first", "second"]  # never called with the items `string` refused
    assert [key for _, key, _ in found(report)] == ["items[1]", "items[2]", "items[3]", "items[4]"]
    assert found(report)[2] == (5, "items[3]", "second is refused")
