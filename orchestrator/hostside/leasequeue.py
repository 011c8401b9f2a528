"""The lease program's queue (`up --queue`): tickets written, refreshed and withdrawn, whose
turn it is, and which tickets this host could never serve. STANDARD LIBRARY ONLY; shipped
with the lease program (leases.py), whose docstring says how the queue works.
"""

import math
import os
import re
import subprocess
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator.hostside import leasedir, protocol, safefiles
    from orchestrator.hostside import leasepolicy as policy
else:  # shipped: hostside/bundle.py carries them in front of the lease program
    import leasedir  # type: ignore[no-redef]
    import leasepolicy as policy  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import safefiles  # type: ignore[no-redef]


def gpu_pool(worker):
    """The worker's pool: its `visible_gpus`, else the GPUs `nvidia-smi -L` lists."""
    if worker.get(policy.POOL_KEY) is not None:
        return list(worker[policy.POOL_KEY])
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise protocol.Refused(
            f"gpus: {worker[policy.GPUS_KEY]} needs a pool of GPUs: nvidia-smi -L failed ({exc}); "
            "set visible_gpus to the host's GPU ids"
        ) from None
    return [int(m.group(1)) for m in re.finditer(r"^GPU (\d+):", listing.stdout, re.M)]


def _write_ticket(request, needs, old):
    """Write (or refresh) the run's ticket: its arrival stays what it was first."""
    lease_dir, run_id, queue = (
        request[policy.LEASE_DIR_KEY],
        request[policy.RUN_ID_KEY],
        request[policy.TICKET_KEY],
    )
    ticket = {
        policy.USER_KEY: leasedir.account(os.getuid()),
        policy.UID_KEY: os.getuid(),
        policy.JOB_KEY: request[policy.JOB_KEY],
        policy.RUN_ID_KEY: run_id,
        policy.CONTROLLER_KEY: request[policy.CONTROLLER_KEY],
        policy.ARRIVAL_KEY: old[policy.ARRIVAL_KEY] if old else float(queue[policy.ARRIVAL_KEY]),
        policy.SEEN_KEY: time.time(),
        policy.PID_KEY: int(queue[policy.PID_KEY]),
        policy.STARTTIME_KEY: int(queue[policy.STARTTIME_KEY]),
        policy.BOOT_ID_KEY: str(queue.get(policy.BOOT_ID_KEY) or ""),
        policy.PIDNS_KEY: str(queue.get(policy.PIDNS_KEY) or ""),
        policy.NEEDS_KEY: needs,
    }
    path = os.path.join(lease_dir, f"ticket-{os.getuid()}-{run_id}.json")
    safefiles.write_json(path, ticket, mode=0o644)  # readable by every account
    return ticket


def cmd_withdraw(request):
    path = os.path.join(
        request[policy.LEASE_DIR_KEY], f"ticket-{os.getuid()}-{request[policy.RUN_ID_KEY]}.json"
    )
    try:
        os.remove(path)
        return {"withdrawn": True}
    except FileNotFoundError:
        return {"withdrawn": False}


def turn(request, lease_dir):
    """(None when the run may go on and take, else the answer that it waits behind earlier
    tickets; the ticket files ignored). A queued run's ticket is written (or refreshed) first,
    and stays."""
    tickets, ignored = leasedir.scan_tickets(lease_dir)
    tickets, ignored = _servable(tickets, ignored, lease_dir)
    needs = policy.needs_of(request[policy.WORKERS_KEY], gpu_pool)
    own = [
        t
        for t in tickets
        if t[policy.UID_KEY] == os.getuid() and t[policy.RUN_ID_KEY] == request[policy.RUN_ID_KEY]
    ]
    if request.get(policy.TICKET_KEY):
        ticket = _write_ticket(request, needs, own[0] if own else None)
        place = policy.order(ticket)
    else:  # not queued: it arrives now, behind every ticket
        place = (math.inf, os.getuid(), request[policy.RUN_ID_KEY])
    free, ahead = policy.may_take(needs, place, [t for t in tickets if t not in own])
    if free:
        return None, ignored
    answer = {
        policy.CLASHES_KEY: [policy.queue_clash(ahead)],
        policy.QUEUED_KEY: bool(request.get(policy.TICKET_KEY)),
    }
    return answer, ignored


def _servable(tickets, ignored, lease_dir):
    """The tickets this host could ever serve, and the ignored files with those it never
    could (more GPUs of a pool than the host has of it, where nvidia-smi says)."""
    machine = (
        _machine_gpus() if any(t[policy.NEEDS_KEY][policy.POOLS_KEY] for t in tickets) else None
    )
    kept = []
    for ticket in tickets:
        why = policy.never_served(ticket, machine)
        if why is None:
            kept.append(ticket)
        else:
            ignored.append(
                leasedir.ignored_file(
                    lease_dir, ticket[policy.FILE_KEY], ticket[policy.UID_KEY], why
                )
            )
    return kept, ignored


def _machine_gpus():
    """The GPUs nvidia-smi lists here, None where it cannot say (no nvidia-smi: CPU hosts; it
    fails, or lists none)."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = [int(m.group(1)) for m in re.finditer(r"^GPU (\d+):", listing.stdout, re.M)]
    return found if listing.returncode == 0 and found else None
