"""Immutable views of the model's ranks, rebuilt only when something they show changed. No Textual.

A snapshot of 1,024 ranks rebuilt every rank's view (its history, kernel rows, FLOP view) twice
a second. A view holds no ages — it says when the rank was heard from (``heard_at``) and the
snapshot says when it was taken — so a rank that received nothing since the last snapshot and
whose clock-driven state (status, and whether it is stalled: its view holds since when) reads
the same keeps the very same :class:`RankSnapshot` object: the UI can skip it by identity, and the
snapshot costs nothing for it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from flowtop.monitor import accounting
from flowtop.monitor import rankstate as rs
from flowtop.monitor.rankstate import RankState
from flowtop.monitor.records import Fields
from flowtop.monitor.snapshot import Claimant, History, RankSnapshot, TelemetryView
from probe.wire import RankKey

if TYPE_CHECKING:
    from flowtop.monitor.kernels.merge import CumulativeTable

_VIEW = Fields(RankSnapshot)  # a light copy's source
_STEP, _HEARD, _BEHIND, _HISTORY, _TELEMETRY, _FLOPS, _HELLO_AT = _VIEW.at(
    "step", "heard_at", "behind_s", "history", "telemetry", "flops", "hello_step_at")


def as_now(view: RankSnapshot, st: RankState, stepped: bool) -> RankSnapshot:
    """``view`` with the rank's telemetry, and its history too when it ``stepped``, as they are in
    ``st`` now: positional into the constructor, as :meth:`RankViews._copy` (dataclasses.replace
    took 30 ms of a 4,096-rank evaluation's 76 ms for it)."""
    values = list(_VIEW.read(view))
    if stepped:
        values[_HISTORY] = rs.history(st)
    values[_TELEMETRY] = rs.telemetry_view(st)
    return RankSnapshot(*values)


def with_now(view: RankSnapshot, history: History, telemetry: TelemetryView | None) -> RankSnapshot:
    """``view`` with a history and telemetry :func:`as_now` took of its rank before (its state's
    version the same since), positionally."""
    values = list(_VIEW.read(view))
    values[_HISTORY], values[_TELEMETRY] = history, telemetry
    return RankSnapshot(*values)


#: How far a relay's lag may move before a rank's view is copied with the new one. A view's age
#: (RankSnapshot.age_s: the hints' stall, the "heard N s ago", the exporter's seen metric) takes
#: its lag off: a view kept from before a backlog grew would read the backlog as silence. Within
#: a second an age is close enough: it is read against limits of 5 s (stale, taken from the lag
#: itself, not the view) and 30 s (hang), and a paced rank's own age runs up to its pace (2 s)
#: between two frames. At 0.25 s, 512 relays' lags jittering by 0-0.5 s between two ticks
#: (4,096 ranks, bench/ingest.py) copied half the views at every tick: 2,700 copies a tick where
#: ~1,000 ranks had sent a frame.
LAG_STEP_S = 1.0


def _stalled_since(st: RankState, behind: float) -> float | None:
    """FlopsView.stalled_since of a stalled rank: its last step, on the snapshot's clock (its
    relay's lag ``behind`` added: it was judged as of that much earlier)."""
    at = rs.last_step_at(st)
    return at + behind if at is not None else None


def _lag_moved(view: RankSnapshot, behind: float) -> bool:
    return abs(view.behind_s - behind) > LAG_STEP_S


@dataclass(slots=True)  # no __dict__: one a rank (~50 bytes fewer each)
class _Entry:
    version: int  # RankState.version the view was built from
    med: float | None  # the median step time of that version (costs a sort to recompute)
    key: tuple[Any, ...]  # everything the view depends on
    view: RankSnapshot
    #: A light look at RankState.version ``seen`` found the view current, and it stays so until
    #: monitor time ``until`` unless a frame arrives (rankstate.steady_until): later looks are free.
    seen: int = -1
    until: float = -math.inf


class RankViews:
    """The latest view of each rank, and the rule for reusing it (see module doc)."""

    def __init__(self, peak_override_flops: float | None = None) -> None:
        self.peak_override_flops = peak_override_flops
        self._entries: dict[RankKey, _Entry] = {}
        #: Views built, reused, and refreshed in their step and liveness only, since the start
        #: (the bench reads them).
        self.built = 0
        self.reused = 0
        self.refreshed = 0

    def view(self, st: RankState, now: float, others: tuple[RankKey, ...] = (), full: bool = True,
             glance: bool = False, behind: float = 0.0, shown_only: bool = False) -> RankSnapshot:
        """The view of ``st`` at monitor time ``now`` (``others``: processes claiming its rank;
        ``behind``: its relay's queueing lag, already taken off ``now``, which the view records).

        ``full=False`` (a rank of a job too large to rebuild every view at every tick, see
        flowtop.monitor.rotation.RANKS_PER_TICK): only its step, when it was heard and its status are
        brought up to date; its figures stay those of its last full view, a few ticks old.
        ``glance`` (between two ticks): only its step and when it was heard; a rank whose status
        changed keeps its last view until the tick, so statuses change with the hints, at ticks.
        ``shown_only`` (a rank of such a job): its history holds only what the UI shows
        (rankstate.history); a light view keeps the history of the full view it came from (a job
        that stops being large has whole histories from its ranks' next full views)."""
        entry = self._entries.get(st.key)
        if (glance or not full) and entry is not None:
            light = self._light(st, now, others, entry, behind)
            if light is not None:
                return light
            if glance:
                return entry.view
        med = entry.med if entry is not None and entry.version == st.version else rs.median_step(st)
        judged = rs.liveness(st, now, med)
        stalled, status = judged.stalled, judged.status
        # A stalled rank's FLOP view holds since when (FlopsView.stalled_since), not for how
        # long: it stays the same object while the rank stays stalled (a silent job's, 600 s).
        key = (st.version, status, stalled is not None, others, shown_only)
        if entry is not None and entry.key == key:
            if _lag_moved(entry.view, behind):
                self._copy(st, entry, behind)
            else:
                self.reused += 1
        else:
            entry = self._entries[st.key] = _Entry(st.version, med, key,
                                                   self._build(st, med, stalled, status, others, behind,
                                                               shown_only))
            self.built += 1
        entry.seen, entry.until = st.version, judged.until
        return entry.view

    def views(self, shown: Iterable[tuple[RankState, tuple[RankKey, ...]]], now: float,
              lag: Callable[[str | None], float], turn: tuple[int, int] | None = None, glance: bool = False,
              shown_only: bool = False, hot: frozenset[int] = frozenset()) -> tuple[RankSnapshot, ...]:
        """The views of a job's ``shown`` ranks (each with the processes claiming its rank) at
        monitor time ``now``, each as of its relay's ``lag`` (taken off ``now``): :meth:`view` of
        each, ``full`` where ``turn`` (tick, spread) says it is the rank's turn (None: every rank's),
        none with ``glance``; the ranks numbered in ``hot`` (those the job's hints name) at every
        tick, so that their rows agree with the hints about them. One call a tick: the ranks that
        kept their view since the last look (nothing arrived, the clock has not moved their status,
        their relay's lag has not moved by more than LAG_STEP_S) are found here, with no call per
        rank — at 4,096 ranks and a 2 s pace three quarters of them (~0.25 µs each here, ~5 µs
        each through :meth:`view`)."""
        entries, view = self._entries, self.view
        out: list[RankSnapshot] = []
        append = out.append
        tick, spread = turn if turn is not None else (0, 0)
        reused = 0
        lags: dict[str | None, float] = {}  # a node's ranks share their relay: one lookup each
        every = not glance and spread == 0  # every rank's turn (the loop's tests, once)
        low, high = -LAG_STEP_S, LAG_STEP_S
        for st, others in shown:
            via = st.via
            behind = lags.get(via)
            if behind is None:
                behind = lags[via] = lag(via)
            at = now - behind
            key = st.key
            full = every or (not glance and ((key.rank + tick) % spread == 0 or key.rank in hot))
            entry = entries.get(key) if not full else None
            if (entry is not None and st.version == entry.seen and at < entry.until and others == entry.key[3]
                    and low <= entry.view.behind_s - behind <= high):  # not _lag_moved
                reused += 1  # nothing arrived, and the clock has not moved its status yet
                append(entry.view)
                continue
            if entry is not None and not glance:
                # Between its turns a rank that stepped gets a light copy (what view() would make
                # of it, without that call and its second lookup of the entry: most of a large
                # job's ranks at every tick); a rank whose status moved is rebuilt in full there.
                light = self._light(st, at, others, entry, behind)
                append(light if light is not None else
                       view(st, at, others, full=True, behind=behind, shown_only=shown_only))
            else:
                append(view(st, at, others, full=full, glance=glance, behind=behind, shown_only=shown_only))
        self.reused += reused
        return tuple(out)

    def _light(self, st: RankState, now: float, others: tuple[RankKey, ...], entry: _Entry,
               behind: float = 0.0) -> RankSnapshot | None:
        """The last full view with this instant's step and liveness, or None when more changed
        (its status, a stall starting or ending, the processes claiming its rank): then it is
        rebuilt in full. A rank stalled at its last full view stays a light copy until its turn
        (since when it stalled brought up to date, :meth:`_copy`): a hung job of thousands of
        ranks (or a backlog that makes them all look stalled) costs a tick no more than a
        healthy one."""
        old = entry.view
        moved = _lag_moved(old, behind)
        judged = rs.liveness(st, now, entry.med)
        if (judged.stalled is not None) != entry.key[2] or judged.status != old.status or others != entry.key[3] \
                or st.via != old.relay:
            return None
        entry.seen, entry.until = st.version, judged.until
        if old.step == st.step and old.heard_at == st.last_recv and not moved:
            self.reused += 1
            return old
        return self._copy(st, entry, behind)

    def _copy(self, st: RankState, entry: _Entry, behind: float) -> RankSnapshot:
        """The entry's view with its step, heard time and lag brought up to date: the values in
        one C call, positional into the constructor (replace() builds keyword arguments; views
        hold their fields in slots). The entry's other fields still hold."""
        values = list(_VIEW.read(entry.view))
        values[_STEP], values[_HEARD], values[_BEHIND] = st.step, st.last_recv, behind
        values[_HELLO_AT] = rs.hello_step_at(st)  # with its step: the hang rules read them together
        flops = entry.view.flops
        since = _stalled_since(st, behind) if flops is not None and flops.stalled_since is not None else None
        if flops is not None and since is not None and since != flops.stalled_since:  # its step or lag moved
            values[_FLOPS] = accounting.restalled(flops, since)
        view = entry.view = RankSnapshot(*values)
        self.refreshed += 1
        return view

    def forget(self, key: RankKey) -> None:
        """Drop the views of a rank the model forgot."""
        self._entries.pop(key, None)

    def _kernel_rows(self, st: RankState) -> CumulativeTable | None:
        """The rank's cumulative kernel table: immutable, the same object until its next window
        (no copy, and no cache of one a rank beside it)."""
        table = st.kernels_cumulative
        return None if table is None else table.rows()

    def _build(self, st: RankState, med: float | None, stalled: float | None, status: str,
               others: tuple[RankKey, ...], behind: float = 0.0, shown_only: bool = False) -> RankSnapshot:
        ring = st.steps
        tokens_per_s = rs.tokens_per_s(st, med, stalled)
        # input wait ÷ step time of the last 32 steps that sent one (bit 0 of the known flags)
        waits = [w / t for w, t, k in zip(ring.values(ring.WAIT, 32), ring.values(ring.WALL, 32),
                                          ring.values(ring.KNOWN, 32)) if k & 1 and t > 0]
        overhead = statistics.median(st.probe_s) / med if st.probe_s and med else None
        hello = st.hello
        return RankSnapshot(
            rank=st.key.rank,
            host=st.key.host,
            pid=st.key.pid,
            local_rank=hello.local_rank,
            incarnation=st.key.inc,
            device=hello.device,
            status=status,
            step=st.step,
            step_time_s=med,
            device_time_s=st.device_s,
            tokens_per_step=(ring.last().tokens or None) if ring else None,  # 0 sent: not known
            tokens_per_s=tokens_per_s,
            input_wait_frac=statistics.median(waits) if waits else None,
            heard_at=st.last_recv,
            lost_messages=st.lost,
            dropped_messages=st.drops,
            probe_overhead_frac=overhead,
            flops=accounting.rank_flops(st.flops, med, self.peak_override_flops, tokens_per_s,
                                        _stalled_since(st, behind) if stalled is not None else None),
            telemetry=rs.telemetry_view(st),
            kernels=st.kernels,
            kernels_cumulative=self._kernel_rows(st),
            history=rs.history(st, shown_only),
            bye_reason=st.bye,
            ended_at=st.ended_at,
            first_seen=st.first_seen,
            relay=st.via,
            commands_refused=st.commands_refused,
            commands_dropped=st.commands_dropped,
            conflict=tuple(Claimant(k.host, k.pid) for k in others),
            coords=hello.coords,
            coords_source=hello.coords_source,
            pp_stages=hello.pp_stages,
            stage_time_s=statistics.median(st.stage_s) if st.stage_s else None,
            behind_s=behind,
            hello_step_at=rs.hello_step_at(st),
        )
