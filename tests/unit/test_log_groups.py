"""`tail`'s grouping (engine/observe/loggroups.py): the same text from several workers once, the
rest with its own worker and in each worker's order."""

from __future__ import annotations

from orchestrator.engine.observe.loggroups import Grouper, Line, label, merge

W = ("worker-0", "worker-1", "worker-2")


def test_labels() -> None:
    assert label(W) == "worker-0,1,2"
    assert label(("worker-0", "worker-2")) == "worker-0,2"
    assert label(("w10", "w11")) == "w10,11"
    assert label(("task0", "task1")) == "task0,1"
    assert label(("alpha", "beta")) == "alpha,beta"
    assert label(("alpha", "alps")) == "alpha,alps"
    assert label(("worker-0",)) == "worker-0"


def feed(grouper: Grouper, events: list[tuple[float, str, str]]) -> list[Line]:
    out: list[Line] = []
    for at, worker, text in events:
        out += grouper.add(worker, text, at)
    return out + grouper.flush()


def test_the_same_line_of_three_workers_within_a_second_is_one() -> None:
    events = [(0.0, "worker-0", "Epoch 3/10"), (0.2, "worker-2", "Epoch 3/10"),
              (0.5, "worker-1", "Epoch 3/10")]  # fmt: skip
    grouper = Grouper(W)
    # Released as soon as every worker printed it, not a window later.
    assert grouper.add(*events[0][1:], events[0][0]) == []
    assert grouper.add(*events[1][1:], events[1][0]) == []
    assert grouper.add(*events[2][1:], events[2][0]) == [Line(W, "Epoch 3/10")]


def test_lines_that_differ_keep_their_prefix_and_order() -> None:
    events = [
        (0.0, "worker-0", "Epoch 1/2"), (0.0, "worker-0", "loss 0.9"),
        (0.1, "worker-1", "Epoch 1/2"), (0.1, "worker-1", "loss 0.8"),
        (0.2, "worker-2", "Epoch 1/2"), (0.3, "worker-2", "loss 0.9"),
    ]  # fmt: skip
    assert feed(Grouper(W), events) == [
        Line(W, "Epoch 1/2"),
        Line(("worker-0", "worker-2"), "loss 0.9"),
        Line(("worker-1",), "loss 0.8"),
    ]


def test_later_than_the_window_is_a_line_of_its_own() -> None:
    events = [(0.0, "worker-0", "Epoch 1/2"), (1.5, "worker-1", "Epoch 1/2")]
    grouper = Grouper(W[:2])
    assert grouper.add("worker-0", "Epoch 1/2", 0.0) == []
    assert grouper.flush(0.5) == []  # still within the window: held back
    assert grouper.flush(1.2) == [Line(("worker-0",), "Epoch 1/2")]
    assert feed(grouper, events[1:]) == [Line(("worker-1",), "Epoch 1/2")]


def test_a_worker_order_is_never_changed_by_grouping() -> None:
    # worker-1 prints B before A: its A may not join worker-0's earlier A group.
    events = [(0.0, "worker-0", "A"), (0.0, "worker-0", "B"),
              (0.1, "worker-1", "B"), (0.1, "worker-1", "A")]  # fmt: skip
    out = feed(Grouper(W[:2]), events)
    for worker in W[:2]:
        printed = [line.text for line in out if worker in line.workers]
        wrote = [text for _, name, text in events if name == worker]
        assert printed == wrote
    assert Line(W[:2], "B") in out or Line(W[:2], "A") in out


def test_a_line_printed_twice_by_one_worker_is_printed_twice() -> None:
    out = feed(Grouper(W[:2]), [(0.0, "worker-0", "x"), (0.1, "worker-0", "x")])
    assert out == [Line(("worker-0",), "x"), Line(("worker-0",), "x")]


def test_merge_of_last_lines_groups_what_the_logs_share_in_order() -> None:
    logs = [
        ("worker-0", ["start 0", "Epoch 1/2", "loss 0.9", "Epoch 2/2", "done"]),
        ("worker-1", ["start 1", "Epoch 1/2", "loss 0.8", "Epoch 2/2", "done"]),
        ("worker-2", ["start 2", "Epoch 1/2", "loss 0.9", "Epoch 2/2", "done"]),
    ]
    merged = merge(logs)
    assert [line.text for line in merged if line.workers == W] == ["Epoch 1/2", "Epoch 2/2", "done"]
    for name, lines in logs:
        assert [line.text for line in merged if name in line.workers] == lines
    assert Line(("worker-0", "worker-2"), "loss 0.9") in merged
