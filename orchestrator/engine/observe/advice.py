"""What the end of `up` advises from the run's goodput: the part that took a large share of the
machines' time, and the job setting that shrinks it ("evaluation took 19 % of the time: raise
job.eval_every (now 100)"). Pure."""

from __future__ import annotations

from orchestrator.contract import KERAS_JAX
from orchestrator.engine.observe.goodput import RunAccount, share
from orchestrator.model.inventory import Job

# A part at or above this share of the run's time is worth a line of advice.
DOMINANT = 0.15


def goodput_advice(account: RunAccount, job: Job) -> list[str]:
    """A line per part that took at least DOMINANT of the time and that a setting shrinks."""
    cluster = account.cluster
    if cluster.total <= 0 or cluster.goodput is None:
        return []
    lines = []
    evaluation = share(cluster, "evaluation")
    if evaluation >= DOMINANT and job.eval_every:
        lines.append(f"evaluation took {evaluation:.0%} of the time: raise job.eval_every "
                     f"(now {job.eval_every})")  # fmt: skip
    checkpoints = share(cluster, "checkpoint")
    if checkpoints >= DOMINANT:
        how = (f"raise job.checkpoint_every (now {job.checkpoint_every})" if job.task
               else "save less often")  # fmt: skip
        lines.append(f"checkpoints took {checkpoints:.0%} of the time: {how}")
    lost = share(cluster, "lost")
    if lost >= DOMINANT:
        how = (f"lower job.checkpoint_every (now {job.checkpoint_every})" if job.task
               else "save more often")  # fmt: skip
        lines.append(f"work lost to restarts took {lost:.0%} of the time (steps trained again "
                     f"after the last checkpoint): {how}")  # fmt: skip
    stalls = share(cluster, "stall")
    if stalls >= DOMINANT:
        lines.append(f"stalls took {stalls:.0%} of the time: a lower job.stall_timeout (now "
                     f"{job.stall_timeout:g} s) restarts a hung cluster sooner")  # fmt: skip
    startup = share(cluster, "startup")
    if startup >= 2 * DOMINANT:
        framework = "JAX" if job.keras == KERAS_JAX else "TensorFlow"
        lines.append(f"start-up took {startup:.0%} of the time: for a run this short, most of it "
                     f"is importing {framework} and forming the cluster")  # fmt: skip
    return lines
