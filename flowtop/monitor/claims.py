"""Which rank processes a job shows: one per rank number, unless several processes claim it.

The wire keys a rank by (job, host, pid, rank, incarnation). A job normally shows the newest
incarnation of each rank number (a restart replaces the row). But when the launcher sets no
``RANK`` and the probe cannot read the process group, every process of the job says "rank 0";
picking one of them would halve the job's tokens/s and FLOP/s and hide the others. So two or
more processes that claim the same (job, rank, incarnation) while running at the same time are
a *conflict*: each keeps a row of its own, and each row names the others. No Textual.

"Newest" is one rule wherever a rank number has several processes (the model's view and
eviction, the hints, the exporter, the screens): :func:`newest_per`, with each caller's grouping,
order and tie-break named below.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Callable, Generic, Hashable, Iterable, Mapping, Protocol, TypeVar

from flowtop.monitor.records import fast_init
from flowtop.monitor.snapshot import ENDED, RankSnapshot
from probe.wire import RankKey

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
S = TypeVar("S")

#: Per job, the rank processes a view shows in order, each with the others claiming its rank.
Rows = dict[str, list[tuple[S, tuple[RankKey, ...]]]]


def newest_per(items: Iterable[T], group: Callable[[T], K], newness: Callable[[T], Any],
               later_wins_ties: bool = False) -> dict[K, T]:
    """Of each group of ``items``, the one whose ``newness`` is largest; of equally new ones the
    first seen, or the last with ``later_wins_ties``. Groups in order of first appearance."""
    best: dict[K, T] = {}
    held: dict[K, Any] = {}
    for item in items:
        g = group(item)
        n = newness(item)
        if g not in best or n > held[g] or (later_wins_ties and n == held[g]):
            best[g] = item
            held[g] = n
    return best


#: A rank process's newness in a snapshot: its incarnation (a restart is newer), then when it
#: was last heard (two processes claiming one incarnation: a conflict).
rank_newness: Callable[[RankSnapshot], tuple[int, float]] = attrgetter("incarnation", "heard_at")


def newest_ranks(ranks: Iterable[RankSnapshot]) -> list[RankSnapshot]:
    """One view per rank number, sorted by rank: its highest incarnation, and of processes that
    claim the same one (a conflict) the last in the job's order (host, pid) — the hints' reading
    of a job, which counts each rank number once."""
    best = newest_per(ranks, attrgetter("rank"), attrgetter("incarnation"), later_wins_ties=True)
    return [best[k] for k in sorted(best)]


@fast_init  # one a rank process at each tick while some rank has two (a restart, until the old one goes)
@dataclass(frozen=True, slots=True)
class Seen:
    """What the view needs to know of one rank process at a snapshot."""

    key: RankKey
    running: bool  # neither said bye nor went stale
    stepped: bool  # made at least one step
    last_recv: float  # monitor time it was last heard from
    first_seen: float = -float("inf")  # monitor time it was first heard from


def _newest_seen(group: list[Seen]) -> Seen:
    """Of one rank number's processes, the newest incarnation, then the latest heard (the first of equals)."""
    best = group[0]
    for s in group[1:]:
        if (s.key.inc, s.last_recv) > (best.key.inc, best.last_recv):
            best = s
    return best


def superseded(seen: Iterable[Seen]) -> set[RankKey]:
    """The processes an earlier run of their job left: not heard since a running process of the
    job started — when they no longer run (ended, or stale: an elastic shrink's ranks, a crashed
    run's), or when that process claims their own rank number (a restart within the few seconds
    before the old one would read stale). Incarnations are no guide across launches: a job
    relaunched under the same id counts its restarts from 0 again, and the newest incarnation of
    the previous launch hid the live run for good (a soak trial: its job read failed, then stale
    with hang_all, while 128 ranks stepped)."""
    seen = list(seen)
    never = -float("inf")
    latest: dict[str, float] = {}  # job -> latest start of a running process
    # (job, rank) -> the latest start of its running processes: one started after a process
    # was last heard is what any of them would be (every rank of a job after a restart: a tick
    # compared its one start with itself, through a list each).
    newest: dict[tuple[str, int], float] = {}
    for s in seen:
        if s.running:
            key, start = s.key, s.first_seen
            if start > latest.get(key.job, never):
                latest[key.job] = start
            if start > newest.get((key.job, key.rank), never):
                newest[(key.job, key.rank)] = start
    # Ended or silent: a start at the very instant of its last frame follows it.
    out = {s.key for s in seen if not s.running and latest.get(s.key.job, never) >= s.last_recv}
    out.update([s.key for s in seen if s.running and newest.get((s.key.job, s.key.rank), never) > s.last_recv])
    return out


def is_history(r: RankSnapshot, claimed_at: Mapping[int, float]) -> bool:
    """Whether ``r`` is history: it no longer runs (ended, or silent) and was last heard at or
    before another process claiming its rank number was first seen (``claimed_at``:
    JobSnapshot.claimed_at; a start at the instant of its last frame follows it, as in
    :func:`superseded`). When each process was first seen, not its incarnation: torchrun counts
    restarts per node agent, so a node that crashes at incarnation 0 beside a restarted node at 1
    is the current run's problem, not history (the rank view's order by incarnation was reverted for it)."""
    at = claimed_at.get(r.rank)
    return (at is not None and r.first_seen is not None and r.first_seen < at and r.heard_at <= at
            and (r.status in ENDED or r.status == "stale"))


class Claims:
    """Remembers conflicts, so that rows stay apart after the processes end.

    A process joins a conflict when it runs at the same time as another process claiming its
    (job, rank, incarnation). It stays in it while it runs, and after it ended if it made a
    step: the final snapshot of a finished job must not merge the rows back into one. A process
    that ended without a step leaves it (a probe's provisional identity, replaced by the
    process group's rank before the first step, or a process that died at start-up)."""

    def __init__(self) -> None:
        #: (job, rank) -> (incarnation, keys of the processes in conflict)
        self._groups: dict[tuple[str, int], tuple[int, set[RankKey]]] = {}

    def shown(self, seen: Iterable[Seen], remember: bool = True) -> dict[RankKey, tuple[RankKey, ...]]:
        """The keys to show, each with the other keys claiming its rank (() when none).

        ``remember`` (a tick) updates the conflicts remembered; without it (a snapshot, a pure
        read) the answer is the same but nothing is kept."""
        seen = list(seen)
        gone = superseded(seen)
        if gone:
            seen = [s for s in seen if s.key not in gone]
        by_rank: dict[tuple[str, int], list[Seen]] = {}
        for s in seen:
            by_rank.setdefault((s.key.job, s.key.rank), []).append(s)
        out: dict[RankKey, tuple[RankKey, ...]] = {}
        remembered = self._groups
        for where, group in by_rank.items():
            if len(group) == 1 and where not in remembered:
                # Alone, and in no conflict remembered: shown, with no others (what _members
                # finds, without its call: every rank but a restarted one's, thousands a tick).
                out[group[0].key] = ()
                continue
            members = self._members(where, group, remember)
            if len(members) >= 2:
                keys = [s.key for s in members]
                for k in keys:
                    out[k] = tuple(o for o in keys if o != k)
            else:  # outside a conflict: the newest incarnation, then the latest heard; the first of equals
                out[_newest_seen(group).key] = ()
        return out

    def _members(self, where: tuple[str, int], group: list[Seen], remember: bool) -> list[Seen]:
        """The processes of one rank number in conflict now (updates the remembered group)."""
        inc = max(s.key.inc for s in group)
        newest = [s for s in group if s.key.inc == inc]
        held = self._groups.get(where)
        keys = held[1] if held is not None and held[0] == inc else set()
        running = [s for s in newest if s.running]
        if len({(s.key.host, s.key.pid) for s in running}) >= 2:
            keys |= {s.key for s in running}
        members = sorted((s for s in newest if s.key in keys and (s.running or s.stepped)),
                         key=lambda s: (s.key.host, s.key.pid))
        if not remember:
            return members
        if len(members) >= 2:
            self._groups[where] = (inc, {s.key for s in members})
        else:
            self._groups.pop(where, None)
        return members

    def forget_job(self, job: str) -> None:
        """Drop what is remembered of a job the monitor forgot."""
        for where in [w for w in self._groups if w[0] == job]:
            del self._groups[where]

    def __len__(self) -> int:
        return len(self._groups)


#: The view's order of rank processes: by job, rank number, host, pid, incarnation.
view_order = attrgetter("job", "rank", "host", "pid", "inc")


class ViewOrder(Generic[S]):
    """Every rank process in the view's order (:data:`view_order` of its key), kept until the set
    of processes changes (``version``): a tick while some rank number has two processes (a
    restart, until the old process is forgotten) sorted every rank by a key made in Python
    (~15 ms at 4,096 ranks). The list is shared between calls: read it, never change it."""

    def __init__(self) -> None:
        self._version = -1
        self._states: list[S] = []

    def get(self, states: Mapping[RankKey, S], version: int) -> list[S]:
        """The values of ``states`` (keyed by rank key; ``version`` changes whenever a key comes
        or goes) in the view's order."""
        if version != self._version:
            self._version, self._states = version, [states[k] for k in sorted(states, key=view_order)]
        return self._states

    def clear(self) -> None:
        """Hold no process: a forgotten one's state (its histories, kernel tables) is not kept alive
        by the order of a view no longer asked for (once no rank has two processes the view is
        answered by :class:`SoleRows`, and this list was refreshed only at the next restart)."""
        self._version, self._states = -1, []


class SoleRows(Generic[S]):
    """Every job's rows while each (job, rank) has one process and no conflict is remembered: then
    the claims' answer is every process with no others, in the view's order (job, rank, host, pid,
    incarnation). Kept until the set of processes changes (``version``), so a tick of thousands
    of ranks neither builds a :class:`Seen` per rank nor groups them (~30 ms at 4,096 ranks).
    The rows are shared between calls: read them, never change them."""

    def __init__(self) -> None:
        self._version = -1
        self._rows: Rows[S] | None = None

    def get(self, states: Mapping[RankKey, S], version: int, claims: Claims) -> Rows[S] | None:
        """The rows of ``states`` (keyed by rank key; ``version`` changes whenever a key comes or
        goes), or None when some rank number has two processes or ``claims`` remembers one."""
        if len(claims):
            return None
        if version != self._version:
            self._version, self._rows = version, self._build(states)
        return self._rows

    @staticmethod
    def _build(states: Mapping[RankKey, S]) -> Rows[S] | None:
        if len({(k.job, k.rank) for k in states}) != len(states):
            return None  # a rank number with two processes: the claims decide
        rows: Rows[S] = collections.defaultdict(list)
        for k in sorted(states, key=view_order):
            rows[k.job].append((states[k], ()))
        return dict(rows)


class FirstSeen(Protocol):
    """A rank process's state as :class:`ClaimedAt` reads it (rankstate.RankState)."""

    @property
    def first_seen(self) -> float: ...


#: No rank number of a job held by two processes.
NONE_CLAIMED: Mapping[int, float] = MappingProxyType({})


class ClaimedAt:
    """Per job, rank number -> monitor time the newest of the processes claiming it was first
    seen, for the rank numbers two or more of the job's processes hold, shown or not (a restart,
    an elastic restart that gave a rank number to another node, a conflict, until the old
    process is forgotten): a process that ended before then is history (rankview.JobContext).
    Every process, not the shown ones: torchrun counts restarts per node agent, so the claims
    may show an earlier process of a higher incarnation in place of the one that now holds its
    number. Kept until the set of processes changes (``version``): a walk of every process."""

    def __init__(self) -> None:
        self._version = -1
        self._by_job: dict[str, dict[int, float]] = {}

    def of(self, job: str, states: Mapping[RankKey, FirstSeen], version: int) -> Mapping[int, float]:
        """``job``'s rank numbers held twice or more among ``states`` (keyed by rank key;
        ``version`` changes whenever a key comes or goes), each with its newest first-seen time."""
        if version != self._version:
            self._version, self._by_job = version, self._build(states)
        return self._by_job.get(job, NONE_CLAIMED)

    @staticmethod
    def _build(states: Mapping[RankKey, FirstSeen]) -> dict[str, dict[int, float]]:
        # One pass in Python (~3.8 k instructions a process, 31 M at 8,192, callgrind): reading the
        # keys in C first (attrgetter, a set or a sort of them) cost more (37 M, 47 M).
        latest: dict[tuple[str, int], float] = {}
        twice: set[tuple[str, int]] = set()
        for key, st in states.items():
            where, seen = (key.job, key.rank), st.first_seen
            held = latest.get(where)
            if held is None:
                latest[where] = seen
                continue
            twice.add(where)
            if seen > held:
                latest[where] = seen
        by_job: dict[str, dict[int, float]] = {}
        for job, rank in twice:
            by_job.setdefault(job, {})[rank] = latest[(job, rank)]
        return by_job
