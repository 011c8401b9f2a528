"""Where each worker is, read from the Python stacks its faulthandler wrote, and which worker the
others wait for. Pure: the supervisor (at a stall), `orchestrate stacks` and the tests feed it
text.

A worker's place is its innermost frame of user or orchestrate code. Frames of TensorFlow that
are known waits are said in words (a collective, the input iterator's get_next, a checkpoint
save, the cluster forming: TensorFlow's, or JAX's under job.keras: jax); a thread inside a
tf.function shows only its execute call: "in the compiled step". The worker whose place is
elsewhere (user code, a library, a py_function's body running inside the step) while the others
wait is the one they wait for; with none or several such workers, which one is "undetermined".
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_STACK = re.compile(r"^Stack \(most recent call first\):")  # all_threads=False, or one thread
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
_LIBRARY = ("/site-packages/", "/dist-packages/")
_OURS_INSTALLED = ("/site-packages/worker/", "/site-packages/orchestrator/",
                   "/dist-packages/worker/", "/dist-packages/orchestrator/")  # fmt: skip
_STDLIB = re.compile(r"/lib/python3\.\d+/|/lib/pypy3")
_TENSORFLOW = ("/tensorflow/", "/keras/", "/tf_keras/", "/tensorflow_core/")
_CALLBACK = "/ops/script_ops.py"  # tf.py_function, tf.numpy_function: Python inside the graph

# Known places in TensorFlow, most telling first: (path fragment, function pattern, words).
KNOWN: tuple[tuple[str, str, str, str], ...] = (
    ("save", "/checkpoint/", r"save|write|_write|sync", "is saving a checkpoint"),
    ("save", "/training/saving/", r"save|write", "is saving a checkpoint"),
    ("save", "/checkpoint_management.py", r"save", "is saving a checkpoint"),
    ("get_next", "/data/ops/iterator_ops.py", r"get_next|__next__|_next_internal",
     "waits for its input pipeline (iterator get_next)"),
    ("get_next", "/distribute/input_lib.py", r"get_next|__next__",
     "waits for its input pipeline (iterator get_next)"),
    ("collective", "/ops/collective_ops.py", r".", "waits in a collective (all-reduce)"),
    ("collective", "/distribute/cross_device_ops.py", r".", "waits in a collective (all-reduce)"),
    ("collective", "/distribute/cross_device_utils.py", r".", "waits in a collective (all-reduce)"),
    ("forming", "/distribute/collective_all_reduce_strategy.py", r".",
     "waits for the cluster to form (MultiWorkerMirroredStrategy)"),
    # job.keras: jax: keras.distribution.initialize() and jax_cluster.initialize() both end
    # here, silent for up to 300 s while the coordinator or a peer has not registered.
    ("forming", "/jax/_src/distributed.py", r"initialize|connect",
     "waits for the JAX cluster to form (jax.distributed.initialize: the coordinator or a "
     "peer has not registered)"),
    ("compiled", "/eager/execute.py", r".", "waits in the compiled step"),
    ("compiled", "/eager/polymorphic_function/", r".", "waits in the compiled step"),
    ("compiled", "/eager/function.py", r".", "waits in the compiled step"),
)  # fmt: skip
WAITS = frozenset({"save", "get_next", "collective", "forming", "compiled"})


@dataclass(frozen=True)
class Frame:
    path: str
    line: int | None
    function: str

    @property
    def ours(self) -> bool:
        """User or orchestrate code: neither the standard library nor an installed library."""
        if self.path.startswith("<"):  # <frozen runpy>, <string> (the boot of a script)
            return False
        if any(part in self.path for part in _OURS_INSTALLED):
            return True
        return not any(part in self.path for part in _LIBRARY) and not _STDLIB.search(self.path)

    @property
    def stdlib(self) -> bool:
        return self.path.startswith("<") or (
            bool(_STDLIB.search(self.path)) and not any(p in self.path for p in _LIBRARY)
        )

    def at(self) -> str:
        where = posixpath.basename(self.path)
        return f"{where}:{self.line}" if self.line is not None else where

    def describe(self) -> str:
        return f"{self.function} ({self.at()})"


@dataclass(frozen=True)
class Thread:
    ident: str
    frames: tuple[Frame, ...]  # innermost first, as faulthandler writes them
    current: bool = False


@dataclass(frozen=True)
class Place:
    """Where one worker is: `kind` is a key of KNOWN ("compiled", "collective", ...) for a known
    wait of TensorFlow, "user" or "library" for elsewhere."""

    kind: str
    words: str  # "is in stuck_here (train.py:42)", "waits in the compiled step, from ..."

    @property
    def waits(self) -> bool:
        return self.kind in WAITS


def parse(text: str) -> list[Thread]:
    """The threads of the last complete dump in `text` (a dump asked for twice, by the Slurm
    launcher and by Slurm itself, is written twice): newest thread first, the main one last."""
    dumps: list[list[Thread]] = [[]]
    ident, current, frames = None, False, []  # type: ignore[var-annotated]

    def close() -> None:
        if ident is not None:
            dumps[-1].append(Thread(ident, tuple(frames), current))

    for line in text.splitlines():
        header = _THREAD.match(line)
        if header or _STACK.match(line):
            close()
            new_ident = header.group(2) if header else "0x0"
            if any(t.ident == new_ident for t in dumps[-1]):
                dumps.append([])  # the same thread again: a second dump begins
            ident, current, frames = new_ident, bool(header and header.group(1)[0] == "C"), []
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            number = frame.group(2)
            frames.append(Frame(frame.group(1), int(number) if number.isdigit() else None,
                                frame.group(3).strip()))  # fmt: skip
    close()
    complete = [dump for dump in dumps if dump]
    return complete[-1] if complete else []


def _known(frames: Sequence[Frame]) -> tuple[str, str] | None:
    for kind, fragment, pattern, words in KNOWN:
        for frame in frames:
            if fragment in frame.path and re.search(pattern, frame.function):
                return kind, words
    return None


def thread_place(thread: Thread) -> Place | None:
    """Where a thread is: its innermost own frame, or the known wait of TensorFlow inside it
    (an import is none: a module of TensorFlow being imported matches no wait)."""
    frames = thread.frames
    own = next((i for i, frame in enumerate(frames) if frame.ours), None)
    inner = frames[:own] if own is not None else frames
    libraries = [frame for frame in inner if not frame.stdlib]
    caller = f", from {frames[own].describe()}" if own is not None else ""
    if any(frame.path.startswith("<frozen importlib") for frame in inner):
        return Place("importing", f"is importing a module{caller}")  # its <module> frames too
    known = _known(libraries)
    if known is not None:
        return Place(known[0], known[1] + caller)
    if libraries:
        return Place("library", f"is in {libraries[0].describe()}{caller}")
    if own is not None:
        return Place("user", f"is in {frames[own].describe()}")
    return None


def worker_place(threads: Sequence[Thread]) -> Place | None:
    """The worker's place: user code that TensorFlow runs for it (a py_function's body, e.g. in
    its input pipeline) if any is there, else its main thread's (the oldest, listed last).
    Other threads of its own (a progress writer, a data loader) do not decide it."""
    for thread in threads:
        if any(_CALLBACK in frame.path for frame in thread.frames):
            place = thread_place(thread)
            if place is not None and place.kind == "user":
                return Place("user", f"{place.words}, inside TensorFlow (a py_function)")
    return thread_place(threads[-1]) if threads else None


@dataclass(frozen=True)
class Summary:
    places: dict[str, Place]  # by worker, in the order given
    silent: dict[str, str]  # workers that could not answer, with why
    blamed: str | None  # the worker the others wait for; None: undetermined

    def describe(self) -> str:
        """`worker-1 is in stuck_here (train.py:42); worker-0 waits in the compiled step, from
        step (train.py:20): the others wait for worker-1`."""
        parts = [f"{name} {place.words}" for name, place in self.places.items()]
        parts += [f"{name} did not answer ({why})" for name, why in self.silent.items()]
        verdict = (f"the others wait for {self.blamed}" if self.blamed
                   else "which worker the others wait for is undetermined")  # fmt: skip
        return f"{'; '.join(parts)}: {verdict}" if parts else verdict


def summarise(stacks: Mapping[str, str | None], silent: Mapping[str, str] | None = None) -> Summary:
    """By worker, its stacks' text (None or "" for one without stacks), and the workers that
    could not answer with why."""
    places: dict[str, Place] = {}
    unanswered = dict(silent or {})
    for name, text in stacks.items():
        place = worker_place(parse(text or ""))
        if place is None:
            unanswered.setdefault(name, "no Python stack in its answer")
        else:
            places[name] = place
    elsewhere = [name for name, place in places.items() if not place.waits]
    waiting = [name for name, place in places.items() if place.waits]
    # Only where another worker is seen waiting: a worker alone elsewhere, beside peers that
    # could not answer (stopped, no handler), may be no more than the one still working.
    blamed = elsewhere[0] if len(elsewhere) == 1 and waiting else None
    ordered = dict(sorted(places.items(), key=lambda item: item[0] != blamed))
    return Summary(ordered, unanswered, blamed)


def same_stacks(text: str) -> tuple[tuple[Frame, ...], ...]:
    """What makes two workers' stacks "identical": their threads' frames, not thread ids."""
    return tuple(thread.frames for thread in parse(text))


def grouped(stacks: Mapping[str, str]) -> list[tuple[list[str], str]]:
    """Workers with identical stacks together, each group with the first one's text (its last
    dump), in the order of the workers given."""
    groups: dict[tuple[tuple[Frame, ...], ...], tuple[list[str], str]] = {}
    for name, text in stacks.items():
        key = same_stacks(text) or ((Frame(text, None, ""),),)
        if key in groups:
            groups[key][0].append(name)
        else:
            groups[key] = ([name], last_dump(text))
    return list(groups.values())


def last_dump(text: str) -> str:
    """The text of the last complete dump (see parse), as written."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _THREAD.match(line) or _STACK.match(line)]
    seen: set[str] = set()
    begin = 0
    for i in starts:
        header = _THREAD.match(lines[i])
        ident = header.group(2) if header else "0x0"
        if ident in seen:
            begin, seen = i, set()
        seen.add(ident)
    return "\n".join(lines[begin:]).strip("\n") + "\n" if lines else ""
