"""Benchmark for issue 31: the same job under Ray Train and under orchestrate, side by side.

The bundled example (worker.examples.shapes: its model and generated data), global batch 64, two
workers on this machine, Keras 2 on both sides: Ray sets TF_USE_LEGACY_KERAS=1 in every
TensorFlow worker, so orchestrate runs with `keras: legacy`. Ray is not a dependency of the
project: the bench installs it into its own venv (--ray-venv, made with `python3 -m venv` and pip
on first use: ray[train] 2.60, the project's TensorFlow and tf-keras) and runs job.py there,
`ray.init(num_cpus=<this machine's CPUs>)` included; its TensorflowTrainer runs the training
function on two actors with FailureConfig(max_failures=3) and a checkpoint every 50 steps
(train.report with a Checkpoint from every rank at each 50-step epoch, restored from
ray.train.get_checkpoint() as Ray's docs show; Ray's own ReportCheckpointCallback fails here
under tf_keras's model.fit: "'ReportCheckpointCallback' object has no attribute
'_implements_test_batch_hooks'", a callback class of another Keras than the model's).
orchestrate runs `orchestrate up --skip-checks` in the foreground (restart_backoff 0, warm
restarts on, checkpoint_every 50). Per repeat, methods alternating (the order flips each repeat):

  cold start   the command started -> both workers' first training step
  steps/s      the chief's logged rate over the steady windows (the first one left out)
  beside       RSS and CPU% of every process the launcher runs besides the two training
               workers, summed, sampled over 5 s of the steady run (Ray: the driver, GCS, raylet,
               dashboard and agents; orchestrate: `up` itself with its supervisor, the agent
               session, the host supervisors and the standbys)
  recovery     SIGKILL of worker 1 -> both workers' first step of the next attempt
  shutdown     STEADY_S after the recovery (a stop in a long run's steady state, not in the
               restart's wake, when orchestrate's standbys for the next restart import
               TensorFlow beside everything), a stop request (Ray: SIGINT to the driver, Ctrl-C;
               orchestrate: `orchestrate down`) -> every process of the launcher and its
               workers gone

Medians over the repeats and the paired ratio orchestrate/Ray per figure (below 1: orchestrate
ahead; steps/s: above 1). The machine's load average is printed with every sample.

    .venv/bin/python -m bench.bench_vs_ray [--repeats 5] [--ray-venv /tmp/ray-venv]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.bench_launch import env as bench_env
from bench.bench_launch import free_ports

REPO = Path(__file__).resolve().parents[1]
TF_PIN = "tensorflow==2.21.0"  # the project's pin (pyproject.toml)
RAY_PACKAGES = ("ray[train]==2.60.*", TF_PIN, "tf-keras==2.21.0")
CHECKPOINT_EVERY = 50
LOG_EVERY = 50
STEADY_S = 25.0  # seconds of steady run before the sample and the kill
TIMEOUT = 300.0
RATE = re.compile(r"steps/s ([0-9.]+)")

JOB_PY = """\
import json, os, sys, time
import ray
from ray import train
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

OUT = sys.argv[1]
EVERY = int(sys.argv[2])


def train_fn(config):
    import tempfile

    import tensorflow as tf

    from worker.examples import shapes
    from worker.kerasflavor import keras as chosen_keras

    keras = chosen_keras()  # tf_keras: Ray set TF_USE_LEGACY_KERAS=1

    rank = train.get_context().get_world_rank()
    log = open(os.path.join(OUT, f"rank{rank}.log"), "a", buffering=1)
    log.write(f"pid {os.getpid()} {time.time()}\\n")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = shapes.build_model()  # Keras 2 here: Ray set TF_USE_LEGACY_KERAS=1
        model.compile(optimizer=shapes.build_optimizer(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            model.load_weights(os.path.join(directory, "weights"))
            epoch = json.load(open(os.path.join(directory, "epoch.json")))["epoch"]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = shapes.build_dataset().shuffle(4096, seed=1).repeat().batch(64).with_options(options)

    class Steps(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.first = True
            self.mark = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if self.first:
                log.write(f"first step done {time.time()}\\n")
                self.first = False
                self.mark = time.perf_counter()

        def on_epoch_end(self, epoch_index, logs=None):
            now = time.perf_counter()
            log.write(f"epoch {epoch_index} steps/s {EVERY / (now - self.mark):.1f}\\n")
            self.mark = now
            # Ray's ReportCheckpointCallback fails under tf_keras's model.fit here ("no
            # attribute '_implements_test_batch_hooks'"). The report by hand, as Ray's
            # docs show for a loop of one's own: every rank saves and reports.
            with tempfile.TemporaryDirectory() as directory:
                model.save_weights(os.path.join(directory, "weights"))
                with open(os.path.join(directory, "epoch.json"), "w") as handle:
                    json.dump({"epoch": epoch_index + 1}, handle)
                train.report({"epoch": epoch_index + 1},
                             checkpoint=train.Checkpoint.from_directory(directory))

    model.fit(data, epochs=10000, initial_epoch=epoch, steps_per_epoch=EVERY, verbose=0,
              callbacks=[Steps()])


if __name__ == "__main__":
    ray.init(num_cpus=os.cpu_count())  # the dashboard needs ray[default]: not with ray[train]
    trainer = TensorflowTrainer(
        train_fn,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.join(OUT, "ray_results"),
                             failure_config=FailureConfig(max_failures=3)),
    )
    trainer.fit()
"""


@dataclass
class Sample:
    cold_s: float = float("nan")
    steps_per_s: float = float("nan")
    beside_rss_mib: float = float("nan")
    beside_cpu_pct: float = float("nan")
    recovery_s: float = float("nan")
    shutdown_s: float = float("nan")
    # shutdown's parts: the stop request taken (orchestrate: `down` started and wrote it; Ray:
    # the signal sent), the two training workers gone, then the rest (launcher, helpers) gone
    shutdown_request_s: float = float("nan")
    shutdown_workers_s: float = float("nan")
    load: list[float] = field(default_factory=list)


FIGURES = ("cold_s", "steps_per_s", "beside_rss_mib", "beside_cpu_pct", "recovery_s",
           "shutdown_s", "shutdown_request_s", "shutdown_workers_s")  # fmt: skip


def timed_shutdown(sample: Sample, asked: float, requested: Callable[[], bool],
                   workers: set[int], ended: Callable[[], bool]) -> None:  # fmt: skip
    """The shutdown and its parts, looked at every 5 ms from `asked` on."""
    deadline = asked + TIMEOUT
    while time.monotonic() < deadline:
        now = time.monotonic() - asked
        if sample.shutdown_request_s != sample.shutdown_request_s and requested():
            sample.shutdown_request_s = now
        if sample.shutdown_workers_s != sample.shutdown_workers_s and all_gone(workers):
            sample.shutdown_workers_s = now
        if ended() and sample.shutdown_workers_s == sample.shutdown_workers_s:
            sample.shutdown_s = now
            return
        time.sleep(0.005)
    raise TimeoutError("shutdown")


def ensure_ray(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import ray.train.tensorflow, tf_keras"],
                           check=False, capture_output=True)  # fmt: skip
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *RAY_PACKAGES], check=True)
    return python


def wait(predicate: Callable[[], bool], timeout: float = TIMEOUT, what: str = "") -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.01)
    raise TimeoutError(what)


def family(roots: list[int]) -> set[int]:
    pids: set[int] = set()
    for pid in roots:
        try:
            process = psutil.Process(pid)
            pids.add(pid)
            pids.update(child.pid for child in process.children(recursive=True))
        except psutil.Error:
            continue
    return pids


def beside(pids: set[int], workers: set[int], seconds: float = 5.0) -> tuple[float, float]:
    """Summed RSS (MiB) and CPU% of pids other than the workers, over `seconds`."""
    processes = []
    for pid in pids - workers:
        try:
            process = psutil.Process(pid)
            process.cpu_percent(None)
            processes.append(process)
        except psutil.Error:
            continue
    time.sleep(seconds)
    rss = cpu = 0.0
    for process in processes:
        try:
            cpu += process.cpu_percent(None)
            rss += process.memory_info().rss / 2**20
        except psutil.Error:
            continue
    return rss, cpu


def all_gone(pids: set[int]) -> bool:
    return not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in pids)  # fmt: skip


def text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def rates(log: str) -> list[float]:
    return [float(value) for value in RATE.findall(log)]


def orchestrate_trial(root: Path) -> Sample:
    sample = Sample()
    ports = free_ports()
    (root / "inv.yaml").write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: {root}/work}}
        hosts:
          - {{name: w0, address: localhost, port: {ports[0]}}}
          - {{name: w1, address: localhost, port: {ports[1]}}}
        job: {{name: vsray, task: "worker.examples.shapes:task", keras: legacy, steps: 1000000,
               batch_size: 64, checkpoint_every: {CHECKPOINT_EVERY}, log_every: {LOG_EVERY},
               restart_backoff: 0, max_restarts: 3}}
        """)
    )
    cli = [sys.executable, "-m", "orchestrator"]
    runs = root / "work" / "vsray" / "runs"

    def firsts(attempt: int) -> bool:
        logs = list(runs.glob(f"*/attempt-{attempt}/*/worker.log"))
        return len(logs) == 2 and all("first step done" in text(log) for log in logs)

    started = time.monotonic()
    up = subprocess.Popen([*cli, "up", "--skip-checks", "inv.yaml"], cwd=root, env=bench_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        sample.cold_s = wait(lambda: firsts(0), what="orchestrate first step") - started
        time.sleep(STEADY_S)
        status = json.loads(
            subprocess.run(
                [*cli, "status", "--json"],
                cwd=root,
                env=bench_env(),
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        workers = {int(w["pid"]) for w in status["workers"]}
        supervisors = [p.pid for p in psutil.process_iter(["cmdline"])
                       if str(root) in " ".join(p.info["cmdline"] or [])]  # fmt: skip
        pids = family([up.pid, *supervisors])
        sample.beside_rss_mib, sample.beside_cpu_pct = beside(pids, workers)
        chief = next(runs.glob("*/attempt-0/w0/worker.log"))
        sample.steps_per_s = statistics.median(rates(text(chief))[1:] or [float("nan")])
        victim = next(int(w["pid"]) for w in status["workers"] if w["name"] == "w1")
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        sample.recovery_s = wait(lambda: firsts(1), what="orchestrate recovery") - killed
        time.sleep(STEADY_S)
        supervisors = [p.pid for p in psutil.process_iter(["cmdline"])
                       if str(root) in " ".join(p.info["cmdline"] or [])]  # fmt: skip
        pids = family([up.pid, *supervisors])
        shown = subprocess.run([*cli, "status", "--json"], cwd=root, env=bench_env(),
                               capture_output=True, text=True, check=True)  # fmt: skip
        workers = {int(w["pid"]) for w in json.loads(shown.stdout)["workers"]}  # the new attempt's
        state = root / ".orchestrate"
        asked = time.monotonic()
        down = subprocess.Popen([*cli, "down"], cwd=root, env=bench_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        timed_shutdown(sample, asked, lambda: any(state.rglob("*.stop")), workers,
                       lambda: down.poll() is not None and up.poll() is not None
                       and all_gone(pids))  # fmt: skip
    finally:
        up.kill()
        subprocess.run([*cli, "down"], cwd=root, env=bench_env(), capture_output=True, check=False)
    return sample


def ray_trial(root: Path, python: Path) -> Sample:
    sample = Sample()
    (root / "job.py").write_text(JOB_PY)
    out = root / "out"
    out.mkdir()
    logs = [out / "rank0.log", out / "rank1.log"]
    environment = {**bench_env(), "RAY_USAGE_STATS_ENABLED": "0"}

    def firsts(count: int) -> bool:
        if driver.poll() is not None:
            raise TimeoutError(f"job.py exited {driver.returncode}")
        return all(text(log).count("first step done") >= count for log in logs)

    started = time.monotonic()
    with open(root / "driver.log", "w") as driver_log:
        driver = subprocess.Popen([str(python), "job.py", str(out), str(CHECKPOINT_EVERY)],
                                  cwd=root, env=environment, stdout=driver_log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    try:
        sample.cold_s = wait(lambda: firsts(1), what="ray first step") - started
        time.sleep(STEADY_S)
        workers = {int(text(log).split("pid ")[-1].split()[0]) for log in logs}
        pids = family([driver.pid])
        sample.beside_rss_mib, sample.beside_cpu_pct = beside(pids, workers)
        sample.steps_per_s = statistics.median(rates(text(logs[0]))[1:] or [float("nan")])
        victim = int(text(logs[1]).split("pid ")[-1].split()[0])
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        sample.recovery_s = wait(lambda: firsts(2), what="ray recovery") - killed
        time.sleep(STEADY_S)
        pids = family([driver.pid])
        asked = time.monotonic()
        driver.send_signal(signal.SIGINT)
        workers = {int(text(log).split("pid ")[-1].split()[0]) for log in logs}
        timed_shutdown(sample, asked, lambda: True, workers,
                       lambda: driver.poll() is not None and all_gone(pids))  # fmt: skip
    finally:
        for pid in family([driver.pid]):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
    return sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ray-venv", type=Path, default=Path("/tmp/ray-venv"))
    args = parser.parse_args()
    python = ensure_ray(args.ray_venv)
    results: dict[str, dict[int, Sample]] = {"orchestrate": {}, "ray": {}}
    for repeat in range(args.repeats):
        order = ("ray", "orchestrate") if repeat % 2 == 0 else ("orchestrate", "ray")
        for method in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-vsray-{method}-") as scratch:
                load = list(os.getloadavg())
                try:
                    sample = (orchestrate_trial(Path(scratch)) if method == "orchestrate"
                              else ray_trial(Path(scratch), python))  # fmt: skip
                except (TimeoutError, subprocess.CalledProcessError, StopIteration) as error:
                    print(f"repeat {repeat + 1} {method}: failed: {error!r}", flush=True)
                    if method == "ray":
                        print(text(Path(scratch) / "driver.log")[-3000:], flush=True)
                    continue
                sample.load = load
                results[method][repeat] = sample
                figures = ", ".join(f"{name} {getattr(sample, name):.2f}" for name in FIGURES)
                print(f"repeat {repeat + 1} {method}: {figures}; load {load[0]:.1f}", flush=True)
    print(f"\n{'figure':<16} {'orchestrate':>12} {'ray':>10} {'paired o/r':>11}")
    pairs = [
        (results["orchestrate"][r], results["ray"][r])
        for r in range(args.repeats)
        if r in results["orchestrate"] and r in results["ray"]
    ]  # the same repeat's
    for name in FIGURES:
        mine = [getattr(s, name) for s in results["orchestrate"].values()]
        theirs = [getattr(s, name) for s in results["ray"].values()]
        ratio = [getattr(a, name) / getattr(b, name) for a, b in pairs if getattr(b, name)]
        cells = [f"{statistics.median(v):.2f}" if v else "-" for v in (mine, theirs, ratio)]
        print(f"{name:<16} {cells[0]:>12} {cells[1]:>10} {cells[2]:>11}")


if __name__ == "__main__":
    main()
