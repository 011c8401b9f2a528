"""Checks, on a machine with a GPU, that the worker's GPU settings do what they say.

    python bench/gpu_check.py [--memory-limit-mb 1024] [--logical-gpus 2]

Three checks, each in its own subprocess because tf.config settings can be applied only once per
process, before the TensorFlow runtime starts:
  1. memory growth: after a small allocation, the process holds far less than the whole GPU;
  2. memory limit: GPU:0 becomes one logical device of N MiB; a tensor of N/4 MiB fits and one of
     2N MiB fails with ResourceExhaustedError;
  3. K logical GPUs on one card: `python -m worker --strategy mirrored --visible-gpus 0
     --logical-gpus K --gpu-memory-limit-mb N --steps 20` trains with num_replicas == K.
Prints one PASS/FAIL (or SKIP, when a measurement tool is missing) line per check and a summary;
exits 1 if any check failed. Without a GPU it prints "no GPU: nothing to check" and exits 0.
Each check is bounded by CHECK_TIMEOUT_S, so the whole script stays under 3 minutes.

Memory use is measured with nvidia-smi (TensorFlow's get_memory_info only counts live tensors,
not what the allocator reserved). nvidia-smi numbers GPUs in PCI order and CUDA, by default,
fastest first: on a machine with mixed GPU models, index 0 may not be the same card.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK_TIMEOUT_S = 55
RESULT_PREFIX = "RESULT "
MIB = 1024 * 1024
SMALL_TENSOR_MIB = 4
WORKER_STEPS = 20


@dataclass
class Outcome:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str


# --- measurements, usable in any process ---------------------------------------------------------


def nvidia_smi_mib(field: str, gpu: int = 0) -> int | None:
    """memory.used or memory.total of one GPU in MiB; None without a working nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    command = [
        "nvidia-smi",
        f"--query-gpu={field}",
        "--format=csv,noheader,nounits",
        "-i",
        str(gpu),
    ]
    try:
        text = subprocess.run(
            command, capture_output=True, text=True, timeout=20, check=False
        ).stdout
        return int(text.strip().splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def allocate_mib(tf, mib: int) -> None:
    """A float32 tensor of mib MiB on GPU:0; reading the sum forces the allocation now."""
    with tf.device("/GPU:0"):
        tensor = tf.zeros([mib * MIB // 4], dtype=tf.float32)
        float(tf.reduce_sum(tensor))


# --- the checks' subprocesses --------------------------------------------------------------------


def child_memory_growth() -> dict:
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    allocate_mib(tf, SMALL_TENSOR_MIB)
    info = tf.config.experimental.get_memory_info("GPU:0")
    used, total = nvidia_smi_mib("memory.used"), nvidia_smi_mib("memory.total")
    result = {"tf_current_mib": info["current"] / MIB, "tf_peak_mib": info["peak"] / MIB}
    result.update(gpu_used_mib=used, gpu_total_mib=total)
    if used is None or total is None:
        result["status"] = "SKIP"
    else:
        # Without growth TensorFlow reserves nearly all of the card at start.
        result["status"] = "PASS" if used < total / 2 else "FAIL"
    return result


def child_memory_limit(limit_mib: int) -> dict:
    import tensorflow as tf

    gpu = tf.config.list_physical_devices("GPU")[0]
    tf.config.set_visible_devices([gpu], "GPU")
    tf.config.set_logical_device_configuration(
        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)]
    )
    result: dict[str, object] = {"logical_gpus": len(tf.config.list_logical_devices("GPU"))}
    allocate_mib(tf, max(1, limit_mib // 4))
    result["small_fits"] = True
    try:
        allocate_mib(tf, 2 * limit_mib)
        result["large_failed"] = False
    except tf.errors.ResourceExhaustedError:
        result["large_failed"] = True
    result["gpu_used_mib"] = nvidia_smi_mib("memory.used")
    ok = result["logical_gpus"] == 1 and result["large_failed"]
    result["status"] = "PASS" if ok else "FAIL"
    return result


def run_child(args: argparse.Namespace) -> int:
    if args.child == "growth":
        result = child_memory_growth()
    else:
        result = child_memory_limit(args.memory_limit_mb)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


# --- the parent ----------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    # TF_CONFIG would make the worker of check 3 wait for a cluster; proxies break gRPC.
    dropped = {"tf_config", "http_proxy", "https_proxy", "grpc_proxy", "all_proxy"}
    env = {key: value for key, value in os.environ.items() if key.lower() not in dropped}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_subprocess(command: list[str], env: dict[str, str]) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, stderr), never raising for the child's failure."""
    try:
        done = subprocess.run(
            command,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return None, _text(exc.stdout), _text(exc.stderr)
    return done.returncode, done.stdout, done.stderr


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def check_in_child(name: str, *flags: str) -> Outcome:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", *flags]
    code, out, err = run_subprocess(command, child_env())
    lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    if code != 0 or not lines:
        why = "timed out" if code is None else f"exit {code}"
        return Outcome(name, "FAIL", f"{why}: {_last_lines(err)}")
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    status = result.pop("status")
    return Outcome(name, status, json.dumps(result))


def check_logical_gpus(count: int, limit_mib: int) -> Outcome:
    name = f"{count} logical GPUs on GPU:0 with MirroredStrategy"
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as run_dir:
        env = child_env()
        env.update(ORCHESTRATE_RUN_DIR=run_dir)
        env["ORCHESTRATE_PROGRESS_FILE"] = os.path.join(run_dir, "progress.json")
        command = [
            sys.executable, "-m", "worker", "--task", "worker.examples.shapes:task",
            "--strategy", "mirrored", "--visible-gpus", "0", "--logical-gpus", str(count),
            "--gpu-memory-limit-mb", str(limit_mib), "--steps", str(WORKER_STEPS),
            "--log-every", "10", "--batch-size", str(16 * count),
        ]  # fmt: skip
        code, _, err = run_subprocess(command, env)
        if code != 0:
            why = "timed out" if code is None else f"exit {code}"
            return Outcome(name, "FAIL", f"worker {why}: {_last_lines(err)}")
        progress = json.loads(Path(env["ORCHESTRATE_PROGRESS_FILE"]).read_text())
    gpus = [device for device in progress["devices"] if "GPU" in device]
    ok = progress["num_replicas"] == count and len(gpus) == count
    ok = ok and progress["step"] == WORKER_STEPS
    detail = (
        f"num_replicas {progress['num_replicas']}, GPU devices {gpus}, step {progress['step']}, "
        f"loss {progress['loss']}"
    )
    return Outcome(name, "PASS" if ok else "FAIL", detail)


def _last_lines(text: str, count: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-count:])


def physical_gpus() -> list[str]:
    """Listing physical devices does not start the runtime; the children are separate anyway."""
    import tensorflow as tf

    names = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        names.append(f"{gpu.name} {details.get('device_name', '?')}")
    return names


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit-mb", type=int, default=1024, metavar="N")
    parser.add_argument("--logical-gpus", type=int, default=2, metavar="K")
    parser.add_argument("--child", choices=("growth", "limit"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_limit_mb < 1 or args.logical_gpus < 1:
        parser.error("--memory-limit-mb and --logical-gpus must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    gpus = physical_gpus()
    print(f"physical GPUs: {gpus or 'none'}", flush=True)
    if not gpus:
        print("no GPU: nothing to check")
        return 0
    limit = args.memory_limit_mb
    outcomes = []
    for check in (
        lambda: check_in_child("memory growth", "growth"),
        lambda: check_in_child(
            f"memory limit {limit} MiB", "limit", "--memory-limit-mb", str(limit)
        ),
        lambda: check_logical_gpus(args.logical_gpus, limit),
    ):
        outcome = check()
        print(f"{outcome.status} {outcome.name}: {outcome.detail}", flush=True)
        outcomes.append(outcome)
    counts = {
        status: sum(o.status == status for o in outcomes) for status in ("PASS", "FAIL", "SKIP")
    }
    print(f"summary: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
