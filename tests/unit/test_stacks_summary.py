"""The stack summariser on stacks recorded from real TensorFlow 2.21 processes (tests/unit/stacks/,
paths shortened), and the supervisor keeping them at a stall (fake backend)."""

from __future__ import annotations

import stat
from pathlib import Path

from orchestrator.engine.observe.stacks import (
    Frame,
    grouped,
    last_dump,
    parse,
    summarise,
    worker_place,
)
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.vocabulary import WorkerState
from tests.fakes.backend import FakeBackend, exited, running
from tests.unit.test_supervisor_with_fake_backend import supervise

RECORDED = Path(__file__).parent / "stacks"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def main_thread_only(text: str) -> str:
    return text[text.index("Current thread") :]


def test_a_worker_in_user_code_is_the_one_the_compiled_step_waits_for() -> None:
    summary = summarise({"worker-0": recorded("script-compiled-step.txt"),
                         "worker-1": recorded("script-user-wait.txt")})  # fmt: skip
    assert summary.blamed == "worker-1"
    assert summary.describe() == (
        "worker-1 is in stuck_here (hang.py:5); worker-0 waits in the compiled step, from main "
        "(hang.py:22): the others wait for worker-1"
    )


def test_known_tensorflow_waits_are_said_in_words() -> None:
    save = worker_place(parse(recorded("eager-save.txt")))
    assert save is not None and save.waits
    assert save.words == "is saving a checkpoint, from main (record.py:21)"
    get_next = worker_place(parse(main_thread_only(recorded("eager-getnext.txt"))))
    assert get_next is not None and get_next.waits
    assert get_next.words == ("waits for its input pipeline (iterator get_next), from main "
                              "(record.py:16)")  # fmt: skip
    collective = worker_place(parse(recorded("eager-collective.txt")))
    # Eager strategy.reduce: the main thread waits on a pool thread that runs the all-reduce.
    assert collective is not None and collective.waits
    assert collective.words == "waits in a collective (all-reduce), from main (record.py:30)"


def test_a_jax_process_waiting_for_its_cluster_is_a_wait_and_its_late_peer_is_blamed() -> None:
    # Recorded from Keras 3.15.1 / JAX 0.10.2: keras.distribution.initialize() with its peer
    # never started (job.keras: jax).
    forming = worker_place(parse(recorded("jax-initialize.txt")))
    assert forming is not None and forming.waits
    assert forming.words == (
        "waits for the JAX cluster to form (jax.distributed.initialize: the coordinator or a "
        "peer has not registered), from <module> (train.py:6)"
    )
    summary = summarise({"worker-0": recorded("jax-initialize.txt"),
                         "worker-1": recorded("script-user-wait.txt")})  # fmt: skip
    assert summary.blamed == "worker-1"


def test_a_py_function_blocking_inside_the_pipeline_is_user_code_inside_tensorflow() -> None:
    # The main thread waits in get_next; TensorFlow's thread runs the user's function.
    place = worker_place(parse(recorded("eager-getnext.txt")))
    assert place is not None and not place.waits
    assert place.words == "is in wait_in_pipeline (record.py:9), inside TensorFlow (a py_function)"
    summary = summarise({"a": recorded("script-compiled-step.txt"),
                         "b": recorded("eager-getnext.txt")})  # fmt: skip
    assert summary.blamed == "b"


def test_none_or_several_elsewhere_is_undetermined() -> None:
    waiting = recorded("script-compiled-step.txt")
    both_wait = summarise({"a": waiting, "b": waiting})
    assert both_wait.blamed is None
    assert both_wait.describe().endswith("which worker the others wait for is undetermined")
    stuck = recorded("script-user-wait.txt")
    assert summarise({"a": stuck, "b": stuck, "c": waiting}).blamed is None


def test_a_worker_that_cannot_answer_is_named_and_never_blamed() -> None:
    summary = summarise({"a": recorded("script-compiled-step.txt"), "b": None},
                        {"c": "its host did not answer"})  # fmt: skip
    assert summary.blamed is None
    text = summary.describe()
    assert "c did not answer (its host did not answer)" in text
    assert "b did not answer (no Python stack in its answer)" in text
    # Alone in user code beside a silent peer (say, a SIGSTOPped one) it is no culprit.
    alone = summarise({"a": recorded("script-user-wait.txt")}, {"b": "it is stopped"})
    assert alone.blamed is None


def test_an_import_is_no_wait_in_tensorflow() -> None:
    importing = (
        "Current thread 0x00007f00 (most recent call first):\n"
        '  File "/v/lib/python3.11/site-packages/tensorflow/python/distribute/cross_device_ops.py",'
        " line 30 in <module>\n"
        '  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed\n'
        '  File "<frozen importlib._bootstrap>", line 1176 in _find_and_load\n'
        '  File "/home/u/train.py", line 8 in <module>\n'
    )
    place = worker_place(parse(importing))
    assert place is not None and place.kind == "importing" and not place.waits
    assert place.words == "is importing a module, from <module> (train.py:8)"


def test_a_dump_written_twice_is_read_once_and_identical_stacks_are_grouped() -> None:
    once = recorded("eager-getnext.txt")
    twice = once + "\n" + once
    assert parse(twice) == parse(once) and last_dump(twice).strip() == once.strip()
    other_ids = once.replace("0x00007fd3", "0x00007eee")
    groups = grouped({"a": once, "b": other_ids, "c": recorded("eager-save.txt")})
    assert [members for members, _ in groups] == [["a", "b"], ["c"]]


def test_installed_orchestrate_code_counts_as_ours_and_libraries_do_not() -> None:
    site = "/v/lib/python3.11/site-packages"
    assert Frame(f"{site}/worker/train.py", 1, "run").ours
    assert not Frame(f"{site}/tensorflow/python/eager/execute.py", 1, "quick_execute").ours
    assert not Frame("/usr/lib/python3.11/threading.py", 1, "wait").ours
    assert not Frame("<string>", 1, "<module>").ours  # the boot of a script


def test_a_stall_keeps_every_workers_stacks_and_blames_the_one_the_others_wait_for(
    tmp_path: Path,
) -> None:
    backend = FakeBackend(
        scripts={"a": {0: [running(3)], 1: [exited(0, 5)]}, "b": {0: [running(3)],
                 1: [exited(0, 5)]}},
        stack_texts={"a": recorded("script-compiled-step.txt"),
                     "b": recorded("script-user-wait.txt")},
    )  # fmt: skip
    hosts = (WorkerSlot("a", "10.0.0.1", 20000), WorkerSlot("b", "10.0.0.2", 20000))
    # A sub-second stall (an inventory asks for whole seconds) keeps the test fast.
    job = Job("demo", script="t.py", restart_backoff=0, stall_timeout=0.2)  # type: ignore[arg-type]
    inventory = Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts, job)
    store, outcome = supervise(tmp_path, backend, inventory)
    assert isinstance(outcome, tuple), outcome
    final, messages = outcome
    assert final.state is WorkerState.SUCCEEDED
    (restart,) = store.load().restarts
    # The watch saw `a` first; the stacks say a waits for b.
    assert (restart.worker, restart.kind) == ("b", "stalled")
    assert "b is in stuck_here (hang.py:5); a waits in the compiled step" in restart.reason
    assert backend.stack_requests == [(["a", "b"], 5.0)]  # before the stop, 5 s in all
    kept = store.stacks_dir(store.load().run_id) / "attempt-0"
    assert sorted(p.name for p in kept.iterdir()) == ["a.txt", "b.txt"]
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700
    assert stat.S_IMODE((kept / "b.txt").stat().st_mode) == 0o600
    assert any("stacks of every worker at the stall" in m for m in messages)


def test_a_stall_with_workers_that_cannot_answer_still_restarts(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={"a": {0: [running(3)], 1: [exited(0, 5)]},
                                   "b": {0: [running(3)], 1: [exited(0, 5)]}})  # fmt: skip
    hosts = (WorkerSlot("a", "10.0.0.1", 20000), WorkerSlot("b", "10.0.0.2", 20000))
    # A sub-second stall (an inventory asks for whole seconds) keeps the test fast.
    job = Job("demo", script="t.py", restart_backoff=0, stall_timeout=0.2)  # type: ignore[arg-type]
    inventory = Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts, job)
    store, _ = supervise(tmp_path, backend, inventory)
    (restart,) = store.load().restarts
    assert restart.worker == "a" and "a did not answer (it wrote no stacks within 5 s)" in (
        restart.reason
    )
    kept = store.stacks_dir(store.load().run_id) / "attempt-0"
    assert (kept / "b.txt").read_text().startswith("# no stacks: it wrote no stacks")


def test_the_dashboard_serves_the_kept_stacks_of_each_restart_as_escaped_text(
    tmp_path: Path,
) -> None:
    import warnings

    from orchestrator.dashboard.app import create_app
    from orchestrator.dashboard.model import timeline
    from orchestrator.dashboard.watch import Hub
    from orchestrator.engine.supervision.hangs import kept

    backend = FakeBackend(
        scripts={"a": {0: [running(3)], 1: [exited(0, 5)]}, "b": {0: [running(3)],
                 1: [exited(0, 5)]}},
        stack_texts={"a": recorded("script-compiled-step.txt"),
                     "b": "Thread 0x1 (most recent call first):\n  File \"<script>x.py\", line 1"
                          " in f\n"},
    )  # fmt: skip
    hosts = (WorkerSlot("a", "10.0.0.1", 20000), WorkerSlot("b", "10.0.0.2", 20000))
    # A sub-second stall (an inventory asks for whole seconds) keeps the test fast.
    job = Job("demo", script="t.py", restart_backoff=0, stall_timeout=0.2)  # type: ignore[arg-type]
    store, _ = supervise(
        tmp_path, backend, Inventory(str(tmp_path / "i"), str(tmp_path), hosts, job)
    )
    record = store.load()
    names = {n: sorted(files) for n, files in kept(store, record.run_id).items()}
    assert timeline(record, names)[0]["stacks"] == ["a", "b"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

        client = TestClient(create_app(Hub(store, 1.0)))
    base = f"/api/runs/{record.run_id}/stacks"
    answer = client.get(f"{base}/0/b")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "<script>x.py" in answer.text  # text/plain, never rendered as HTML
    assert client.get(f"{base}/0/a").text.startswith("Current thread")
    for missing in (f"{base}/1/a", f"{base}/0/c", f"{base}/x/a", f"{base}/0/..%2Fa",
                    "/api/runs/nope/stacks/0/a"):  # fmt: skip
        assert client.get(missing).status_code == 404, missing
