"""The CUDA event clock of the step tracker (probe.steps.devclock), with stand-ins for CUDA where
the machine has none; tests/test_gpu.py runs it on a GPU (device step time of a real loop)."""

from __future__ import annotations

from typing import Any

import pytest

from probe.steps.devclock import DeviceClock


class _Cuda:
    """torch.cuda's Event and Stream as the clock uses them, on a device clock the test moves:
    an event recorded at host time t completes when the device reaches t + lag."""

    def __init__(self) -> None:
        self.now = 0.0
        self.device_at = 0.0  # how far the device has run
        self.streams_made = self.queries = 0
        self.stuck: set = set()  # streams whose work the device has not reached
        self.capturing = False
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.t: float | None = None
                self.stream: Any = None

            def record(self, stream: Any) -> None:
                self.t, self.stream = cuda.now, stream

            def query(self) -> bool:
                cuda.queries += 1
                return self.done()

            def done(self) -> bool:
                return self.t is not None and self.t <= cuda.device_at and self.stream.key not in cuda.stuck

            def elapsed_time(self, end: "Event") -> float:
                assert self.done() and end.done(), "cudaErrorNotReady"
                return (end.t - self.t) * 1000.0  # ms, as CUDA gives it

        class Stream:
            def __init__(self, stream_id: int, device_index: int, device_type: int) -> None:
                cuda.streams_made += 1
                self.key = (stream_id, device_index, device_type)

        self.Event, self.Stream = Event, Stream

    def is_current_stream_capturing(self) -> bool:
        return self.capturing


def test_one_stream_object_per_stream_and_events_recorded_again() -> None:
    """Ten boundaries 0.05 s apart on a device that keeps up: each step's time is read two
    boundaries later (the event just recorded is not queried), with one query a boundary; three
    events serve them all, and the current stream's object is built once — again when a user
    switches to another stream, and not again when they switch back."""
    cuda, current = _Cuda(), [(0, 3, 1)]
    clock = DeviceClock(3, cuda=cuda, current=lambda index: current[0] if index == 3 else (9, 9, 9))
    got = []
    for step in range(1, 11):
        cuda.now = cuda.device_at = 0.05 * step
        got.append(clock.mark(step))
    assert got[:2] == [(None, None)] * 2
    assert [(round(s, 6), n) for s, n in got[2:]] == [(0.05, step) for step in range(2, 10)]
    assert clock.made == 3 and cuda.queries == 8 and cuda.streams_made == 1
    first = clock.stream()[0]
    current[0] = (7, 3, 1)  # with torch.cuda.stream(s): ...
    assert clock.stream()[0].key == (7, 3, 1) and cuda.streams_made == 2
    current[0] = (0, 3, 1)
    assert clock.stream()[0] is first and cuda.streams_made == 2


def test_a_device_that_lags_is_read_when_it_catches_up() -> None:
    """The host runs five boundaries ahead of the device (a step k lasts 0.1·(k-1) s of host time,
    the device done with none): nothing to report; once it catches up, the newest finished step
    before the one just ended is reported with its own time, and the events of the steps read are
    recorded again instead of new ones made."""
    cuda = _Cuda()
    clock = DeviceClock(0, cuda=cuda, current=lambda index: (0, 0, 1))
    for step, t in enumerate((0.0, 0.1, 0.3, 0.6, 1.0), start=1):
        cuda.now = t
        assert clock.mark(step) == (None, None)
    cuda.now, cuda.device_at = 1.5, 1.5
    seconds, step = clock.mark(6)
    assert step == 5 and round(seconds, 6) == 0.4  # from the boundary at 0.6 to its own at 1.0
    assert clock.made == 6
    cuda.now, cuda.device_at = 1.6, 1.6
    assert [round(x, 6) for x in clock.mark(7)] == [0.5, 6] and clock.made == 6


def test_a_change_of_stream_waits_for_the_earlier_event_and_a_capture_records_nothing() -> None:
    """The first boundary is recorded on the default stream, the next ones on a side stream the
    user switched to: the side stream's events are done while the default stream's is not (the
    device is still on it), so nothing is read (elapsed_time would fail: not ready) until it is.
    Inside a CUDA graph capture a boundary records and asks nothing; after it the clock starts
    afresh."""
    cuda, current = _Cuda(), [(0, 0, 1)]
    clock = DeviceClock(0, cuda=cuda, current=lambda index: current[0])
    cuda.now = cuda.device_at = 0.1
    clock.mark(1)
    current[0] = (5, 0, 1)
    cuda.stuck.add((0, 0, 1))
    for step in (2, 3):
        cuda.now = cuda.device_at = 0.1 * step
        assert clock.mark(step) == (None, None)
    cuda.stuck.clear()
    cuda.now = cuda.device_at = 0.4
    assert [round(x, 6) for x in clock.mark(4)] == [0.1, 3]
    cuda.capturing = True
    made, queries = clock.made, cuda.queries
    assert [clock.mark(step) for step in (5, 6)] == [(None, None)] * 2
    assert (clock.made, cuda.queries) == (made, queries)
    cuda.capturing = False
    got = []
    for step in (7, 8, 9):
        cuda.now = cuda.device_at = 0.1 * step
        got.append(clock.mark(step))
    assert got[:2] == [(None, None)] * 2 and [round(x, 6) for x in got[2]] == [0.1, 8]


def test_the_tracker_times_cuda_steps_through_its_clock_and_keeps_its_gpu_when_it_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracker builds the clock for the rank's GPU when its device becomes a CUDA device, takes
    each boundary's device time from it, and when the clock fails loses the device time only: the
    device stays (telemetry, kernel windows and NVTX read it)."""
    import torch

    from probe.steps import devclock, tracker as tr

    made: list[int] = []

    class Clock:
        def __init__(self, index: int) -> None:
            made.append(index)
            self.fail = False

        def mark(self, step: int) -> tuple[float, int]:
            if self.fail:
                raise RuntimeError("CUDA error: device not ready")
            return 0.02, step - 1

    monkeypatch.setattr(devclock, "DeviceClock", Clock)  # the tracker's device setter (probe.steps.devclock) makes it
    t = tr.StepTracker(on_step=lambda fields: None)
    t.device = torch.device("cuda", 3)
    assert made == [3]
    t.step = 7
    assert t._device_time() == (0.02, 6)
    t._clock.fail = True
    assert t._device_time() == (None, None)
    assert t.device == torch.device("cuda", 3) and t._clock is None
    assert t._device_time() == (None, None)
    t.device = torch.device("cpu")
    assert t._clock is None and made == [3]
