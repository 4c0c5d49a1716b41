"""A step's time on the device, from one CUDA event recorded at each boundary.

What each boundary pays is a handful of CUDA calls, and on an H200 host (torch 2.11, CUDA 13) they
were most of the probe's time per step: 55 µs of a 64 µs boundary, of which
``torch.cuda.current_stream(device)`` took 17.6 µs (it builds a new Stream object each call),
``torch.cuda.Event()`` 5.5, ``record`` 10.4, ``query`` 4.3 (up to two a step) and ``elapsed_time``
4.5. Here the current stream is looked up by what CUDA says it is (its id, one C call) and its
Stream object is built once per stream; an event whose step time was read is recorded again for
a later step instead of a new one being made; the event just recorded is not queried. ``record``,
one ``query`` and ``elapsed_time`` a step are the device's own.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable, Deque

import torch

from probe._log import warn_once


class DeviceClock:
    """The CUDA events of one rank's GPU (device ``index``); ``cuda`` and ``current`` (CUDA's
    current stream of a device as ``(stream_id, device_index, device_type)``) are torch's own
    unless a test hands in stand-ins."""

    def __init__(self, index: int, cuda: Any = None,
                 current: Callable[[int], tuple[int, int, int]] | None = None) -> None:
        self._cuda = cuda if cuda is not None else torch.cuda
        self._index = index
        # A private torch call (torch.cuda.current_stream wraps it): without it, or where it
        # answers in another form, the public one.
        self._current = current if current is not None else getattr(torch._C, "_cuda_getCurrentStream", None)
        try:
            key = self._current(index) if self._current is not None else None
            if not (isinstance(key, tuple) and len(key) == 3):
                self._current = None
        except Exception:
            self._current = None
        self._capturing = getattr(self._cuda, "is_current_stream_capturing", lambda: False)
        self._streams: dict[tuple[int, int, int], Any] = {}
        # (step, its boundary's event, the stream it was recorded on)
        self._events: Deque[tuple[int, Any, Any]] = collections.deque(maxlen=64)
        self._free: list[Any] = []  # events whose time was read: recorded again
        self.made = 0  # events created (a test reads it)

    def stream(self) -> tuple[Any, Any]:
        """The current stream of the rank's GPU (a user's ``with torch.cuda.stream(s)`` too), and
        what tells it from another."""
        current = self._current
        if current is None:
            s = self._cuda.current_stream(self._index)
            return s, s
        key = current(self._index)
        s = self._streams.get(key)
        if s is None:
            if len(self._streams) >= 16:  # streams made and dropped over and over
                self._streams.clear()
            s = self._streams[key] = self._cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
        return s, key

    def mark(self, step: int) -> tuple[float | None, int | None]:
        """Record the boundary that ends ``step``; return the newest step before it that the
        device finished, as (its seconds between its two boundaries, its number), or (None, None).
        Never blocks. A boundary inside a CUDA graph capture (a whole step captured, optimizer
        included) records and asks nothing: an event there would belong to the graph, and a query
        during a capture can invalidate it."""
        if self._capturing():
            self._events.clear()
            return None, None
        free = self._free
        if free:
            ev = free.pop()
        else:
            ev = self._cuda.Event(enable_timing=True)
            self.made += 1
        stream, key = self.stream()
        ev.record(stream)
        events = self._events
        events.append((step, ev, key))
        result: tuple[float | None, int | None] = (None, None)
        # The event just recorded is not asked about: it is rarely done yet, and a query costs
        # ~4 µs there; a step's time is read one boundary later instead, for one query a step.
        # Across a change of stream the later event can be done before the earlier one.
        while len(events) >= 3 and events[1][1].query() and (events[0][2] == events[1][2] or events[0][1].query()):
            e0 = events.popleft()[1]
            s1, e1, _ = events[0]
            result = (e0.elapsed_time(e1) / 1000.0, s1)
            free.append(e0)
        return result


class DeviceTiming:
    """The rank's device and its :class:`DeviceClock` (a base of
    :class:`probe.steps.tracker.StepTracker`, whose slots and __dict__ hold the state)."""

    if not TYPE_CHECKING:
        __slots__ = ()

    if TYPE_CHECKING:  # StepTracker's, set in its __init__
        step: int
        _device: torch.device | None
        _clock: DeviceClock | None

    @property
    def device(self) -> torch.device | None:
        """The device this rank trains on (None until known)."""
        return self._device

    @device.setter
    def device(self, dev: torch.device | None) -> None:
        self._device = dev
        self._clock = None
        if dev is not None and dev.type == "cuda":
            try:  # the rank's GPU, not whatever device is current at a boundary
                self._clock = DeviceClock(dev.index if dev.index is not None else torch.cuda.current_device())
            except Exception as exc:
                warn_once("cuda-events", f"CUDA event timing disabled: {exc}")

    def _device_time(self) -> tuple[float | None, int | None]:
        """Record this boundary's CUDA event; return the newest completed step's time."""
        clock = self._clock
        if clock is None:
            return None, None
        try:
            return clock.mark(self.step)
        except Exception as exc:  # device time is lost, not the GPU (telemetry, windows, NVTX read it)
            warn_once("cuda-events", f"CUDA event timing disabled: {exc}")
            self._clock = None
            return None, None
