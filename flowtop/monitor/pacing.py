"""How often the monitor asks its ranks to send their step records. No Textual.

A rank sends its step records every FLOWTOP_FLUSH_S (0.1 s): ten frames a second whatever its
step rate. A step frame costs the data thread ~10-15 µs to check and apply (bench/ingest.py
--costs), so 4,096 ranks at ten frames a second would take half a core or more on frames alone.
Past :data:`STEP_FRAMES_PER_S` ranks-times-ten, the monitor asks every rank (a "pace" command,
broadcast on the data connection and carried down by relays) to hold its records longer, so that
all of them together send about that many step frames a second. The probe never goes faster than
its own FLOWTOP_FLUSH_S, and a pace lapses after wire.PACE_TTL_S unless renewed: a monitor that
restarts, or hears fewer ranks, gets the ranks' own pace back within seconds.

That budget is a guess about the machine. A monitor whose data thread cannot keep up (a slow or
shared login node, a flood of kernel windows, ticks of thousands of ranks) lowers it: between two
renewals the drain loop measures the share of wall time its data thread spent on frames and on
ticks (:class:`BusyMeter`), and past :data:`BUSY_HIGH`, frames being part of it, the budget
shrinks by :data:`SLOWER`, or by as much as the frames' share says when it is far past
(:func:`cut_for`); it grows back by :data:`FASTER`, up to STEP_FRAMES_PER_S, whenever the
frames' share grown as much would still keep the thread under BUSY_HIGH (:func:`next_scale`). The
same holds for the thread's CPU: past :data:`DATA_CPU` cores (half a core unless configured) the
budget shrinks too, and grows back only while the CPU stays under :data:`CPU_ROOM` of it — a
monitor is a guest on a shared login node, and on a crowded one its wall share says little about
what it takes.
Frames the monitor cannot take would otherwise queue (seconds of latency) and then be dropped by
the senders; held in the probes they arrive late but whole. Only the pace depends on the load,
never what a tick does: a replay still reproduces the live hints.

What it costs: a step reaches the monitor up to the pace later (0.41 s at 4,096 ranks instead of
0.1 s); counts, kernel windows and byes still go at once; no record is lost. A paced probe samples
its telemetry less often by the same factor, to at most every :data:`PACED_TELEMETRY_S` (the
pace command says so; a probe paced without it stretches to 5 s)
(probe.wire.pace.paced_interval).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from flowtop import settings
# The wire's (probe.wire.pace): the flush interval to ask of N live ranks (pace_for), the step
# frames a second the monitor takes before it paces them (STEP_FRAMES_PER_S) and the probes'
# default flush interval (DEFAULT_FLUSH_S): probes that know their job's size start there.
from probe.wire.pace import DEFAULT_FLUSH_S as DEFAULT_FLUSH_S
from probe.wire.pace import STEP_FRAMES_PER_S, pace_for

#: The longest interval the monitor lets a paced probe sample its telemetry at (the pace command's
#: telemetry_max_s; its hints read a sample as stale after FRESH_TELEMETRY_S, which allows for
#: it). At 4,096 ranks and the 2 s pace a rank's figures are rebuilt every 4-32 s (spread ticks):
#: a sample every 5 s (the probes' own limit) was a fifth of the frames the monitor read.
PACED_TELEMETRY_S = 10.0
#: The least share of STEP_FRAMES_PER_S the budget shrinks to under load (a pace is at most
#: wire.MAX_PACE_S anyway: 2 s, 2,048 frames a second at 4,096 ranks).
MIN_SCALE = 0.025
#: The data thread's busy share above which the budget shrinks (and which growing it back must
#: keep to).
BUSY_HIGH = 0.7
#: Cores of CPU the data thread may take (its CPU seconds per wall second) before the monitor
#: paces its ranks and spreads its ticks, whatever wall time it has left: BUSY_HIGH says whether
#: the monitor keeps up, this what it takes from a login node it shares with everyone else. On a
#: busy box the wall share includes the time the thread waits for a core, and the two part ways
#: (4,096 ranks on 2 cores: 72-82 % busy at 0.54-0.56 of a core). FLOWTOP_DATA_CPU or
#: ``--data-cpu`` (flowtop.settings) changes it: a dedicated monitor host can give a whole core for
#: fresher figures.
DATA_CPU = settings.DATA_CPU.default
#: Growing back must keep the thread's CPU under this share of its budget: a cut at the budget
#: and a growth back up to it flapped on noise (a renewal's reading moves by a few hundredths of
#: a core; a pace moved every third renewal in a simulation of 4,096 ranks, none with this gap).
CPU_ROOM = 0.9


def cpu_budget_of(cores: float | None) -> float | None:
    """The CPU budget in force for ``cores`` (configured, or None): none from a core up, since one
    thread cannot take more (keeping up alone decides; a budget of 1 would still hold back growth
    once the thread took 0.9)."""
    return cores if cores is not None and cores < 1.0 else None


def over_budget_text(busy: Busy, cpu_budget: float | None) -> str:
    """The notices' words for a thread past its CPU budget ("" when it is not)."""
    if not busy.over_cpu(cpu_budget) or busy.cpu is None:
        return ""
    return (f"took {busy.cpu:.2f} of a core (it may take {cpu_budget:g}: --data-cpu or "
            f"{settings.DATA_CPU.name})")
#: The least share of the thread's time frames must take for a cut of their budget to help.
FRAMES_MATTER = 0.1
#: Factors the budget is multiplied by at a renewal: when busy, and when there is room (it shrinks
#: faster than it grows back: a monitor that falls behind queues more every second). SLOWER is
#: the mildest cut: a thread far past its limits is cut by as much as its frames' share says
#: (:func:`cut_for`), down to MIN_CUT at once.
SLOWER = 0.6
FASTER = 1.5
MIN_CUT = 0.25
#: Seconds between two "pace" broadcasts while pacing (well inside wire.PACE_TTL_S).
RENEW_S = 2.0
#: Seconds its relays' latest batches waited in queues (the median relay's, flowtop.monitor.relays)
#: past which the monitor is behind: a thread that is behind reads 100 % busy at any input rate,
#: so its busy share no longer says by how much the ranks must slow down.
BEHIND_S = 1.0
#: While behind, the share of the step frames the monitor took in the last interval that it asks
#: of the ranks: the rest of its time drains the queue (a backlog of L seconds takes ~L seconds).
DRAIN_SHARE = 0.5


@dataclass(frozen=True)
class Busy:
    """How the data thread spent the wall time between two renewals, as shares of it (0..1): of
    the time it had, less what it gave the UI (BusyMeter.away)."""

    frames: float  # decoding and applying frames
    ticks: float  # ticks (views, hints, eviction)
    span_s: float  # the wall seconds measured
    step_frames_per_s: float = 0.0  # step frames taken in, a second (what the monitor got through)
    cpu: float | None = None  # the thread's CPU seconds per wall second, all of its work (None: not measured)

    @property
    def total(self) -> float:
        return min(1.0, self.frames + self.ticks)

    def over(self, cpu_budget: float | None) -> bool:
        """Whether the thread took more than the monitor allows itself: past BUSY_HIGH of the wall
        time, or past ``cpu_budget`` cores (None: no budget)."""
        return self.total > BUSY_HIGH or self.over_cpu(cpu_budget)

    def over_cpu(self, cpu_budget: float | None) -> bool:
        """Whether the thread took more than ``cpu_budget`` cores (None: no budget)."""
        return cpu_budget is not None and self.cpu is not None and self.cpu > cpu_budget

    def room(self, share: float, grow: float, cpu_budget: float | None, cpu_room: float = CPU_ROOM) -> bool:
        """Whether the thread would stay under both limits with the work whose wall share is
        ``share`` (its frames, or its ticks) grown ``grow`` times: under BUSY_HIGH, and under
        ``cpu_room`` of ``cpu_budget``. That work's part of the CPU is taken as its part of the
        busy wall time."""
        if self.total + share * (grow - 1.0) >= BUSY_HIGH:
            return False
        if cpu_budget is None or self.cpu is None:
            return True
        part = share / self.total if self.total > 0 else 0.0
        return self.cpu * (1.0 + part * (grow - 1.0)) < cpu_room * cpu_budget


def draining(busy: Busy | None, behind_s: float) -> bool:
    """Whether the budget follows what got through (its frames wait more than BEHIND_S in queues
    while its data thread is busy past BUSY_HIGH — a monitor with room is not what holds them: a
    congested link is — and it measured the step frames it took), not its busy share."""
    return (busy is not None and behind_s > BEHIND_S and busy.total > BUSY_HIGH
            and busy.step_frames_per_s > 0)


def next_scale(scale: float, busy: Busy | None, behind_s: float = 0.0, cpu_budget: float | None = None) -> float:
    """The budget's share of STEP_FRAMES_PER_S after a renewal at which the data thread was
    ``busy`` (None: not measured, the share holds) and its frames had waited ``behind_s`` in queues;
    ``cpu_budget``: the cores the thread may take (see DATA_CPU; None: its wall share alone).

    Behind by more than BEHIND_S, the budget becomes DRAIN_SHARE of the step frames it got through
    (if that is lower): one renewal finds the level the monitor keeps up with, from any overload,
    where cuts by a factor would take a renewal each while the queue grows.

    Shrunk when the thread was busy past BUSY_HIGH, or took more than ``cpu_budget`` cores, and
    frames are a real part of it (a thread busy with its ticks is not helped by fewer frames);
    grown back whenever the frames' cost grown by as much (it grows less: each record costs the
    same at any pace) still keeps it under both, so the fixed costs of a busy monitor do not keep
    its ranks slow for good after a spike."""
    if busy is None:
        return scale
    if draining(busy, behind_s):
        return max(MIN_SCALE, min(scale, DRAIN_SHARE * busy.step_frames_per_s / STEP_FRAMES_PER_S))
    if busy.over(cpu_budget) and busy.frames >= FRAMES_MATTER:
        return max(MIN_SCALE, scale * cut_for(busy, cpu_budget))
    if busy.room(busy.frames, FASTER, cpu_budget):
        return min(1.0, scale * FASTER)
    return scale


def cut_for(busy: Busy, cpu_budget: float | None) -> float:
    """The factor a busy thread's budget is cut by: its frames cut as much leave it, the rest of its
    work as it was, halfway between the line past which it is cut and the line under which the
    budget grows back (:func:`next_scale`) — BUSY_HIGH of the wall time against BUSY_HIGH less
    the frames' growth by FASTER; ``cpu_budget`` against CPU_ROOM of it — so that the next renewal
    does neither on a reading that moves by a few hundredths. At most SLOWER, at least MIN_CUT.

    With cuts of SLOWER each, and a renewal that only watches after each, a 4,096-rank job
    starting on a saturated 2-core box (bench/ingest.py) spent 8.9 s at 0.45 s and 4.6 s at 0.7 s,
    100 % busy and 60 % on frames, while its queue grew to 11 s: ``0.3 x 5/6 / 0.6`` says x 0.42
    at the first. Frames cost less than their number says (each record costs the same at any
    pace): a cut sized so falls short, and the next one goes on, where one sized past the need
    would slow every rank more than it must. A thread busier with its ticks than with its frames
    gives no size (the tick spread is what relieves it, flowtop.monitor.thinning): SLOWER."""
    if busy.frames <= 0.0 or busy.ticks >= busy.frames:
        return SLOWER
    factors = [SLOWER]
    if busy.total > BUSY_HIGH:
        # frames' share f after the cut: cut past t + f > BUSY_HIGH, grown back while t + FASTER f < BUSY_HIGH
        room = BUSY_HIGH - busy.ticks
        factors.append((room + room / FASTER) / 2 / busy.frames)
    if busy.over_cpu(cpu_budget) and busy.cpu and busy.total > 0:
        assert cpu_budget is not None  # over_cpu says so
        frames_cpu = busy.cpu * busy.frames / busy.total  # the frames' part of the CPU, as of the wall time
        aim = (1.0 + CPU_ROOM) / 2 * cpu_budget  # cut past cpu_budget, grown back under CPU_ROOM of it
        rest = busy.cpu - frames_cpu
        if rest < aim:
            factors.append((aim - rest) / frames_cpu)
    return max(MIN_CUT, min(factors))


class BusyMeter:
    """Where the data thread's wall time goes between two readings: the drain loop reports the
    seconds it spent on frames and on ticks (:meth:`add`) — their own work, and their waits for
    the interpreter or a core on a machine that is short of them; the rest it waited for frames.

    Args:
        clock: Wall clock (injectable for tests).
        cpu: The CPU clock of the thread that reads the meter (the data thread's own: its frames,
            ticks and everything else it runs); the first reading starts it, so a meter may be
            made on another thread.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 cpu: Callable[[], float] = time.thread_time) -> None:
        self._clock = clock
        self._cpu = cpu
        self._cpu_since: float | None = None
        self._since = clock()
        self._frames = self._ticks = self._away = 0.0
        #: Step frames taken in since the last reading (the collector counts them).
        self.steps = 0

    def add(self, frames_s: float, ticks_s: float) -> None:
        """Count seconds spent decoding and applying frames, and running ticks."""
        self._frames += frames_s
        self._ticks += ticks_s

    def away(self, seconds: float) -> None:
        """Leave ``seconds`` the thread gave to another (the UI's turn at the interpreter,
        flowtop.monitor.datathread.UiTurn) out of the wall time its busy shares are of: they say
        how much of the time it had it used (its CPU share stays per wall second)."""
        self._away += seconds

    def read(self) -> Busy | None:
        """The shares since the last reading (None over less than 0.1 s: the interval goes on),
        and start a new interval. The first reading has no CPU share (its clock starts there)."""
        now = self._clock()
        span = now - self._since
        if span < 0.1:
            return None
        used = self._cpu()
        cpu = None if self._cpu_since is None else max(0.0, used - self._cpu_since) / span
        had = max(span - self._away, 0.5 * span)  # (a clamp: the waits lie inside the interval)
        busy = Busy(min(1.0, self._frames / had), min(1.0, self._ticks / had), span, self.steps / span, cpu)
        self._since, self._frames, self._ticks, self.steps, self._cpu_since = now, 0.0, 0.0, 0, used
        self._away = 0.0
        return busy


class Pacer:
    """When to broadcast which pace (the collector calls :meth:`due` as its clock advances).

    Args:
        cpu_budget: Cores the data thread may take (DATA_CPU; None: its wall share alone decides).
    """

    def __init__(self, cpu_budget: float | None = DATA_CPU) -> None:
        self.cpu_budget = cpu_budget_of(cpu_budget)
        self.current: float | None = None  # the pace last asked for (None: not pacing)
        #: The share of STEP_FRAMES_PER_S asked of all ranks together (1 unless the monitor could
        #: not keep up, see next_scale).
        self.scale = 1.0
        #: The data thread's load at the last renewal (None before one was measured).
        self.busy: Busy | None = None
        self.behind_s = 0.0  # how long frames waited in queues at the last renewal
        self.live = 0  # live ranks at the last renewal (what ramp adds the ranks that joined since to)
        self._next = 0.0
        self._settle = False  # the last renewal changed the pace: the next one only watches

    def due(self, now: float, live_ranks: int, busy: Busy | None = None, behind_s: float = 0.0) -> float | None:
        """The pace to broadcast now, or None (not due, or nothing to ask). ``busy``: the data
        thread's load since the last renewal (see :class:`BusyMeter`); ``behind_s``: how long its
        frames now wait in queues."""
        if now < self._next:
            return None
        self._next = now + RENEW_S
        self.busy = busy
        self.behind_s = behind_s
        self.live = live_ranks
        scale = next_scale(self.scale, busy, behind_s, self.cpu_budget)
        if draining(busy, behind_s):  # measured on what got through: no queued frames to wait for
            self._settle = False
        before = pace_for(live_ranks, self.budget)
        after = pace_for(live_ranks, STEP_FRAMES_PER_S * scale)
        # A renewal after a change only watches: frames queued before the ranks heard the new pace
        # keep the thread busy meanwhile, and another cut would overshoot. A cut that changes
        # nothing (a pace at its cap, ranks too few to pace) is not banked either: growing back
        # would then take renewals that change nothing.
        if self._settle and scale < self.scale:
            self._settle = False
        elif scale >= self.scale or (after or 0.0) > (before or 0.0):
            self.scale = scale
            self._settle = after != before
        self.current = pace_for(live_ranks, self.budget)
        return self.current

    def ramp(self, joined: int) -> float | None:
        """A longer pace to broadcast now, between two renewals, because the live ranks of the last
        renewal and the ``joined`` ranks since need one at the budget in force; None when the
        pace asked already holds. A large job's ranks join over a second or
        two, and those that joined after a renewal sent at their own 0.1 s until the next: at
        4,096 ranks through relays a renewal that saw 1,032 of them left ~3,000 at ten frames a
        second for 2 s, a backlog of ~60,000 frames that took the monitor of a 2-core box a minute
        or more to drain (delivered 96-97 %, latency 13-18 s)."""
        pace = pace_for(self.live + joined, self.budget)
        if pace is None or (self.current is not None and pace <= self.current):
            return None
        self.current = pace
        return pace

    @property
    def budget(self) -> float:
        """Step frames a second asked of all ranks together now."""
        return STEP_FRAMES_PER_S * self.scale

    @property
    def load_bound(self) -> bool:
        """Whether the budget is below STEP_FRAMES_PER_S: the monitor could not keep up."""
        return self.scale < 1.0


#: Seconds between two notices of a pace that moved (or of the load starting or ceasing to set it):
#: a load-driven pace finds its level by moves of half or more (0.25 → 0.45 → 0.7 → 1.3 → 0.6 s
#: in a minute at 1,024 ranks), and a notice at each covered half of an 80×24 screen for the
#: whole run (a new user's trial). Pacing starting or stopping is told at once.
PACE_NOTICE_S = 60.0


def pace_news(told: float | None, told_load_bound: bool, told_at: float, pace: float | None,
              load_bound: bool, now: float) -> bool:
    """Whether the user is told of the pace now: when pacing starts or stops; when the monitor's
    load starts or stops setting it, or it moved by half or more, PACE_NOTICE_S after the last
    notice (the pace then told is the one in force, however it moved between)."""
    if (pace is None) != (told is None):
        return True
    changed = load_bound != told_load_bound or (
        pace is not None and told is not None and not told / 1.5 < pace < told * 1.5)
    return changed and now - told_at >= PACE_NOTICE_S


def pace_notice(live: int, pace: float | None, load_bound: bool, busy: Busy | None, behind_s: float = 0.0,
                cpu_budget: float | None = None) -> str:
    """What the user is told when the pace asked of ``live`` ranks changes (``load_bound``: the
    budget is below STEP_FRAMES_PER_S because the monitor could not keep up, or took more CPU
    than ``cpu_budget`` cores; ``behind_s``: how long its frames waited in queues)."""
    if pace is None:
        return f"{live} ranks talk: they send their steps at their own pace again"
    asked = (f"{live} ranks talk: each is asked to send its steps every {pace:.2f} s "
             f"(~{live / pace:,.0f} step frames a second")
    if not load_bound:
        return f"{asked}; the monitor takes ~{STEP_FRAMES_PER_S:,})"
    load = (f"; its data thread was busy {busy.total:.0%} of the last {busy.span_s:.0f} s, "
            f"{busy.frames:.0%} on frames") if busy is not None else ""
    if busy is not None and (over := over_budget_text(busy, cpu_budget)):
        load += f", and {over}"
    if draining(busy, behind_s) and busy is not None:  # the budget followed what got through
        load = (f"; it is {behind_s:.1f} s behind and took {busy.step_frames_per_s:,.0f} step frames a second: "
                f"asked for {DRAIN_SHARE:.0%} of that while the queue drains")
    return f"{asked}, as many as this monitor keeps up with{load})"
