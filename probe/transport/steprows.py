"""The training thread's queue, and the step row the step tracker's common step puts in it.

Each optimizer step pays for every object the probe touches (after a long step the caches are
cold: each costs a miss, not its instructions). The common step therefore queues a plain tuple,
not a dict (9 keys, ~4 µs to build after a CPU step), appended to the queue directly, not through
a method, with the perf_counter read the tracker takes anyway as its stamp, not a
``time.time()`` of its own; the queue object itself carries the count of appends and the sender's
sleep flag, so that publishing touches the queue alone (not the publisher too). Timed from
outside in one process after real CPU steps (a prototype of this, variants alternating step by
step): the optimizer post-hook 21.8 → 15.2 µs median.

The sender thread turns each row into the record dict every other step message is
(:func:`step_fields`): what the wire, the batches and the tests see is unchanged.
"""

from __future__ import annotations

import collections
from typing import Any, Final, Union

__all__ = ["ROW_LEN", "Queued", "StepRow", "TrainingQueue", "step_fields"]

#: A message of the training thread's queue: (kind, wall time of its publish(), fields).
Queued = tuple[str, float, dict[str, Any]]

#: A step as the tracker's common step queues it (probe.steps.tracker.StepTracker.boundary):
#: (step, perf_counter stamp of the publish, wall_s, tokens, input_wait_s or None, the end of the
#: step's last root forward or None, the step's start, device_s or None, dstep or None,
#: micro_batches, probe_s). lead_s is worked out from the two instants on the sender thread.
StepRow = tuple[int, float, float, int, Union[float, None], Union[float, None], float, Union[float, None],
                Union[int, None], int, float]
ROW_LEN: Final = 11


def step_fields(row: StepRow) -> dict[str, Any]:
    """The ``step`` record of a row (the fields the runtime's own steps publish, in that order)."""
    step, _, wall, tokens, wait, end, start, device_s, dstep, forwards, probe_s = row
    return {"step": step, "wall_s": wall, "tokens": tokens, "input_wait_s": wait,
            "lead_s": end - start if end is not None and end > start else None,
            "device_s": device_s, "dstep": dstep, "micro_batches": forwards, "probe_s": probe_s}


class TrainingQueue(collections.deque[Union[Queued, StepRow]]):
    """Bounded deque of what the training thread queues for the sender (it drops the oldest when
    full), with in the same object: ``appended``, the appends so far (training thread; each
    counted after its append, so the sender never sees a phantom drop), and ``asleep``, set by
    the sender when it sleeps until an append wakes it (see probe.transport.sender)."""

    __slots__ = ("appended", "asleep")

    def __init__(self, maxlen: int) -> None:
        super().__init__((), maxlen)
        self.appended = 0
        self.asleep = False
