"""A run record that cannot be read (issue 54): a RecordDamaged naming the run, never a
traceback, also when it is nested too deep for json; `down` of such a run with no supervisor
alive says that only the record knows where the workers are, and leaves the stop flag so no
new attempt starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.contact import stop_unrecorded
from orchestrator.errors import RecordDamaged

RUN = "20260101-000000-dead"


def _store(tmp_path: Path, text: str) -> RunStore:
    store = RunStore(tmp_path / "state")
    store.write_file(store.root / "current", RUN + "\n")
    store.write_file(store.root / "runs" / f"{RUN}.json", text)
    return store


@pytest.mark.parametrize(
    ("text", "said"),
    [("[" * 60_000, "JSON nested too deep"), ('{"run_id": "x", "work', "Unterminated string")],
)
def test_a_damaged_record_is_record_damaged(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(RecordDamaged, match=said) as caught:
        _store(tmp_path, text).load()
    assert caught.value.run_id == RUN and caught.value.exit_code == 4


def test_down_without_a_supervisor_says_only_the_record_knows(tmp_path: Path) -> None:
    store = _store(tmp_path, "{")
    with pytest.raises(RecordDamaged) as damaged:
        store.load()
    with pytest.raises(RecordDamaged, match="no supervisor of the run answered"):
        stop_unrecorded(store, damaged.value, grace=1.0)
    assert store.stop_flag(RUN).exists()  # no new attempt starts
    assert store.stop_request(RUN) is None  # and no late supervisor stops anything twice
