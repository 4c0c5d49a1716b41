"""An ended or silent job's snapshot, reused from tick to tick while nothing of it changes. No Textual.

A job whose every rank said bye (status ``done`` or ``failed``) is kept for EVICT_AFTER_S so the
user sees how it ended. Every tick rebuilt its snapshot all the same: each rank's view looked up,
the job's FLOP sums, percentiles and kernel merge, its hints (a soak trial: 15 ended jobs of 64
ranks cost 5.7 ms a tick; two of 4,096 ranks ~200 ms here, ``bench/ended_idle.py``). Yet nothing in
it reads the clock: a view holds when its rank was heard (``heard_at``), not an age (the UI
takes ages from the snapshot's ``taken_at``); a rank that said bye is done whenever it is looked
at, never stalled or stale, and no silent relay marks it; a job none of whose ranks steps has no
"no step for N s" once all of them ended; and an ended job's hints are its ended ones, measured
no more (HintEngine.evaluate). So its :class:`JobSnapshot` is kept, hints included, and served
as it is while all of these hold:

* the same rank processes are shown, each with the same claimants (the model's rows for the job:
  the very same list while no rank key came or went, else compared process by process);
* no rank's ``RankState.version`` moved (a frame of any kind, a kernel table, a bye: a late
  frame of a rank that said bye, or a restart's new process, rebuilds the snapshot at once);
* the ticks a round of the job takes are the same (the spread: a large job's views hold only what
  the UI shows);
* each relay's lag is within LAG_STEP_S of the lag every view behind it recorded (where
  RankViews would copy a view with the new one), and what cuts its running ranks off (a silent
  or closed relay: a RelayCut, since when) is what its views hold;
* the job's hints are the ones it was kept with (nothing evaluated them since).

A check is one pass over the job's ranks' versions in C (~20 ns a rank) and one lag per relay;
the job's rank views, figures and hints are not looked at. A live job's tick does no more than
before.

A *silent* job (every rank stale: a crash, a kill, a lost node, no bye) is kept too, for its 600 s:
nothing of its snapshot reads the clock either once every rank is stale — a stalled rank's view
and the job's figures hold since when they stalled (FlopsView.stalled_since), its hang hints
since when their stall counts (flowtop.monitor.hintclock), all said at display. Its hang rules
still measure it at every tick (their hysteresis advances as before); while they give the same
hint records the job's hints are the same, and so is its snapshot (flowtop.monitor.model_tick).
A rank stale behind a silent relay reads "relay HOST silent for N s": its view holds since when
the relay is silent (flowtop.monitor.relayviews.RelayCut), said at display too, so such a job is
kept as well. One kept is served no more once a relay of its ranks cuts them off, is heard again,
or closes (the record differs: a rebuild marks the views anew).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Callable, Sequence

from flowtop.monitor.rankstate import RankState
from flowtop.monitor.rankviews import LAG_STEP_S
from flowtop.monitor.relayviews import RelayCut
from flowtop.monitor.snapshot import ENDED, Hint, JobSnapshot
from probe.wire import RankKey

Row = tuple[RankState, tuple[RankKey, ...]]  # a shown process and the others claiming its rank
#: Statuses of a job whose snapshot is kept: ended, or silent (every rank stale).
KEPT = ENDED | {"stale"}
_VERSION = attrgetter("version")


@dataclass(frozen=True, slots=True)
class _Relayed:
    """What a kept job's views recorded of one relay (None: its ranks heard directly)."""

    via: str | None
    low: float  # the lowest lag its views recorded
    high: float  # the highest
    #: Whether a view behind it is of a running rank (no bye): only such a view is marked cut off.
    running: bool
    cut: RelayCut | None  # what cut those running ranks off then (None: nothing)


@dataclass(frozen=True, slots=True)
class _Held:
    rows: Sequence[Row]  # the model's rows it was built from (shared, never changed)
    states: tuple[RankState, ...]
    others: tuple[tuple[RankKey, ...], ...]
    versions: list[int]  # each state's version then
    rounds: int  # ticks a round of the job took then
    relays: tuple[_Relayed, ...]  # per relay its views came through
    snap: JobSnapshot


class EndedJobs:
    """The kept snapshots of ended jobs (see module doc)."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        #: Snapshots served from here, since the start (tests and benches read it).
        self.served = 0

    def __len__(self) -> int:
        return len(self._held)

    def take(self, job: str, rows: Sequence[Row], rounds: int, hints: tuple[Hint, ...],
             lag_of: Callable[[str | None], float],
             cut_of: Callable[[str | None], RelayCut | None] = lambda via: None) -> JobSnapshot | None:
        """The kept snapshot of ``job`` when it still holds for its ``rows`` now (a round of
        ``rounds`` ticks, the job's current ``hints``, each relay's lag by ``lag_of`` and what
        cuts its ranks off by ``cut_of``), else None. A pure read: a snapshot between ticks may
        take it too."""
        held = self._held.get(job)
        if held is None or held.rounds != rounds:
            return None
        if hints is not held.snap.hints and hints != held.snap.hints:
            return None
        if rows is not held.rows:  # rebuilt rows (a key came or went, or claims are remembered)
            if len(rows) != len(held.states) or any(
                    st is not kept or others != kept_others
                    for (st, others), kept, kept_others in zip(rows, held.states, held.others)):
                return None
        if list(map(_VERSION, held.states)) != held.versions:
            return None
        for relay in held.relays:
            lag = lag_of(relay.via)
            if lag < relay.high - LAG_STEP_S or lag > relay.low + LAG_STEP_S:
                return None
            if relay.running and cut_of(relay.via) != relay.cut:
                return None  # its relay fell silent, was heard again or closed: marked anew
        self.served += 1
        return held.snap

    def keep(self, job: str, rows: Sequence[Row], rounds: int, snap: JobSnapshot) -> None:
        """Keep ``snap`` (an ended job's, its hints final; or a silent one's, its hints of this
        tick) built from ``rows`` now, at a round of ``rounds`` ticks. Once per ended job (and
        again after something of it changed); a silent job's whenever its hints changed."""
        if snap.status not in KEPT:
            raise ValueError(f"only an ended or silent job's snapshot is kept, not one {snap.status!r}")
        states = tuple(st for st, _ in rows)
        relays: dict[str | None, _Relayed] = {}
        for view, st in zip(snap.ranks, states, strict=True):
            was = relays.get(st.via)
            running = st.bye is None  # a rank that said bye is never marked cut off (Relays.mark)
            if was is None:
                relays[st.via] = _Relayed(st.via, view.behind_s, view.behind_s, running, view.cut)
            else:  # the views of one relay's running ranks hold the same cut (one tick's)
                relays[st.via] = _Relayed(st.via, min(was.low, view.behind_s), max(was.high, view.behind_s),
                                          was.running or running, view.cut if running else was.cut)
        self._held[job] = _Held(rows, states, tuple(others for _, others in rows), list(map(_VERSION, states)),
                                rounds, tuple(relays.values()), snap)

    def forget(self, job: str) -> None:
        """Drop what is kept of ``job`` (it runs again, or the model forgot it)."""
        self._held.pop(job, None)
