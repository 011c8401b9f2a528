"""Leases (issue 29): the pure decisions (which port and GPUs, record validation, the clash
message), the host's lease program on a real lease directory (real flocks, a real keeper), the
inventory keys, the plan, and the engine's use of them over the fake backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.registry import load_inventory
from orchestrator.engine.store.runstore import RunStore
from orchestrator.engine.supervision.supervise import Supervisor
from orchestrator.engine.workers.lifecycle import start_run, stop_run
from orchestrator.engine.workers.plan import plan_workers
from orchestrator.errors import InventoryError, JobFailed, LeaseClash
from orchestrator.hostside import leasepolicy as policy
from orchestrator.machines.hostclient import host_program
from orchestrator.model.inventory import Inventory, Job, WorkerSlot
from orchestrator.model.leases import Clash, Holder, clash_message, clock, parse_clashes
from orchestrator.model.vocabulary import WorkerState
from tests.fakes.backend import FakeBackend, exited, running

RUN = "20261201-104200-ab12"


def good_record(**changes: Any) -> dict[str, Any]:
    record = {"user": "bob", "uid": 1001, "job": "bert", "run_id": RUN, "controller": "laptop",
              "since": 1.0e9, "pid": 4242, "ports": [23456], "gpus": [0, 1]}  # fmt: skip
    record.update(changes)
    return record


NAME = f"lease-1001-{RUN}-0123456789ab.json"


# --- pure decisions ------------------------------------------------------------------------------


def test_the_runs_own_port_and_gpus_come_first() -> None:
    assert policy.port_candidates(None, 20000, 20003) == [20000, 20001, 20002, 20003]
    assert policy.port_candidates(20002, 20000, 20003) == [20002, 20000, 20001, 20003]
    assert policy.port_candidates(30000, 20000, 20001) == [20000, 20001]  # out of range
    assert policy.gpu_candidates([0, 1, 2, 3], [2, 3]) == [2, 3, 0, 1]
    assert policy.gpu_candidates([0, 1], [5]) == [0, 1]


def test_a_valid_record_is_read_and_every_malformed_one_is_refused_with_why() -> None:
    record, why = policy.validate_record(good_record(), 1001, NAME)
    assert why is None and record["user"] == "bob" and record["gpus"] == [0, 1]
    cases = {
        "belongs to uid": (good_record(), 1002, NAME),  # another account wrote bob's record
        "claims uid": (good_record(uid=0), 1001, NAME),
        "not a lease record's name": (good_record(), 1001, "lease-x.json"),
        "not a JSON object": ([1, 2], 1001, NAME),
        "user is missing": (good_record(user="bob; rm -rf /"), 1001, NAME),
        "job is missing": (good_record(job="[red]x[/]"), 1001, NAME),
        "run id differs": (good_record(run_id="20990101-000000-ffff"), 1001, NAME),
        "since is missing": (good_record(since=float("nan")), 1001, NAME),
        "ports holds": (good_record(ports=[70000]), 1001, NAME),
        "gpus holds": (good_record(gpus=[True]), 1001, NAME),
        "pid is missing": (good_record(pid="4242"), 1001, NAME),
        "ports is not a list": (good_record(ports=list(range(2000))), 1001, NAME),
    }
    for expected, (data, owner, name) in cases.items():
        record, why = policy.validate_record(data, owner, name)
        assert record is None and expected in why, (expected, why)


def test_the_clash_message_names_the_holder_of_the_port_and_gpus() -> None:
    since = time.mktime((2026, 12, 1, 10, 42, 0, 0, 0, -1))
    bob = Holder("bob", "bert", RUN, "laptop", since, 1001)
    message = clash_message([Clash("gpu-b", bob, (23456,), (0, 1))], now=since + 60)
    assert (
        message
        == f"gpu-b: port 23456 and GPUs 0,1 are held by bob's job bert (run {RUN}) since 10:42"
    )
    assert clock(since, now=since + 3 * 86400) == "2026-12-01 10:42"
    unknown = Clash("gpu-a", None, (20000,))
    assert "port 20000 is held by a process without a valid lease record" in unknown.describe()


def test_the_lease_programs_clashes_merge_by_holder() -> None:
    bob = {"user": "bob", "uid": 1001, "job": "bert", "run_id": RUN, "since": 1.0}
    answer = [
        {"kind": "ports", "range": [20000, 20000], "holders": [{**bob, "ports": [20000]}]},
        {"kind": "gpus", "wanted_gpus": 2, "pool": [0, 1], "holders": [{**bob, "gpus": [0, 1]}],
         "unknown": {}},
    ]  # fmt: skip
    (clash,) = parse_clashes("h1", answer)
    assert clash.holder is not None
    assert (clash.ports, clash.gpus, clash.holder.user) == ((20000,), (0, 1), "bob")
    assert clash.wanted == "a port of 20000-20000; 2 GPU(s) of the pool 0,1"
    assert parse_clashes("h1", "garbage") == []


# --- the host program on a real lease directory ------------------------------------------------


def ask(*requests: dict[str, Any]) -> list[dict[str, Any]]:
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run([sys.executable, "-c", host_program("leases.py")], input=lines,
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines()]


def acquire(lease_dir: Path, run_id: str, *workers: dict[str, Any], **extra: Any) -> dict:
    request = {"verb": "acquire", "lease_dir": str(lease_dir), "run_id": run_id, "job": "j",
               "controller": "here", "idle": 30, "workers": list(workers), **extra}  # fmt: skip
    return ask(request)[0]


def release(lease_dir: Path, run_id: str) -> None:
    ask({"verb": "release", "lease_dir": str(lease_dir), "run_id": run_id})


def listing(lease_dir: Path) -> dict[str, Any]:
    return ask({"verb": "list", "lease_dir": str(lease_dir)})[0]


AUTO = {"name": "w", "port": None, "range": [41000, 41003], "gpus": 2, "pool": [0, 1, 2, 3]}


def test_two_runs_get_apart_a_third_clashes_and_a_released_run_frees_them(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    try:
        first = acquire(leases, "run-1", AUTO)
        assert oct(leases.stat().st_mode & 0o7777) == "0o1777"
        second = acquire(leases, "run-2", AUTO)
        got = [a["assigned"]["w"] for a in (first, second)]
        assert got[0]["port"] != got[1]["port"] and set(got[0]["gpus"]).isdisjoint(got[1]["gpus"])
        # The run's own keeper holds them: asked again (a restart), it keeps the same.
        again = acquire(leases, "run-1", dict(AUTO, keep_port=got[0]["port"]))
        assert again["assigned"]["w"] == got[0] and again["kept"] and again["keeper"] is None
        third = acquire(leases, "run-3", AUTO)
        assert "assigned" not in third
        clashes = parse_clashes("h", third["clashes"])
        assert {c.holder.run_id for c in clashes if c.holder} == {"run-1", "run-2"}
        dry = acquire(leases, "check", dict(AUTO, gpus=None), dry_run=True)
        assert dry["assigned"]["w"]["port"] == 41002 and dry["keeper"] is None
        assert {h["run_id"] for h in listing(leases)["holders"]} == {"run-1", "run-2"}
        release(leases, "run-1")
        assert [h["run_id"] for h in listing(leases)["holders"]] == ["run-2"]
        assert acquire(leases, "run-3", AUTO)["assigned"]["w"] == got[0]
    finally:
        for run in ("run-1", "run-2", "run-3"):
            release(leases, run)


def test_shared_gpus_only_between_jobs_that_both_say_so(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    one = {"name": "w", "port": None, "range": [41010, 41019], "gpus": 1, "pool": [0]}
    try:
        assert acquire(leases, "run-a", dict(one, share=True))["assigned"]["w"]["gpus"] == [0]
        assert acquire(leases, "run-b", dict(one, share=True))["assigned"]["w"]["gpus"] == [0]
        assert "clashes" in acquire(leases, "run-c", one)  # an exclusive one waits for both
    finally:
        for run in ("run-a", "run-b", "run-c"):
            release(leases, run)


def test_a_keeper_leaves_when_no_process_of_its_run_lived_for_its_idle_time(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    answer = acquire(leases, "run-idle", AUTO, idle=0.3)
    keeper = answer["keeper"]
    assert Path(f"/proc/{keeper}").exists()
    deadline = time.monotonic() + 10
    while listing(leases)["holders"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert listing(leases)["holders"] == []
    assert acquire(leases, "run-next", AUTO, dry_run=True)["assigned"]["w"]["port"] == 41000


@pytest.mark.root  # chowns files to another account, as another user would have made them
def test_hostile_files_are_ignored_and_named_never_followed(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    leases.mkdir(mode=0o1777)
    leases.chmod(0o1777)
    secret = tmp_path / "secret"
    secret.write_text("top secret")
    (leases / f"lease-0-{RUN}-0123456789ab.json").symlink_to(secret)
    (leases / f"lease-0-{RUN}-abcdefabcdef.json").write_text("{not json")
    forged = leases / f"lease-1001-{RUN}-aaaaaaaaaaaa.json"
    forged.write_text(json.dumps(good_record()))  # says uid 1001, belongs to this account
    os.mkfifo(leases / "port-41000.lock")  # opening it for reading would block forever
    (leases / "port-41001.lock").symlink_to(secret)
    answer = acquire(leases, "run-h", dict(AUTO, gpus=None), dry_run=True)
    assert answer["assigned"]["w"]["port"] == 41000  # no file holds a port: they block nothing
    reasons = {Path(i["file"]).name: i["reason"] for i in answer["ignored"]}
    assert reasons == {
        f"lease-0-{RUN}-0123456789ab.json": "not a regular file (a link, a fifo?)",
        f"lease-0-{RUN}-abcdefabcdef.json": "not JSON",
        forged.name: f"claims uid 1001 but belongs to uid {os.getuid()}",
        "port-41000.lock": "not a regular file",
        "port-41001.lock": "a symlink",
    }
    assert secret.read_text() == "top secret"


@pytest.mark.root  # chowns files to another account, as another user would have made them
def test_a_lease_dir_made_unsafe_by_another_account_is_refused(tmp_path: Path) -> None:
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir(mode=0o777)
    unsafe.chmod(0o777)
    os.chown(unsafe, 12345, 12345)
    answer = acquire(unsafe, "run-u", AUTO)
    said = answer["error"]
    assert said.startswith("lease_dir ") and "belongs to uid 12345, not to you or to root" in said
    unsafe.chmod(0o1777)  # sticky, yet its owner may remove anyone's files in it
    assert "belongs to uid 12345" in acquire(unsafe, "run-u", AUTO)["error"]
    os.chown(unsafe, 0, 0)  # how an admin shares one: root's, sticky
    assert acquire(unsafe, "run-u", AUTO, dry_run=True)["assigned"]["w"]["port"] == 41000


# --- the inventory and the plan --------------------------------------------------------------


def write(tmp_path: Path, defaults: str, hosts: int = 2) -> Path:
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "inv.yaml"
    entries = "".join(f"  - {{name: {n}, address: 127.0.0.1}}\n" for n in "ab"[:hosts])
    path.write_text(f"defaults: {{connection: local, {defaults}}}\nhosts:\n{entries}"
                    "job: {name: demo, script: train.py}\n")  # fmt: skip
    return path


def test_port_auto_gpus_and_lease_dir_in_the_inventory(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, "port: auto, gpus: 2, visible_gpus: [0, 1, 2, 3]"))
    a, _ = inventory.hosts
    assert (a.port, a.port_range, a.gpus, a.lease_dir) == (
        0,
        (20000, 20099),
        2,
        "/var/tmp/orchestrate-leases",
    )  # two auto ports on one address are no clash: the lease gives each its own
    assert a.leases and not a.share_gpus
    fixed = load_inventory(write(tmp_path, "port: 21000, port_range: 30000-30009", hosts=1))
    assert fixed.hosts[0].port_range is None and not fixed.hosts[0].leases
    with pytest.raises(InventoryError) as error:
        load_inventory(write(tmp_path, "port: autox, port_range: 30009-30000, lease_dir: rel, "
                                       "gpus: 0"))  # fmt: skip
    text = str(error.value)
    for expected in (
        "defaults.port: expected an integer from 1 to 65535, got 'autox', or auto",
        "defaults.port_range: expected LOW-HIGH",
        "defaults.lease_dir: expected an absolute path",
        "defaults.gpus: expected an integer of at least 1",
    ):
        assert expected in text


def test_leased_gpus_are_exactly_the_workers_cuda_visible_devices(tmp_path: Path) -> None:
    host = WorkerSlot("a", "10.0.0.1", 20001, visible_gpus=(0, 1, 2, 3), gpus=2, leased_gpus=(2, 3))
    task = Job("demo", task="m:f", steps=10)
    inventory = Inventory("inv.yaml", str(tmp_path), (host,), task)
    (spec,) = plan_workers(inventory, RUN, {"a": "/w"}, reads_in_place=lambda h: False)
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "--visible-gpus" not in spec.argv  # TensorFlow sees only the leased ones
    plain = Inventory(
        "inv.yaml", str(tmp_path), (WorkerSlot("a", "10.0.0.1", 1, visible_gpus=(1,)),), task
    )
    (spec,) = plan_workers(plain, RUN, {"a": "/w"}, reads_in_place=lambda h: False)
    assert "CUDA_VISIBLE_DEVICES" not in spec.env and "--visible-gpus" in spec.argv


# --- the engine over the fake backend ----------------------------------------------------------


def auto_inventory(tmp_path: Path, **job: Any) -> Inventory:
    hosts = tuple(WorkerSlot(n, f"10.0.0.{i}", 0, port_range=(20000, 20001), gpus=1,
                             visible_gpus=(0, 1)) for i, n in enumerate("ab"))  # fmt: skip
    options = {"script": "train.py", "restart_backoff": 0, "max_restarts": 2, **job}
    return Inventory(str(tmp_path / "inv.yaml"), str(tmp_path), hosts, Job("demo", **options))


def test_a_run_keeps_its_leases_across_a_restart_and_lets_go_at_its_end(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={
        "a": {0: [running(1), exited(1, 1)], 1: [running(2), exited(0, 3)]},
        "b": {0: [running(1), exited(-9, 1)], 1: [running(2), exited(0, 3)]},
    })  # fmt: skip
    store = RunStore(tmp_path / "state")
    record = start_run(auto_inventory(tmp_path), store, backend)
    assert [(h.port, h.leased_gpus) for h in record.inventory.hosts] == [(20000, (0,))] * 2
    final = Supervisor(store, backend, record, interval=0).run()
    assert final.state is WorkerState.SUCCEEDED
    saved = store.load()
    assert saved.attempt == 1 and [h.port for h in saved.inventory.hosts] == [20000, 20000]
    assert backend.lease_calls == [("take", record.run_id)] * 2 + [("release", record.run_id)]
    assert backend.held == {}


def test_a_lease_lost_to_another_job_fails_the_restart_naming_it(tmp_path: Path) -> None:
    backend = FakeBackend(scripts={"a": {0: [running(1), exited(1, 1)]},
                                   "b": {0: [running(1), exited(1, 1)]}})  # fmt: skip
    store = RunStore(tmp_path / "state")
    inventory = auto_inventory(tmp_path)
    record = start_run(inventory, store, backend)
    bob = Holder("bob", "bert", RUN, "laptop", time.time(), 1001)
    # Its keeper died meanwhile and bob took everything on host b.
    backend.held = {k: v for k, v in backend.held.items() if k[0] != "b"}
    backend.held.update({("b", "port", 20000): bob, ("b", "port", 20001): bob,
                         ("b", "gpu", 0): bob, ("b", "gpu", 1): bob})  # fmt: skip
    with pytest.raises(JobFailed) as failed:
        Supervisor(store, backend, record, interval=0).run()
    assert f"b: ports 20000,20001 and GPUs 0,1 are held by bob's job bert (run {RUN})" \
        in failed.value.message  # fmt: skip
    assert ("release", record.run_id) in backend.lease_calls
    with pytest.raises(LeaseClash) as clash:
        start_run(inventory, RunStore(tmp_path / "other"), backend)
    assert clash.value.exit_code == 4 and clash.value.clashes[0].holder == bob
    stop_run(record, backend)


def test_firewall_opens_the_whole_range_of_an_auto_port(tmp_path: Path) -> None:
    from orchestrator.backends.hosts.firewall import host_rules

    inventory = load_inventory(write(tmp_path, "port: auto, port_range: 23000-23009", hosts=1))
    expected = {
        "iptables": "iptables -I INPUT 1 -p tcp -s 127.0.0.1 --dport 23000:23009 -j ACCEPT",
        "ufw": "ufw deny proto tcp to any port 23000:23009",
        "nftables": "nft add rule inet filter input tcp dport 23000-23009 drop",
        "firewalld": 'port port="23000-23009" protocol="tcp" accept',
    }
    for fmt, line in expected.items():
        (rules,) = host_rules(inventory, fmt)
        assert any(line in command for command in rules.commands), (fmt, rules.commands)


def test_the_dashboard_lists_the_jobs_holding_leases_on_its_runs_hosts(tmp_path: Path) -> None:
    from orchestrator.dashboard.watch import RunWatch

    backend = FakeBackend()
    store = RunStore(tmp_path / "state")
    record = start_run(auto_inventory(tmp_path), store, backend)
    bob = Holder("bob", "<img src=x onerror=alert(1)>", RUN, "laptop", 5.0, 1001)
    backend.held[("a", "gpu", 1)] = bob
    watch = RunWatch.__new__(RunWatch)  # its document builder only, no polling thread
    watch._leases, watch._leases_at = None, 0.0
    listing = watch._lease_listing(record, backend)
    assert listing is not None
    jobs = {job["user"]: job for job in listing["jobs"]}
    assert jobs["bob"]["hosts"] == {"a": {"ports": [], "gpus": [1], "shared_gpus": False}}
    assert jobs["me"]["run_id"] == record.run_id
    plain = replace_hosts(record, port=20000)
    assert watch._lease_listing(plain, backend) is None  # a run without leases asks nothing
    js = (Path(__file__).parents[2] / "orchestrator/dashboard/static/app.js").read_text()
    section = js[js.index("function renderLeases") : js.index("function render(doc)")]
    assert "innerHTML" not in section  # other users' records reach the page as text only


def replace_hosts(record: Any, **changes: Any) -> Any:
    from dataclasses import replace

    hosts = tuple(replace(h, port_range=None, gpus=None, **changes) for h in record.inventory.hosts)
    return replace(record, inventory=replace(record.inventory, hosts=hosts))
