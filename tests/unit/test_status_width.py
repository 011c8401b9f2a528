"""`status` and the live view at the width they are printed at (issue 56): at 80 columns the
columns a person reads first show whole, the rest are left out, and what every worker shares
(the lockstep step and loss) is said once."""

from __future__ import annotations

import re
from dataclasses import replace

from rich.console import Console

from orchestrator.cli.live import PlainReporter, terminal_view
from orchestrator.cli.render import run_line, status_table
from orchestrator.cli.statustable import COLUMN_PRIORITY, COLUMNS, fitted, run_progress
from orchestrator.engine.observe.status import RunStatus, WorkerStatus, worker_status
from orchestrator.model.answers import WorkerProbe
from orchestrator.model.inventory import WorkerSlot
from orchestrator.model.records import WorkerRecord
from orchestrator.model.vocabulary import WorkerState


def a_worker(index: int, step: int, loss: float, **extra: object) -> WorkerStatus:
    host = WorkerSlot(f"gpu-node-{index:02d}.example.internal", f"10.0.0.{index + 1}", 20000)
    record = WorkerRecord(f"worker-{index}", index, host, "/r", "/r/worker.log", "/c")
    progress = {"step": step, "target_steps": 3000, "loss": loss, "accuracy": 0.8125,
                "val_loss": 0.4321, "val_accuracy": 0.875, "checkpoint_step": 2500,
                "steps_per_sec": 12.5, **extra}  # fmt: skip
    probe = WorkerProbe.parse(
        {"exists": True, "pid": 31337 + index, "alive": True, "worker_pid": 4000 + index,
         "progress": progress},
        now=0.0,
    )  # fmt: skip
    status = worker_status(record, probe)
    return replace(status, devices=("/device:CPU:0",), rss_bytes=900 << 20, cpu_percent=187.5)


def a_run(*workers: WorkerStatus) -> RunStatus:
    return RunStatus("20261207-083000-ab12", "shapes", WorkerState.RUNNING, workers,
                     started_at=1000.0)  # fmt: skip


def rendered(renderable: object, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def header_cells(lines: list[str]) -> list[str]:
    (header,) = [line for line in lines if "┃ worker" in line]
    return [cell.strip() for cell in header.strip("┃ ").split("┃")]


def test_at_80_columns_the_first_columns_show_whole_and_nothing_is_cut() -> None:
    run = a_run(a_worker(0, 2812, 0.41234), a_worker(1, 2790, 0.40987))
    lines = rendered(status_table(run), 80)
    assert max(map(len, lines)) <= 80
    assert "…" not in "\n".join(lines)
    headers = header_cells(lines)
    assert {"worker", "state", "step", "loss"} <= set(headers)
    assert "devices" not in headers  # left out, not squeezed
    text = "\n".join(lines)
    assert "acc 0.812  val_loss 0.4321" in text  # the same for both: said once
    assert "2812/3000" in text and "2790/3000" in text and "0.4123" in text
    assert re.search(r"│ worker-0 .*│ running .*│ 2812/3000 │ 0.4123 │", text)


def test_a_wide_terminal_shows_every_column() -> None:
    differ = [{"accuracy": 0.5 + i / 10, "val_loss": 1.0 + i, "val_accuracy": 0.1 * i,
               "checkpoint_step": 2000 + i} for i in range(2)]  # fmt: skip
    run = a_run(a_worker(0, 2812, 0.41234, **differ[0]), a_worker(1, 2790, 0.40987, **differ[1]))
    headers = header_cells(rendered(status_table(run), 300))
    assert headers == [c.header for c in COLUMNS]


def test_the_lockstep_step_and_loss_are_said_once_for_the_run() -> None:
    run = a_run(*(a_worker(i, 1200, 0.5, checkpoint_step=1000) for i in range(3)))
    lines = rendered(status_table(run), 80)
    text = "\n".join(lines)
    assert "step 1200/3000  loss 0.5" in text
    assert text.count("1200/3000") == 1
    headers = header_cells(lines)
    assert "step" not in headers and "loss" not in headers
    assert max(map(len, lines)) <= 80


def test_columns_are_taken_by_priority_while_they_fit() -> None:
    widths = dict.fromkeys(COLUMN_PRIORITY, 6)
    assert fitted(widths, 1 + 9 * 3) == ["worker", "state", "step"]
    widths["step"] = 40  # too wide: skipped, the narrower ones after it still fit
    assert fitted(widths, 1 + 9 * 3) == ["worker", "state", "loss"]
    assert fitted(widths, 5) == ["worker"]  # the first column is kept whatever the width


def test_the_terminal_view_has_a_progress_bar_with_elapsed_time() -> None:
    run = a_run(a_worker(0, 1500, 0.5), a_worker(1, 1400, 0.6))
    assert run_progress(run.workers) == (1400, 3000)
    lines = rendered(terminal_view(run), 80)
    (bar,) = [line for line in lines if "step 1400/3000" in line]
    assert "elapsed " in bar and "━" in bar
    assert max(map(len, lines)) <= 80


def test_a_pipe_gets_one_line_for_a_lockstep_run_and_a_line_per_worker_otherwise(
    capsys: object,
) -> None:
    lockstep = a_run(*(a_worker(i, 1200, 0.5) for i in range(3)))
    line = run_line(lockstep)
    assert line is not None and line.startswith(f"run {lockstep.run_id}: running, 3 workers")
    apart = a_run(a_worker(0, 1200, 0.5), a_worker(1, 1100, 0.5))
    assert run_line(apart) is None
    reporter = PlainReporter()
    reporter.report(lockstep)  # the first report: each worker's state is news
    reporter.last = 0.0  # the next report is a periodic one
    reporter.report(lockstep)
    out = capsys.readouterr().out.splitlines()  # type: ignore[attr-defined]
    assert len(out) == 4 and out[-1] == line
