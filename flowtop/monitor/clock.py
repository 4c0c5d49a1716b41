"""The monitor's clock and the fixed cadence of its ticks. No Textual.

Liveness is judged on the monitor's receive clock. When the monitor itself does not run — the
process SIGSTOPped, a long GC pause, a starved VM — no frame is received for that long, and on
resume every rank would look silent at once: a false ``hang_all`` that lingers ~10 s (hints hold
10 s). The data loop reads its clock at least once per tick (its poll never waits longer), so a
gap between two reads far above the cadence can only mean that the monitor was away; such a gap
is taken out of the clock. A rank's silence then counts only the time the monitor was listening:
after a resume every rank has the rest of its stale interval to be heard again, and a rank that
truly died during the pause still goes stale and hangs once that is over.

Everything on the data side (frame receive stamps, ticks, snapshots, recordings) reads this one
clock, so a recording made across a pause replays exactly as it was shown live. What reads
snapshots on another thread (the metrics endpoint, which answers a scrape that came during the
pause before the next tick) tells their real age from ``MonitorSnapshot.built_at``, on the
process's own clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

#: Seconds between two ticks (eviction, hint hysteresis), live and in replay alike.
TICK_S = 0.5
#: A gap between two reads of the clock longer than this is a pause of the monitor itself
#: (the loop reads it at least every TICK_S; one 8 MB kernels frame validates in ~1.5 s).
PAUSE_S = 5.0


@dataclass(frozen=True)
class Pause:
    """One detected pause of the monitor: when it ended (raw clock) and how long it was."""

    resumed_at: float
    length_s: float


class MonitorClock:
    """Monotonic seconds with the monitor's own pauses taken out (see module doc).

    Args:
        raw: The underlying clock (``time.monotonic``; tests inject one).
        pause_s: A gap between two reads beyond this is a pause.
        keep_s: Of a detected pause this much stays in the clock (one tick's worth: the loop
            would have read the clock that much later anyway).
    """

    def __init__(self, raw: Callable[[], float] = time.monotonic, pause_s: float = PAUSE_S,
                 keep_s: float = TICK_S) -> None:
        self._raw = raw
        self.pause_s = pause_s
        self.keep_s = keep_s
        self._last = raw()
        self._offset = 0.0
        #: Every pause detected so far (the latest last), for notices and tests.
        self.pauses: list[Pause] = []

    def now(self) -> float:
        """The monitor time now (pauses excluded)."""
        raw = self._raw()
        gap = raw - self._last
        if gap > self.pause_s:
            self._offset += gap - self.keep_s
            self.pauses.append(Pause(raw, gap))
        self._last = max(self._last, raw)
        return raw - self._offset

    @property
    def paused_s(self) -> float:
        """Seconds taken out of the clock so far."""
        return self._offset


def tick_at(t0: float, k: int, period: float = TICK_S) -> float:
    """The instant of tick ``k`` of a schedule that started at ``t0`` (a product, not a running
    sum, so a live schedule and its replay from 0 land on the same instants)."""
    return t0 + k * period
