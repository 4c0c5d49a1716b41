"""The CUDA event clock of the step tracker (probe.steps.devclock), with stand-ins for CUDA where
the machine has none; tests/test_gpu.py runs it on a GPU (device step time of a real loop)."""

from __future__ import annotations

from typing import Any

from probe.steps.devclock import DeviceClock


class _Cuda:
    """torch.cuda's Event and Stream as the clock uses them, on a device clock the test moves:
    an event recorded at host time t completes when the device reaches t + lag."""

    def __init__(self) -> None:
        self.now = 0.0
        self.device_at = 0.0  # how far the device has run
        self.streams_made = self.queries = 0
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
                return self.t is not None and self.t <= cuda.device_at

            def elapsed_time(self, end: "Event") -> float:
                assert self.t is not None and end.t is not None
                assert self.t <= cuda.device_at and end.t <= cuda.device_at
                return (end.t - self.t) * 1000.0  # ms, as CUDA gives it

        class Stream:
            def __init__(self, stream_id: int, device_index: int, device_type: int) -> None:
                cuda.streams_made += 1
                self.key = (stream_id, device_index, device_type)

        self.Event, self.Stream = Event, Stream


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
    first = clock.stream()
    current[0] = (7, 3, 1)  # with torch.cuda.stream(s): ...
    assert clock.stream().key == (7, 3, 1) and cuda.streams_made == 2
    current[0] = (0, 3, 1)
    assert clock.stream() is first and cuda.streams_made == 2


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
