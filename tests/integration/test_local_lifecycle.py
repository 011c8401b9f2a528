"""up / status / tail / down on local worker processes, with a plain script job (no TensorFlow):
the controller's own behaviour, fast. Real processes, real signals, the real CLI."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import psutil

from tests.conftest import Cli, detached_supervisors, free_ports, run_processes, wait_for

SCRIPT = """\
import json, os, sys, time
steps = int(os.environ.get("STEPS", "5"))
print("tf_config", os.environ["TF_CONFIG"], flush=True)
print("args", json.dumps(sys.argv[1:]), flush=True)
print("target", os.environ.get("ORCHESTRATE_TARGET_STEPS"), flush=True)
progress = os.environ["ORCHESTRATE_PROGRESS_FILE"]
for step in range(1, steps + 1):
    with open(progress + ".tmp", "w") as f:
        json.dump({"step": step, "target_steps": steps, "loss": 1.0 / step}, f)
    os.replace(progress + ".tmp", progress)
    print("step", step, flush=True)
    time.sleep(float(os.environ.get("DELAY", "0.05")))
    while step == steps // 2 and os.environ.get("HOLD") and not os.path.exists(os.environ["HOLD"]):
        time.sleep(0.05)  # held mid-run until the test lets go: running for as long as it needs
if os.environ["ORCHESTRATE_WORKER"] == os.environ.get("FAIL_WORKER"):
    time.sleep(1)  # after its peers' exit 0: else the supervisor stops them, which is no success
    raise SystemExit("boom: " + os.environ["ORCHESTRATE_WORKER"])
"""


def make_job(
    cwd: Path,
    *,
    steps: int = 5,
    delay: float = 0.05,
    fail: str = "",
    args: str = "[]",
    workdir: str = "./work",
    hold: str = "",
) -> Path:
    (cwd / "train.py").write_text(SCRIPT)
    port_a, port_b = free_ports(2)
    inventory = cwd / "inv.yaml"
    inventory.write_text(
        textwrap.dedent(f"""\
        defaults: {{connection: local, workdir: '{workdir}'}}
        hosts:
          - {{name: alpha, address: localhost, port: {port_a}}}
          - {{name: beta, address: 127.0.0.1, port: {port_b}}}
        job:
          name: demo
          script: train.py
          args: {args}
          env: {{STEPS: {steps}, DELAY: {delay}, FAIL_WORKER: '{fail}', HOLD: '{hold}'}}
          restart_backoff: 0
        """)
    )
    return inventory


def test_up_runs_both_workers_to_success(cli: Cli, reaper: list[str]) -> None:
    make_job(cli.cwd)
    result = cli("up", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    assert "job demo succeeded" in result.stderr
    status = cli.status()
    assert status["state"] == "succeeded"
    assert [(w["name"], w["index"], w["state"], w["step"]) for w in status["workers"]] == [
        ("alpha", 0, "succeeded", 5),
        ("beta", 1, "succeeded", 5),
    ]
    configs = {}
    for line in cli("tail", "-n", "100", check=True).stdout.splitlines():
        name, _, text = line.partition("|")
        if text.strip().startswith("tf_config"):
            configs[name.strip()] = json.loads(text.strip().removeprefix("tf_config "))
    # Each worker got the same cluster and its own index, through the environment.
    assert configs["alpha"]["cluster"] == configs["beta"]["cluster"]
    assert [configs[n]["task"]["index"] for n in ("alpha", "beta")] == [0, 1]


def test_failed_worker_fails_the_job_with_a_report(cli: Cli, reaper: list[str]) -> None:
    make_job(cli.cwd, fail="beta")
    result = cli("up", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1
    # Restarted once; the same failure at the same step again ends the run.
    assert "failed the same way at the same step twice in a row" in result.stderr
    assert "the worker that failed first: beta at step 5: exit 1: boom: beta" in result.stderr
    assert "Traceback" not in result.stderr
    status = cli.status()
    assert {w["name"]: w["state"] for w in status["workers"]} == {
        "alpha": "succeeded",
        "beta": "failed",
    }
    assert status["restarts"] == 1 and status["attempt"] == 1


def test_the_same_error_on_another_worker_ends_the_run_after_one_restart(
    cli: Cli, reaper: list[str]
) -> None:
    """Issue 56: a deterministic error fails whichever worker reaches its step first; alike in
    two attempts in a row it ends the run (it was retried until max_restarts)."""
    make_job(cli.cwd, steps=5)
    marker = cli.cwd / "failed-once"
    # Attempt 0: alpha raises after step 5; from then on beta does, at the same step.
    (cli.cwd / "train.py").write_text(SCRIPT.replace(
        'os.environ.get("FAIL_WORKER")',
        f'("beta" if os.path.exists({str(marker)!r}) else "alpha")'
    ).replace(
        '    raise SystemExit("boom: "',
        f'    open({str(marker)!r}, "w").close()\n    raise SystemExit("boom: "',
    ))  # fmt: skip
    result = cli("up", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1, result.stderr
    assert "failed the same way at the same step twice in a row" in result.stderr
    status = cli.status()
    assert status["restarts"] == 1 and status["attempt"] == 1, status
    assert status["outcome"].startswith("gave up: beta at step 5: exit 1: boom: beta")


def test_a_script_that_exits_0_below_its_steps_fails_as_stopped_short(
    cli: Cli, reaper: list[str]
) -> None:
    # The false success of issue 28: steps: 300, the script reports step 5 and exits 0.
    inventory = make_job(cli.cwd, steps=5)
    inventory.write_text(inventory.read_text() + "  steps: 300\n")
    result = cli("up", "inv.yaml")
    reaper.append(cli.record()["run_id"])
    assert result.returncode == 1, result.stderr
    assert "stopped at step 5 of 300" in result.stderr
    assert "after 0 restart(s)" in result.stderr  # not retried: it would stop there again
    status = cli.status()
    # The first to exit stopped short; its peer either did too or, still finishing under load,
    # was stopped by the supervisor after it (and says so).
    verdicts = {w["name"]: (w["state"], w["failure_kind"], w["target_steps"], w["reason"])
                for w in status["workers"]}  # fmt: skip
    short = ("failed", "stopped short", 300, "stopped at step 5 of 300")
    first = next(name for name, verdict in verdicts.items() if verdict == short)
    peer = {"alpha": "beta", "beta": "alpha"}[first]
    assert verdicts[peer] in (
        short,
        ("stopped", None, 300, f"stopped after {first} ended the attempt"),
    )
    assert "target 300" in cli("tail", "-n", "50", check=True).stdout  # the script was told


def test_inventory_values_reach_the_worker_verbatim(cli: Cli, reaper: list[str]) -> None:
    marker = cli.cwd / "pwned"
    hostile = ["$(touch pwned)", "a; touch pwned", "`touch pwned`", 'it\'s "quoted"', "two  spaces"]
    make_job(cli.cwd, args=json.dumps(hostile), workdir="./work dir $(touch pwned)")
    cli("up", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    logs = cli("tail", "alpha", "-n", "100", check=True).stdout
    assert '"$(touch pwned)", "a; touch pwned", "`touch pwned`"' in logs
    assert "two  spaces" in logs and "it's" in logs
    assert not marker.exists()
    assert (cli.cwd / "work dir $(touch pwned)" / "demo" / "runs").is_dir()


def test_detached_run_status_tail_and_down_leave_no_process(cli: Cli, reaper: list[str]) -> None:
    make_job(cli.cwd, steps=10_000, delay=0.02)
    cli("up", "--detach", "inv.yaml", check=True)
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    # The controller has exited; the workers run on in their own sessions.
    running = wait_for(lambda: (s := cli.status())["state"] == "running" and s, timeout=20)
    for worker in running["workers"]:
        assert worker["step"] >= 1 and psutil.pid_exists(worker["pid"])
        assert os.getsid(worker["pid"]) != os.getsid(0)
    tail = cli("tail", "-n", "2", check=True).stdout.splitlines()
    assert {line.split("|")[0].strip() for line in tail} == {"alpha", "beta"}
    assert len(run_processes(run_id)) == 4  # two supervisors, two workers
    again = cli("up", "inv.yaml")
    assert again.returncode == 4 and "is still running" in again.stderr
    # Issue 56: the live run holds its fixed ports without a lease: `jobs` names it.
    jobs = cli("jobs", "inv.yaml", check=True)
    assert f"run {run_id} of job demo (this directory) holds fixed ports" in jobs.stderr
    assert "no job holds a lease" not in jobs.stderr
    listed = json.loads(cli("jobs", "--json", "inv.yaml", check=True).stdout)["runs_here"]
    assert [w["worker"] for w in listed[0]["workers"]] == ["alpha", "beta"]
    down = cli("down", check=True)
    assert "alpha: stopped" in down.stdout and "beta: stopped" in down.stdout
    assert run_processes(run_id) == []
    assert {w["state"] for w in cli.status()["workers"]} == {"stopped"}
    # The live supervisor stopped the workers over its own sessions and answered down.
    runs = cli.cwd / ".orchestrate" / "runs"
    answer = json.loads((runs / f"{run_id}.stopped").read_text())
    assert answer["outcome"] == {"alpha": "stopped", "beta": "stopped"}
    assert "stopping the workers for 'orchestrate down'" in (runs / f"{run_id}.log").read_text()


def test_down_stops_the_workers_itself_when_the_supervisor_does_not_answer(
    cli: Cli, reaper: list[str]
) -> None:
    make_job(cli.cwd, steps=10_000, delay=0.02)
    cli("up", "--detach", "inv.yaml", check=True)
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    running = wait_for(lambda: (s := cli.status())["state"] == "running" and s, timeout=20)
    workers = [w["pid"] for w in running["workers"]]
    (supervisor,) = detached_supervisors(run_id)
    supervisor.suspend()  # holds its lock, answers nothing: as if busy in a long backoff
    try:
        down = cli.popen("down")
        # After the pickup timeout down stops the workers from here.
        wait_for(lambda: not any(psutil.pid_exists(pid) for pid in workers), timeout=30)
    finally:
        supervisor.resume()
    out, err = down.communicate(timeout=60)
    assert down.returncode == 0, err
    assert "alpha: stopped" in out and "beta: stopped" in out
    assert not (cli.cwd / ".orchestrate" / "runs" / f"{run_id}.stopped").exists()
    wait_for(lambda: run_processes(run_id) == [], timeout=20)
    assert {w["state"] for w in cli.status()["workers"]} == {"stopped"}


def test_tail_follow_streams_new_lines_from_both(cli: Cli, reaper: list[str]) -> None:
    make_job(cli.cwd, steps=10_000, delay=0.05)
    cli("up", "--detach", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    follower = cli.popen("tail", "-f", "-n", "0")
    try:
        seen: set[str] = set()
        assert follower.stdout is not None
        for _ in range(40):
            seen.add(follower.stdout.readline().split("|")[0].strip())
            if {"alpha", "beta"} <= seen:
                break
        assert {"alpha", "beta"} <= seen
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=10) == 0
    cli("down", check=True)
    assert not any("tail" in p.name() for p in psutil.Process().children(recursive=True))


def test_killing_the_foreground_controller_leaves_workers_running(
    cli: Cli, reaper: list[str]
) -> None:
    # Held at step 30 until the controller is gone: a run of 3 s could end before a loaded
    # machine's `status` saw it running (seen in CI).
    hold = cli.cwd / "let-go"
    make_job(cli.cwd, steps=60, delay=0.05, hold=str(hold))
    controller = cli.popen("up", "inv.yaml")
    wait_for((cli.cwd / ".orchestrate" / "current").exists, timeout=60)
    run_id = cli.record()["run_id"]
    reaper.append(run_id)
    wait_for(lambda: cli.status()["state"] == "running", timeout=60)
    controller.kill()
    controller.wait()
    hold.touch()
    final = wait_for(lambda: (s := cli.status())["state"] == "succeeded" and s, timeout=30)
    assert [w["step"] for w in final["workers"]] == [60, 60]


def test_bad_inventory_exits_2_naming_the_key(cli: Cli) -> None:
    (cli.cwd / "bad.yaml").write_text(
        "hosts:\n  - {name: a, address: localhost, prot: 1}\njob: {}\n"
    )
    result = cli("up", "bad.yaml")
    assert result.returncode == 2
    assert "bad.yaml:2: hosts[0].prot: unknown key; did you mean 'port'?" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_commands_without_a_run_say_how_to_start_one(cli: Cli) -> None:
    for command in (["status"], ["tail"], ["down"]):
        result = cli(*command)
        assert result.returncode == 4
        assert "no run found" in result.stderr and "orchestrate up" in result.stderr


def test_unknown_worker_name(cli: Cli, reaper: list[str]) -> None:
    make_job(cli.cwd)
    cli("up", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    result = cli("tail", "gamma")
    assert result.returncode == 4 and "the workers are: alpha, beta" in result.stderr


CHORUS = """\
import json, os, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print("ready", index, flush=True)
go = os.environ["GO"]
while not os.path.exists(go):
    time.sleep(0.05)
start = float(open(go).read())
for epoch in range(1, 4):
    time.sleep(max(0.0, start + 0.4 * epoch - time.time()))
    print(f"Epoch {epoch}/3", flush=True)
    print("loss", 0.7 if index == 1 else 0.5, flush=True)
print("done", index, flush=True)
"""


def test_tail_groups_what_three_workers_print_alike(cli: Cli, reaper: list[str]) -> None:
    (cli.cwd / "train.py").write_text(CHORUS)
    hosts = "\n".join(f"  - {{name: worker-{i}, address: localhost, port: {port}}}"
                      for i, port in enumerate(free_ports(3)))  # fmt: skip
    go = cli.cwd / "go"
    (cli.cwd / "inv.yaml").write_text(
        f"defaults: {{connection: local, workdir: ./work}}\nhosts:\n{hosts}\n"
        f"job: {{name: chorus, script: train.py, env: {{GO: '{go}'}}}}\n"
    )
    cli("up", "--detach", "--skip-checks", "inv.yaml", check=True)
    reaper.append(cli.record()["run_id"])
    follower = cli.popen("tail", "-f", "-n", "5", "--group")
    assert follower.stdout is not None
    followed: list[str] = []
    try:
        while sum(line.split("|")[-1].strip().startswith("ready") for line in followed) < 3:
            followed.append(follower.stdout.readline().rstrip("\n"))
        (cli.cwd / "go.tmp").write_text(str(time.time() + 1.0))
        (cli.cwd / "go.tmp").rename(go)
        while sum(line.split("|")[-1].strip().startswith("done") for line in followed) < 3:
            followed.append(follower.stdout.readline().rstrip("\n"))
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=10)
    cli.status_when(lambda s: s["state"] == "succeeded", timeout=60)
    printed = cli("tail", "-n", "50", "--group", check=True).stdout.splitlines()
    ungrouped = cli("tail", "-n", "50", "--no-group", check=True).stdout.splitlines()
    for lines in (followed, printed):
        epochs = [line for line in lines if "Epoch" in line]
        assert epochs == [f"[worker-0,1,2] Epoch {e}/3" for e in (1, 2, 3)], lines
        assert lines.count("[worker-0,2] loss 0.5") == 3, lines
        assert sum(line.endswith("| loss 0.7") for line in lines) == 3, lines
        for index in range(3):  # every worker's own lines, in its order
            name = f"worker-{index}"
            own = [
                line.split("] ", 1)[1] if line.startswith("[") else line.split("| ", 1)[1]
                for line in lines
                if _printed_by(line, name, index) and "ready" not in line
            ]
            loss = "loss 0.7" if index == 1 else "loss 0.5"
            assert own == [f"Epoch {e}/3" if k == 0 else loss for e in (1, 2, 3)
                           for k in (0, 1)] + [f"done {index}"], (name, lines)  # fmt: skip
    assert sum("Epoch 1/3" in line for line in ungrouped) == 3  # --no-group: every copy


def _printed_by(line: str, name: str, index: int) -> bool:
    if line.startswith("["):
        label = line[1 : line.index("]")]
        return str(index) in label.removeprefix("worker-").split(",")
    return line.split("|", maxsplit=1)[0].strip() == name
