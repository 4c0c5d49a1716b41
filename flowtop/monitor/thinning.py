"""How thinly a monitor short of time spreads a large job's tick work. No Textual.

A tick rebuilds the full views of RANKS_PER_TICK ranks of a large job and measures its rules once
a round (flowtop.monitor.model): at 4,096 ranks ~250 ms of CPU every 0.5 s on a 2-core box, half a
core before a single frame is read. Pacing (flowtop.monitor.pacing) cannot lower that. When the
data thread is busy past pacing.BUSY_HIGH and its ticks take :data:`TICKS_MATTER` or more of it
(:data:`TICKS_MATTER_CPU` or more when it takes more CPU than the monitor allows itself,
pacing.DATA_CPU),
the collector raises :attr:`Model.spread` at once to where the ticks would take :data:`TICKS_AIM`
(at spread 2 a tick rebuilds half as many ranks, and a round of hints takes twice as many ticks),
up to the largest of model.SPREADS; it halves it again
whenever the ticks' share doubled would still keep the thread under both. A rank's figures
and the job's hints then refresh every 8 s instead of 4 s at 4,096 ranks, but frames are read
before they queue up and drop. Kernel windows (~14 ms of decoding and building each, 80 KB, in the
monitor's builder process) are then admitted at 1/spread of the monitor's byte rate
(flowtop.monitor.limits.KernelBudget).

A replay must spread its ticks where the live monitor did, or its hints would differ: each change
is written into the recording as a record of its own (:func:`spread_record`), which the replay
applies at the same instant (flowtop.monitor.recording.feed). A reader that does not know it
rejects it as a bad frame, counted, and replays the rest. A received frame with the same bytes
(forged by a peer) is recorded altered (:func:`recorded`): refused live, it is refused in a replay
too instead of changing it.
"""

from __future__ import annotations

import msgpack

from flowtop.monitor.clock import TICK_S
from flowtop.monitor.rotation import SPREADS, ranks_per_tick, ticks_per_round
from flowtop.monitor.pacing import DATA_CPU, Busy, cpu_budget_of, over_budget_text
from flowtop.monitor.relayrecord import disarmed, relayed_of

#: The least share of the data thread's time ticks must take for a thinner spread to help.
TICKS_MATTER = 0.25
#: The same when the thread takes more CPU than its budget (pacing.DATA_CPU): its ranks are then
#: paced to the wire's cap before long, and its ticks are what is left to thin (4,096 ranks on 2
#: cores: 16 % of the wall time at spread 4 and 0.55 of a core; 0.44 at spread 8).
TICKS_MATTER_CPU = 0.1
#: Halving the spread back must keep the thread's CPU under this share of its budget (the
#: pacer's margin is pacing.CPU_ROOM): a tick's cost is more than its ranks' (a fixed part), so
#: the estimate is low, and at 1,024 ranks on 2 cores, at the budget's edge, a margin of 0.9 went
#: 1 -> 2 -> 4 -> 2 -> 1 in 28 s, each change told to the user.
SPREAD_ROOM = 0.8
#: The share of it a thinner spread aims the ticks at.
TICKS_AIM = 0.2
#: The "k" of a spread record in a recording (not a wire kind: probes never send it).
SPREAD_KIND = "flowtop.spread"


def next_spread(spread: int, busy: Busy | None, largest: int, cpu_budget: float | None = None) -> int:
    """The spread after a renewal at which the data thread was ``busy`` (None: not measured,
    it holds), ``largest`` being the ranks of the largest job (a spread that changes nothing for
    it is not taken); ``cpu_budget``: the cores the thread may take (pacing.DATA_CPU; None: its
    wall share alone decides)."""
    if busy is None or largest <= 0:  # no job: nothing a spread could change
        return spread
    i = SPREADS.index(spread)
    matter = TICKS_MATTER_CPU if busy.over_cpu(cpu_budget) else TICKS_MATTER
    if busy.over(cpu_budget) and busy.ticks >= matter and i + 1 < len(SPREADS):
        # At once to the spread at which the ticks would take TICKS_AIM, as if a tick cost what the
        # ranks it rebuilds do (it costs more: a fixed part stays; the next round thins further if
        # need be); the least spread that gives the largest job as many ticks a round. Past the
        # CPU budget, not as far as the ticks alone would bring the CPU under it: the pacer cuts
        # the frames at the same renewals, and the two together overshot (1 -> 4, then back to 2).
        def rebuilt(s: int) -> int:
            return min(largest, ranks_per_tick(s))

        fits = [s for s in SPREADS[i + 1:] if busy.ticks * rebuilt(s) / rebuilt(spread) <= TICKS_AIM]
        want = ticks_per_round(largest, fits[0] if fits else SPREADS[-1])
        if want <= ticks_per_round(largest, spread):
            return spread
        return next(s for s in SPREADS[i + 1:] if ticks_per_round(largest, s) == want)
    if i > 0 and busy.room(busy.ticks, 2.0, cpu_budget, SPREAD_ROOM):  # half the spread: twice the ticks' work
        return SPREADS[i - 1]
    return spread


class Thinner:
    """When to change the model's spread (the collector calls :meth:`due` at each pace renewal).

    A decision reads the data thread's load over a whole round of the largest job at the spread in
    force (the renewals' readings summed until then): a round's rules run at a few of its ticks
    only, and a 2 s reading without them would show room that is not there and flap between two
    spreads, a share of the rules left unmeasured at each flap.

    Args:
        cpu_budget: Cores the data thread may take (pacing.DATA_CPU; None: its wall share alone).
    """

    def __init__(self, cpu_budget: float | None = DATA_CPU) -> None:
        self.cpu_budget = cpu_budget_of(cpu_budget)
        self._frames = self._ticks = self._span = 0.0  # seconds summed since the last decision
        self._cpu = self._cpu_span = 0.0  # CPU seconds, and the wall seconds of the readings that had one

    def due(self, spread: int, busy: Busy | None, largest: int) -> int:
        """The spread to use from now on (``spread`` when nothing changes)."""
        if busy is None:
            return spread
        self._frames += busy.frames * busy.span_s
        self._ticks += busy.ticks * busy.span_s
        self._span += busy.span_s
        if busy.cpu is not None:
            self._cpu += busy.cpu * busy.span_s
            self._cpu_span += busy.span_s
        if self._span < ticks_per_round(largest, spread) * TICK_S:
            return spread
        cpu = self._cpu / self._cpu_span if self._cpu_span > 0 else None
        whole = Busy(self._frames / self._span, self._ticks / self._span, self._span, cpu=cpu)
        self._frames = self._ticks = self._span = self._cpu = self._cpu_span = 0.0
        return next_spread(spread, whole, largest, self.cpu_budget)


def spread_notice(spread: int, busy: Busy | None, largest: int, cpu_budget: float | None = None) -> str:
    """What the user is told when the spread changes (``cpu_budget``: the data thread's, named
    when it was passed)."""
    per_tick = ranks_per_tick(spread)
    every = ticks_per_round(largest, spread) * TICK_S
    what = (f"a tick rebuilds the figures of {per_tick} ranks of a large job: a {largest}-rank job's "
            f"every {every:g} s, its hints as often")
    if spread == 1:
        return f"{what} (the monitor keeps up again)"
    took = f"its ticks took {busy.ticks:.0%} of its data thread" if busy is not None else "it is short of time"
    if busy is not None and (over := over_budget_text(busy, cpu_budget)):
        took += f", which {over}"
    return f"{what} ({took}: frames come first)"


def spread_record(spread: int) -> bytes:
    """The recording's record of a spread change (see the module doc)."""
    return msgpack.packb({"k": SPREAD_KIND, "spread": spread})


_RECORDS = {spread_record(s): s for s in SPREADS}
_LENGTHS = frozenset(len(r) for r in _RECORDS)


def recorded(frame: bytes) -> bytes:
    """A received frame as the recording keeps it: as it came, unless it has the bytes of a spread
    record or reads as a relay batch's record (flowtop.monitor.relayrecord: a peer forging one to
    change what a replay shows): then a copy that a replay refuses as the live monitor refused the
    original, with the same reason."""
    if relayed_of(frame) is not None:
        return disarmed(frame)
    if spread_of(frame) is None:
        return frame
    return msgpack.packb({**msgpack.unpackb(frame), "received": True})


def spread_of(frame: bytes) -> int | None:
    """The spread a recorded frame sets, or None for any other frame (checked by length first:
    a replay asks it of every frame, some of them megabytes)."""
    return _RECORDS.get(frame) if len(frame) in _LENGTHS else None
