"""A stand-in for a training script, for supervision and fault tests: one "step" per DELAY
seconds with a progress file, and a per-worker "checkpoint" file that survives restarts (a restart
resumes after the last step written). Behaviour chosen through the environment:

  STEPS          the target step (reported as target_steps)
  DELAY          seconds per step (default 0.02)
  FAIL_WORKER    the worker that fails at step 5: FAIL_HOW=vary (exit 1, a message that differs
                 every time) or permanent (exit 3)
  EXIT_0_AT      exit 0 this many steps after where the attempt resumed (a false success)
  NOISE, NOISE_REPEAT   text written to stdout NOISE_REPEAT times per step (log size)
  LINGER         seconds to stay after the final step (a slow teardown)
  REPORT_RATE    also report steps_per_sec (1 / DELAY), so that status has an ETA
  START_DELAY    seconds to wait before anything else (a slow import), on SLOW_WORKER only if
                 that is set

It prints how many workers its TF_CONFIG lists, so tests see the cluster it was started in.
"""

import json
import os
import sys
import time

progress = os.environ["ORCHESTRATE_PROGRESS_FILE"]
worker = os.environ["ORCHESTRATE_WORKER"]
if os.environ.get("SLOW_WORKER", worker) == worker:
    time.sleep(float(os.environ.get("START_DELAY", "0")))
ckpt = os.path.join(os.environ["ORCHESTRATE_CHECKPOINT_DIR"], worker)
os.makedirs(os.path.dirname(ckpt), exist_ok=True)
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0  # noqa: SIM115
steps = int(os.environ["STEPS"])
stop_at = int(os.environ.get("EXIT_0_AT", "0"))
workers = len(
    json.loads(os.environ.get("TF_CONFIG", '{"cluster": {"worker": []}}'))["cluster"]["worker"]
)
print(f"start {start} of a {workers}-worker cluster", flush=True)
for step in range(start + 1, steps + 1):
    time.sleep(float(os.environ.get("DELAY", "0.02")))
    if worker == os.environ.get("FAIL_WORKER") and step == 5:
        if os.environ.get("FAIL_HOW") == "vary":
            raise SystemExit(f"boom at {time.time()}")
        if os.environ.get("FAIL_HOW") == "permanent":
            raise SystemExit(3)
    sys.stdout.write(os.environ.get("NOISE", "") * int(os.environ.get("NOISE_REPEAT", "0")))
    with open(ckpt + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(ckpt + ".tmp", ckpt)
    with open(progress + ".tmp", "w") as f:
        progress_fields: dict[str, float] = {
            "step": step,
            "target_steps": steps,
            "checkpoint_step": step,
        }
        if os.environ.get("REPORT_RATE"):
            progress_fields["steps_per_sec"] = 1 / float(os.environ.get("DELAY", "0.02"))
        json.dump(progress_fields, f)
    os.replace(progress + ".tmp", progress)
    if stop_at and step == start + stop_at:
        print("leaving early, exit 0", flush=True)
        sys.exit(0)
print("final step reported", flush=True)
time.sleep(float(os.environ.get("LINGER", "0")))
print("done", flush=True)
