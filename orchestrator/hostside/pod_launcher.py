"""The launcher each pod of an exported TrainJob starts: it writes the pod's TF_CONFIG and runs
the worker under it, passing SIGTERM on (the worker saves a checkpoint) and its exit code out.

STANDARD LIBRARY ONLY: its source, with contract.py carried in front of it (hostside/bundle.py),
is the `node` container's command (`python -c SOURCE ARGV...`) in the TrainingRuntime that
trainjob.py writes, so the image needs nothing of orchestrate but the worker package (for a task
job) and a Python 3.7 or newer. The worker list comes from the export, in the environment
(ORCHESTRATE_TF_WORKERS, JSON: JobSet's stable pod host names `{name}-node-0-{i}.{name}:{port}`,
which exist because the TrainJob's JobSet has that name); the pod reads only the index the
Indexed Job gives it, JOB_COMPLETION_INDEX. Index 0 is the chief.

ORCHESTRATE_JOBSET_NAME (the downward API: the pod's jobset.sigs.k8s.io/jobset-name label), when
set, must be the name the list was computed for: a TrainJob submitted under another name would
otherwise wait forever for peers that do not exist; it exits 2 (permanent) naming both.

ORCHESTRATE_CLUSTER=jax (a `keras: jax` job, whose runtime has the Trainer's jax policy): no
TF_CONFIG; the Trainer gave the pod JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID,
which must be what the export's pod list says (else exit 2 naming them: a runtime without the
jax policy, a TrainJob without a trainer), and this adds the KERAS_DISTRIBUTION_* variables
keras.distribution.initialize() reads (contract.jax_cluster_env, as every launcher builds them).
"""

import json
import os
import signal
import subprocess
import sys

if __package__:  # imported as part of orchestrate: trainjob.py, the controller's tests
    from orchestrator import contract
else:  # shipped: hostside/bundle.py carries it in front of this file's source
    import contract  # type: ignore[no-redef]

WORKERS_ENV = "ORCHESTRATE_TF_WORKERS"
JOBSET_NAME_ENV = "ORCHESTRATE_JOBSET_NAME"
INDEX_ENV = "JOB_COMPLETION_INDEX"
CLUSTER_ENV = "ORCHESTRATE_CLUSTER"
# What the Trainer's jax policy writes; each is checked against the export's pod list.
TRAINER_JAX_ENV = (
    contract.JAX_COORDINATOR_ENV,
    contract.JAX_NUM_PROCESSES_ENV,
    contract.JAX_PROCESS_ID_ENV,
)


def tf_config(workers, index):
    """Every pod a worker, in the export's order (contract.tf_config, as every launcher)."""
    return contract.tf_config(list(workers), [contract.ROLE_WORKER] * len(workers), index)


def jobset_of(worker):
    """'shapes-node-0-1.shapes:2222' -> 'shapes': the subdomain is the JobSet's name."""
    host = worker.rsplit(":", 1)[0]
    return host.split(".", 1)[1] if "." in host else ""


def problem(workers, index_text, jobset_name):
    """Why this pod cannot be given a TF_CONFIG, or None."""
    if not index_text or not index_text.isdigit():
        return f"{INDEX_ENV} is {index_text!r}: the runtime's Job must be Indexed"
    if int(index_text) >= len(workers):
        return f"{INDEX_ENV}={index_text} but the export has {len(workers)} workers"
    expected = jobset_of(workers[0])
    if jobset_name and expected and jobset_name != expected:
        return (
            f"this TrainJob is named {jobset_name!r} but its runtime's worker list was exported "
            f"for {expected!r}: export again with --name {jobset_name}"
        )
    return None


def jax_env(workers, index, env):
    """(the pod's JAX cluster, None), or (None, why not): the Trainer's variables in `env` that
    differ from the export's, or are missing."""
    ours = contract.jax_cluster_env(list(workers), index)
    wrong = [f"{name}={env.get(name)!r} (the export says {ours[name]!r})"
             for name in TRAINER_JAX_ENV if env.get(name) != ours[name]]  # fmt: skip
    if not wrong:
        return ours, None
    return None, (f"{', '.join(wrong)}: the TrainingRuntime needs the Trainer's jax policy "
                  "(mlPolicy.jax) and the TrainJob a trainer, as exported")  # fmt: skip


def run(argv, env):
    """The worker's exit code (128+N for a death by signal N); until it exits, SIGTERM and
    SIGINT are passed on (pod deletion, preemption: the built-in loop saves and exits 75)."""
    child = subprocess.Popen(argv, env=env)  # spawn point: the pod's worker

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    returncode = child.wait()
    return returncode if returncode >= 0 else 128 - returncode


def main():
    workers = json.loads(os.environ.pop(WORKERS_ENV, "[]"))
    index_text = os.environ.get(INDEX_ENV, "")
    found = problem(workers, index_text, os.environ.get(JOBSET_NAME_ENV, ""))
    if found is None and not sys.argv[1:]:
        found = "no worker command (the container's args)"
    if found is not None:
        print(f"orchestrate launcher: {found}", file=sys.stderr, flush=True)
        return contract.EXIT_USAGE
    index = int(index_text)
    env = dict(os.environ)
    if env.pop(CLUSTER_ENV, "") == contract.KERAS_JAX:
        cluster, found = jax_env(workers, index, env)
        if found is not None:
            print(f"orchestrate launcher: {found}", file=sys.stderr, flush=True)
            return contract.EXIT_USAGE
        env.pop(contract.TF_CONFIG_ENV, None)
        env.update(cluster)
        addresses = cluster[contract.KERAS_ADDRESSES_ENV]
        said = f"process {index} of {len(workers)}, JAX cluster {addresses}"
    else:
        env[contract.TF_CONFIG_ENV] = json.dumps(tf_config(workers, index))
        role = " (chief)" if index == 0 else ""
        said = f"worker {index} of {len(workers)}{role}, TF_CONFIG {env[contract.TF_CONFIG_ENV]}"
    print(f"orchestrate launcher: {said}", flush=True)
    try:
        return run(sys.argv[1:], env)
    except OSError as exc:
        print(f"orchestrate launcher: cannot start {sys.argv[1]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
