"""A plain JAX script's cluster under `job.keras: jax`: `jax_cluster.initialize()`.

orchestrate gives every worker of a jax job the JAX cluster's variables (contract.py:
JAX_COORDINATOR_ADDRESS, the chief's host:port; JAX_NUM_PROCESSES; JAX_PROCESS_ID, the worker's
place in the inventory). `jax.distributed.initialize()` reads the coordinator's address from the
environment itself but the process count and id only as arguments (or from Slurm, Open MPI or
Kubernetes, none of which is here), so a script would have to pass them; this passes them. A
Keras 3 script needs none of it: `keras.distribution.initialize()` reads the KERAS_DISTRIBUTION_*
variables orchestrate sets beside these.

    import jax
    from worker import jax_cluster

    jax_cluster.initialize()  # before any other JAX call
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from orchestrator.contract import JAX_COORDINATOR_ENV, JAX_NUM_PROCESSES_ENV, JAX_PROCESS_ID_ENV

CLUSTER_ENV = (JAX_COORDINATOR_ENV, JAX_NUM_PROCESSES_ENV, JAX_PROCESS_ID_ENV)


def cluster_arguments(env: Mapping[str, str]) -> dict[str, str | int] | None:
    """jax.distributed.initialize's arguments from `env`; None where none of the variables is
    set (a script run by hand: one process, nothing to join). Some but not all of them, or a
    count or id that is no number, is a ValueError naming the variable."""
    found = {name: env.get(name) for name in CLUSTER_ENV}
    if not any(found.values()):
        return None
    missing = [name for name, value in found.items() if not value]
    if missing:
        raise ValueError(f"{', '.join(missing)} not set beside the other JAX cluster variables "
                         f"({', '.join(n for n in CLUSTER_ENV if n not in missing)}): orchestrate "
                         "sets all three under job.keras: jax")  # fmt: skip
    numbers = {}
    for name in (JAX_NUM_PROCESSES_ENV, JAX_PROCESS_ID_ENV):
        text = str(found[name])
        if not text.isdigit():
            raise ValueError(f"{name} is {text!r}, expected a whole number")
        numbers[name] = int(text)
    return {
        "coordinator_address": str(found[JAX_COORDINATOR_ENV]),
        "num_processes": numbers[JAX_NUM_PROCESSES_ENV],
        "process_id": numbers[JAX_PROCESS_ID_ENV],
    }


def initialize() -> bool:
    """Join this process to the job's JAX cluster (jax.distributed.initialize with the
    variables orchestrate set); False, joining nothing, outside one (no variables set)."""
    arguments = cluster_arguments(os.environ)
    if arguments is None:
        return False
    import jax  # here: importing the worker package must not need JAX (nor TensorFlow)

    jax.distributed.initialize(**arguments)  # type: ignore[arg-type]
    return True
