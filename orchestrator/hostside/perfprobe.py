"""The host probe's performance round (`check --perf`): its compute, sink and send verbs, bounded
in time and bytes. STANDARD LIBRARY ONLY (the compute child imports NumPy or TensorFlow as a
worker would); shipped with the host probe (hostprobe.py), which serves these verbs.

  compute SPEC_JSON   start a matmul child of the host's python (NumPy, or TensorFlow on a GPU
                      when asked for and present); then, one request per window, its GFLOP/s
  sink SPEC_JSON      listen on an ephemeral port in a thread; each connection is read to its end
                      and answered with what arrived and how fast
  send SPEC_JSON      send to a peer's sink for at most `seconds` or `max_bytes`; the sink's figures
"""

import json
import os
import select
import socket
import sys
import time

if __package__:  # imported as part of orchestrate: the host probe's tests
    from orchestrator.hostside import protocol
else:  # shipped: hostside/bundle.py carries it in front of the host probe's source
    import protocol  # type: ignore[no-redef]

# Run by the host's python as a long-lived child (it inherits the probe's cgroup, nice level and
# limits): it prepares the matmul, says so in one JSON line, then answers each line on stdin (a
# window's length in seconds) with the GFLOP/s of back-to-back matmuls over that window. The
# controller asks hosts of one machine in turn, window by window, and keeps each host's best.
# On a CPU the figure is the matmul's speed per second the thread actually ran (/proc's
# schedstat), times the share of a CPU its cgroups' quota allows: the load of other processes,
# which comes and goes on a shared machine, is no verdict on the host, while a slower or
# throttled CPU and a CPU quota are. One BLAS thread: a core's speed, not how many cores happen
# to be idle at that moment. On a GPU it is the wall-clock speed.
COMPUTE_CHILD = r"""
import json, os, sys, time
spec = json.loads(sys.argv[1])
def say(answer):
    sys.stdout.write(json.dumps(answer) + "\n"); sys.stdout.flush()
ready = {"probe": None, "device": "cpu"}
matmul = sync = None
if spec.get("gpu"):
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf
        gpus = tf.config.list_physical_devices("GPU")
    except Exception as exc:
        gpus, ready["detail"] = [], "TensorFlow: %s" % exc
    if gpus:
        n = spec["gpu_size"]
        with tf.device("/GPU:0"):
            a = tf.random.uniform((n, n)); b = tf.random.uniform((n, n))
        out = []
        def matmul():
            with tf.device("/GPU:0"):
                out[:] = [tf.linalg.matmul(a, b)]
        def sync():
            if out: out[0][0, 0].numpy()
        ready.update(probe="tensorflow", device="gpu")
    elif "detail" not in ready:
        ready["detail"] = "TensorFlow sees no GPU"
if matmul is None:
    try:
        import numpy
    except Exception:
        ready["detail"] = ready.get("detail") or "NumPy is not installed"
    else:
        n = spec["cpu_size"]
        a = numpy.random.rand(n, n).astype(numpy.float32)
        b = numpy.random.rand(n, n).astype(numpy.float32)
        matmul, sync = (lambda: a @ b), (lambda: None)
        ready.update(probe="numpy", device="cpu", detail=None)
if matmul is not None:
    matmul(); sync()  # warm up: the first call allocates (and TensorFlow compiles)
def ran():  # seconds this thread has run on a CPU (None without schedstat)
    try:
        with open("/proc/thread-self/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
def read(path):
    try:
        with open(path) as handle:
            return handle.read().split()
    except OSError:
        return None
def cpu_limit():  # the CPUs this process's cgroups allow (a CFS quota), None: no limit
    try:
        with open("/proc/self/cgroup") as handle:
            lines = [line.rstrip("\n").split(":", 2) for line in handle]
    except OSError:
        return None
    v1 = [path for _, names, path in lines if "cpu" in names.split(",")]
    v2 = [path for hier, _, path in lines if hier == "0"]
    limits, path = [], (v1 or v2 or ["/"])[0].rstrip("/")
    while True:
        if v1:
            quota = read("/sys/fs/cgroup/cpu%s/cpu.cfs_quota_us" % path)
            period = read("/sys/fs/cgroup/cpu%s/cpu.cfs_period_us" % path)
            if quota and period and int(quota[0]) > 0:
                limits.append(int(quota[0]) / int(period[0]))
        else:
            both = read("/sys/fs/cgroup%s/cpu.max" % path)
            if both and both[0] != "max":
                limits.append(int(both[0]) / int(both[1]))
        if not path:
            break
        path = path.rsplit("/", 1)[0]
    return min(limits) if limits else None
limit = cpu_limit()
ready["cpu_limit"] = limit
say(ready)
for line in sys.stdin:
    window, count = float(line), 0
    ran_before, started = ran(), time.perf_counter()
    while time.perf_counter() - started < window:
        matmul(); count += 1
    sync()
    wall = time.perf_counter() - started
    busy = wall if ran_before is None or ready["device"] == "gpu" else ran() - ran_before
    rate = count * 2.0 * n ** 3 / max(busy, 1e-6) / 1e9
    if ready["device"] == "cpu" and limit is not None:
        rate *= min(1.0, limit)  # one thread gets at most this share of a core's time
    say({"gflops": rate, "wall_gflops": count * 2.0 * n ** 3 / wall / 1e9})
"""
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
COMPUTERS: dict = {}  # "child": the compute child, "ready": its first answer


def _read_line(stream, timeout):
    if not select.select([stream], [], [], timeout)[0]:
        return None
    return stream.readline()


def stop_computer():
    child = COMPUTERS.pop("child", None)
    COMPUTERS.pop("ready", None)
    if child is not None:
        child.kill()
        child.wait()


def cmd_compute(spec):
    """`{"start": {...}}` starts the compute child and answers what it measures with (or why
    nothing); `{"window": SECONDS}` measures one window; `{"stop": true}` ends the child."""
    import subprocess

    if spec.get("stop"):
        stop_computer()
        return {}
    if spec.get("start"):
        stop_computer()
        env = dict(os.environ, **dict.fromkeys(ONE_THREAD, "1"))
        # Not isolated: it imports NumPy or TensorFlow as a worker would (PYTHONPATH, the user
        # site). Started in the user's home, so `-c`'s first sys.path entry is a directory the
        # user owns, not wherever this probe was started from.
        child = subprocess.Popen(  # spawn point: the compute probe's Python
            [sys.executable, "-c", COMPUTE_CHILD, json.dumps(spec["start"])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env, cwd=os.path.expanduser("~"),
        )  # fmt: skip
        COMPUTERS["child"] = child
        line = _read_line(child.stdout, spec[protocol.TIMEOUT_KEY])
        try:
            ready = json.loads(line) if line else None
        except ValueError:
            ready = None
        if not isinstance(ready, dict):
            why = f"exited {child.wait()}" if line == "" else "no answer in time"
            stop_computer()
            return {
                protocol.PROBE_KIND_KEY: None,
                protocol.GFLOPS_KEY: None,
                protocol.DETAIL_KEY: f"the compute probe {why}",
            }
        COMPUTERS["ready"] = ready
        if ready.get(protocol.PROBE_KIND_KEY) is None:
            stop_computer()
        return ready
    child = COMPUTERS.get("child")
    if child is None:
        return {protocol.GFLOPS_KEY: None, protocol.DETAIL_KEY: "no compute probe running"}
    try:
        child.stdin.write(f"{spec['window']}\n")
        child.stdin.flush()
        line = _read_line(child.stdout, spec["window"] + spec[protocol.TIMEOUT_KEY])
        return {**COMPUTERS["ready"], **json.loads(line)}
    except (OSError, ValueError, TypeError):
        stop_computer()
        return {
            protocol.GFLOPS_KEY: None,
            protocol.DETAIL_KEY: "the compute probe stopped answering",
        }


def _run_delay():
    """Seconds this thread has waited for a CPU (runnable, not running), or 0 without schedstat.
    On one machine a link is as fast as its two ends get the CPU: that wait is the machine's
    other load, not the link."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
            return int(handle.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _drain(conn, timeout):
    """Read one transfer to its end; answer bytes, the seconds from its first byte to its last,
    and how long this end waited for a CPU meanwhile."""
    conn.settimeout(timeout)
    total, first, last, waited = 0, None, None, 0.0
    try:
        while True:
            chunk = conn.recv(1 << 20)
            now = time.monotonic()
            if not chunk:
                break
            if first is None:
                first, waited = now, _run_delay()  # the clock starts at the first byte
            total += len(chunk)
            last = now
        seconds = (last - first) if first is not None else 0.0
        answer = {
            protocol.BYTES_KEY: total,
            protocol.SECONDS_KEY: round(seconds, 6),
            "waited": _run_delay() - waited,
        }
        conn.sendall((json.dumps(answer) + "\n").encode())
    except OSError:
        pass
    finally:
        conn.close()


def _sink_loop(server, timeout):
    import threading

    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # closed at end of input
        threading.Thread(target=_drain, args=(conn, timeout), daemon=True).start()


SINKS: list = []  # the sinks' listening sockets, closed at end of input


def cmd_sink(spec):
    import threading

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("0.0.0.0", 0))  # an ephemeral port: the workers' port is not touched
    server.listen(16)
    SINKS.append(server)
    threading.Thread(
        target=_sink_loop, args=(server, spec[protocol.TIMEOUT_KEY]), daemon=True
    ).start()
    return {protocol.PORT_KEY: server.getsockname()[1]}


def cmd_send(spec):
    """Send zeros to a peer's sink for `seconds` or `max_bytes`, whichever comes first."""
    chunk = bytes(1 << 18)
    sent, deadline, waited_here = 0, time.monotonic() + spec[protocol.SECONDS_KEY], _run_delay()
    try:
        with socket.create_connection(
            (spec[protocol.ADDRESS_KEY], spec[protocol.PORT_KEY]), spec[protocol.TIMEOUT_KEY]
        ) as sock:
            sock.settimeout(spec[protocol.TIMEOUT_KEY])
            while sent < spec["max_bytes"] and time.monotonic() < deadline:
                sock.sendall(chunk)
                sent += len(chunk)
            sock.shutdown(socket.SHUT_WR)
            reply = b""
            while not reply.endswith(b"\n"):
                data = sock.recv(4096)
                if not data:
                    break
                reply += data
    except OSError as exc:
        return {
            protocol.STATUS_KEY: "error",
            protocol.DETAIL_KEY: exc.strerror or str(exc),
            protocol.SENT_KEY: sent,
        }
    try:
        answer = json.loads(reply)
        seconds, waited = float(answer[protocol.SECONDS_KEY]), float(answer.get("waited", 0.0))
    except (ValueError, KeyError, TypeError):
        return {
            protocol.STATUS_KEY: "error",
            protocol.DETAIL_KEY: "the peer's sink gave no figures",
            protocol.SENT_KEY: sent,
        }
    # The time either end waited for a CPU is not the link's: left out, but at most half of the
    # transfer's (a rate at most doubled), so that one burst of a busy machine cannot make its
    # link look so fast that the others look slow beside it.
    busy = max(seconds - max(waited, _run_delay() - waited_here), seconds * 0.5)
    rate = answer[protocol.BYTES_KEY] / busy if busy > 0 else None
    return {protocol.STATUS_KEY: "ok", protocol.SENT_KEY: sent, **answer, protocol.RATE_KEY: rate}
