"""Where the built-in loop's tf.function calls end, with --steps-per-call K.

Pure (no TensorFlow), so the schedule is unit-tested on its own. The host sees the training
state only between calls: every step at which it must act (log, checkpoint, evaluation,
preemption check, profile window, the first and the last step) has to end a call.
"""

from __future__ import annotations

from collections.abc import Iterable


def call_end(step: int, steps_per_call: int, stops: Iterable[int], intervals: Iterable[int]) -> int:
    """The last step of the call that starts after `step`: K steps on, or sooner where the host
    must see a step (an absolute step in `stops`, or a multiple of one of `intervals`).

    With the intervals multiples of K (worker.config checks it) and a start at a multiple of K,
    every call is K steps long except the first (one step, so that "first step done" means one
    step), the one that then fills up to the next multiple of K, and the last one when the final
    step is not a multiple of K.
    """
    end = step + steps_per_call
    for stop in stops:
        if step < stop < end:
            end = stop
    for every in intervals:
        end = min(end, (step // every + 1) * every)
    return end


def call_lengths(
    start: int, last: int, steps_per_call: int, stops: Iterable[int], intervals: Iterable[int]
) -> list[int]:
    """Every call's length from step `start` to step `last` (what Loop.run runs)."""
    stops, intervals = tuple(stops), tuple(intervals)
    lengths, step = [], start
    while step < last:
        end = min(call_end(step, steps_per_call, stops, intervals), last)
        lengths.append(end - step)
        step = end
    return lengths
