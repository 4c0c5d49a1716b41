"""The monitor's own load meter (flowtop.monitor.selfload): rates over a window, from injected clocks."""

from __future__ import annotations

import pytest

from flowtop.monitor.selfload import LoadMeter


def test_cpu_and_frame_rates_over_the_window() -> None:
    t = {"wall": 0.0, "cpu": 0.0}
    meter = LoadMeter(wall=lambda: t["wall"], cpu=lambda: t["cpu"], window_s=5.0)
    first = meter.read(taken_at=10.0, received=100)
    assert first.cpu_ratio is None and first.frames_per_s is None  # one reading: no rate yet
    t.update(wall=0.2, cpu=0.1)
    assert meter.read(10.2, 120).cpu_ratio is None  # under half a second apart: still none
    t.update(wall=2.0, cpu=1.5)
    load = meter.read(12.0, 300)
    assert load.cpu_ratio == pytest.approx(0.75) and load.frames_per_s == pytest.approx(100.0)
    for i in range(1, 11):  # a steady 2 cores and 1,000 frames/s for 10 s: the old readings age out
        t.update(wall=2.0 + i, cpu=1.5 + 2 * i)
        load = meter.read(12.0 + i, 300 + 1000 * i)
    assert load.cpu_ratio == pytest.approx(2.0) and load.frames_per_s == pytest.approx(1000.0)
    # Without a snapshot the last frame rate stands; a snapshot clock that went back starts over.
    assert meter.read().frames_per_s == pytest.approx(1000.0)
    assert meter.read(1.0, 5).frames_per_s is None
