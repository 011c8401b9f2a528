"""The end of `up` turns a dominant part of the goodput into the setting that shrinks it."""

from __future__ import annotations

from orchestrator.engine.observe.advice import goodput_advice
from orchestrator.engine.observe.goodput import Account, RunAccount
from orchestrator.model.inventory import Job


def account(**seconds: float) -> RunAccount:
    return RunAccount(Account(dict(seconds)), {}, (), restarts=0)


def test_evaluation_that_dominates_names_eval_every() -> None:
    job = Job(name="shapes", task="worker.examples.shapes:task", eval_every=100)
    lines = goodput_advice(account(productive=65, evaluation=19, startup=10, checkpoint=6), job)
    assert lines == ["evaluation took 19% of the time: raise job.eval_every (now 100)"]


def test_a_healthy_run_gets_no_advice_and_a_script_gets_words_not_task_settings() -> None:
    job = Job(name="shapes", task="worker.examples.shapes:task", eval_every=100)
    assert goodput_advice(account(productive=90, evaluation=5, startup=5), job) == []
    script = Job(name="fit", script="train.py")
    (line,) = goodput_advice(account(productive=70, checkpoint=30), script)
    assert line == "checkpoints took 30% of the time: save less often"


def test_lost_work_and_stalls_name_their_settings() -> None:
    job = Job(name="shapes", task="worker.examples.shapes:task", checkpoint_every=500)
    lines = goodput_advice(account(productive=50, lost=25, stall=25), job)
    assert lines[0].endswith("lower job.checkpoint_every (now 500)")
    assert "job.stall_timeout (now 300 s)" in lines[1]
    assert goodput_advice(account(), job) == []


def test_a_long_start_up_names_the_framework_the_job_imports() -> None:
    tensorflow = Job(name="shapes", task="worker.examples.shapes:task")
    jax = Job(name="shapes", task="worker.examples.shapes:task", keras="jax")
    (tf_line,) = goodput_advice(account(productive=60, startup=40), tensorflow)
    (jax_line,) = goodput_advice(account(productive=60, startup=40), jax)
    assert "importing TensorFlow" in tf_line and "importing JAX" in jax_line
