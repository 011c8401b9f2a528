"""Joined the cluster? Sampled from /proc while a worker lives (issue 28): a worker of a
multi-worker cluster that loaded TensorFlow and never listened on its port never created
MultiWorkerMirroredStrategy; it trained alone.

STANDARD LIBRARY ONLY (and contract.py, whose TF_CONFIG keys it reads), and Python 3.7 or newer
(a Slurm node's python3 may be old). Shipped, not installed: hostside/bundle.py carries this
file's source in front of the programs that import it (the host agent, hostside/agent.py, and
the Slurm launcher, hostside/slurm_launcher.py), so it runs on a host, a Slurm node or a
container with nothing of orchestrate installed, and never the copy of an orchestrate that is
installed there.
"""

import json
import os
import time

if __package__:  # imported as part of orchestrate: the controller's tests
    from orchestrator import contract
else:  # shipped: hostside/bundle.py carries it in front of the program's source
    import contract  # type: ignore[no-redef]


def cluster_port(tf_config):
    """This task's port in a TF_CONFIG (JSON text or dict) of two tasks or more, else None."""
    try:
        config = json.loads(tf_config) if isinstance(tf_config, str) else tf_config
        cluster, task = config[contract.TF_CLUSTER], config[contract.TF_TASK]
        if sum(len(tasks) for tasks in cluster.values()) < 2:
            return None
        return int(
            str(cluster[task[contract.TF_TYPE]][int(task[contract.TF_INDEX])]).rsplit(":", 1)[1]
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def process_tree(pid):
    """pid and its descendants (/proc/PID/task/TID/children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as handle:
                    todo.extend(int(child) for child in handle.read().split())
            except (OSError, ValueError):
                continue
    return found


def socket_inodes(pids):
    inodes = set()
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def listens(pid, port, inodes):
    """Whether one of these sockets listens on port (pid's network namespace); None when /proc
    cannot tell."""
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            fields = row.split()  # sl local remote state ... uid timeout inode
            listening = len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False if readable else None


def loads_tensorflow(pids):
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as handle:
                if "libtensorflow_framework" in handle.read():
                    return True
        except OSError:
            continue
    return False


def _sample_interval(age, first):
    return first if age < 30 else 1.0 if age < 300 else 5.0


class JoinWatch:
    """Samples, in a thread, whether the worker pid (or a process it started) loaded TensorFlow
    and listened on its TF_CONFIG port: every 0.2 s for 30 s, every second for 5 minutes, then
    every 5 s, until it did (a script that never listens is sampled all its life: what it did
    persists, a mapped library and a listening socket, so the rarer samples lose nothing).
    joined(): True, False, or None when not known (one task, no TensorFlow, no /proc)."""

    def __init__(self, pid, tf_config, interval=0.2):
        import threading  # not at the top: an agent session that starts no worker needs none

        self.port = cluster_port(tf_config)
        self.tensorflow = False
        self.listened = None  # None until /proc answered once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pid, interval), daemon=True)
        if self.port is not None:
            self._thread.start()

    def _run(self, pid, interval):
        started = time.time()
        while not self._stop.is_set():
            pids = process_tree(pid)
            self.tensorflow = self.tensorflow or loads_tensorflow(pids)
            inodes = socket_inodes(pids)
            heard = listens(pid, self.port, inodes) if inodes else None
            if heard is None and not inodes and os.path.isdir(f"/proc/{pid}/fd"):
                heard = False  # alive, no socket at all
            if heard is not None:
                self.listened = heard
            if heard:
                return
            self._stop.wait(_sample_interval(time.time() - started, interval))

    def joined(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        if not self.tensorflow or self.listened is None:
            return None
        return self.listened
