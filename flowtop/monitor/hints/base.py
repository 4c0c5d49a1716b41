"""Shared pieces of the hint measures: the Measurement record and small snapshot helpers."""

from __future__ import annotations

import bisect
import math
import weakref
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple, Sequence, TypeGuard

from flowtop.monitor.claims import newest_ranks
from flowtop.monitor.hintclock import HintClock
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.snapshot import History, JobSnapshot, RankSnapshot


class Measurement(NamedTuple):
    """One rule's measure for one target at one evaluation.

    ``steps_covered``/``seconds_covered`` say how much evidence the value already embodies (a
    measure over the last 20 steps of history covers 20 steps), so a monitor that starts late can
    fire at once; otherwise the engine accumulates the window across evaluations. (A tuple with
    names: a dozen rules measure every rank of a job at every evaluation, thousands of them.)
    ``evidence`` and ``text`` are read, never changed: a measure may hand the same ones out again
    (a rank's window is measured once per window, flowtop.monitor.hints.measures_kernels).
    """

    value: float
    evidence: Mapping[str, Any]
    impact: float  # estimated share of step time at stake, 0..1
    step: int  # the target's step index now (for step windows)
    steps_covered: int = 0
    seconds_covered: float = 0.0
    text: Mapping[str, str] = MappingProxyType({})  # extra words for the summary template
    severity: str | None = None  # override of the rule's severity (escalation)
    variant: str = ""  # key of the rule's alternative summary (Rule.variants); "" for the main one
    #: Figures that grow with the clock, as instants (a hang: flowtop.monitor.hintclock): the
    #: hint holds it, ``value`` is its measure now and ``evidence`` leaves its figures out.
    clock: HintClock | None = None


#: A measure: (rule, job, now) -> {target: Measurement, or None when the target has no data now}.
MeasureFn = Callable[[Rule, JobSnapshot, float], dict[str, "Measurement | None"]]


def finite(x: Any) -> TypeGuard[float]:
    """True for a real, finite number (bools excluded)."""
    t = type(x)
    if t is float:  # the common case first (tens of thousands of calls a round at scale)
        return x - x == 0.0  # NaN and ±inf give NaN
    if t is int:
        return True
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


_TARGETS: dict[int, str] = {}


def rank_target(r: RankSnapshot) -> str:
    """Target label of a rank-scope hint (made once per rank number: every rule asks, every rank)."""
    target = _TARGETS.get(r.rank)
    if target is None:
        if len(_TARGETS) > 1 << 16:
            _TARGETS.clear()
        target = _TARGETS[r.rank] = f"rank {r.rank}"
    return target


def latest_ranks(job: JobSnapshot) -> list[RankSnapshot]:
    """One snapshot per rank number (the newest incarnation), sorted by rank: flowtop.monitor.claims'
    :func:`~flowtop.monitor.claims.newest_ranks` (its tie-break is there). Taken once per job
    snapshot (an immutable record: a new one, a new list) and shared by every rule that reads
    it (a dozen of them, each over every rank): callers only read it."""
    return _latest_memo(job)


def is_cuda(r: RankSnapshot) -> bool:
    """Whether the rank trains on a GPU (the probe names CPU devices "cpu (...)")."""
    name = (r.device or "").strip().lower()
    return bool(name) and not name.startswith("cpu") and name != "unknown"


class _Entry(weakref.ref):
    """A memo entry: a weak reference to its object that holds the key and the value.

    One tracked object per entry instead of ten (a tuple key, a tuple of references, a tuple of
    them and the value, and a function, its closure tuple and two cells for each reference's
    callback): the memos hold an entry per rank window and rule, and a full collection walks every
    tracked object (flowtop.monitor.gcpolicy)."""

    __slots__ = ("key", "value")
    key: int
    value: Any


class IdentityMemo:
    """Memo of a function of immutable objects (snapshot records, rules), keyed by identity.

    Snapshot records are rebuilt every ~0.5 s but the heavy parts (a rank's kernel window) stay the
    same object until new data arrives, and several rules read the same thing. Entries hold weak
    references: an entry goes when one of its objects does, so old windows are not kept alive
    (and an id cannot be reused while its entry exists). A function of several objects is a memo
    of the first (a rule: a few) whose values are memos of the rest (a window a rank): an entry a
    rank, not one for each of its objects.
    """

    def __init__(self, fn: Callable[..., Any], max_entries: int = 65536,
                 _before: tuple[weakref.ref[Any], ...] = ()) -> None:
        self._fn = fn
        self._max = max_entries  # a backstop only; entries normally leave with their objects
        self._before = _before  # a memo of the rest: the objects before, held weakly
        self._memo: dict[int, _Entry] = {}  # id(object) -> its entry (an int key: not tracked)
        self._forget = self._drop  # one bound method for every entry's callback
        self._by_first: IdentityMemo | None = None  # several objects: first -> a memo of the rest

    def __len__(self) -> int:
        if self._by_first is None:
            return len(self._memo)
        return sum(len(e.value) for e in self._by_first._memo.values())

    def _drop(self, ref: _Entry) -> None:
        if self._memo.get(ref.key) is ref:
            del self._memo[ref.key]

    def _rest(self, first: Any) -> IdentityMemo | None:
        try:
            ref = weakref.ref(first)
        except TypeError:  # not weak-referenceable: computed every time
            return None
        return IdentityMemo(self._fn, self._max, (*self._before, ref))

    def _compute(self, *objs: Any) -> Any:
        if self._before:  # alive: their entries, above this memo, go with them
            return self._fn(*[r() for r in self._before], *objs)
        return self._fn(*objs)

    def __call__(self, *objs: Any) -> Any:
        if len(objs) == 2 and self._by_first is not None:
            # (rule, window) at every rank of every kernel rule: both entries looked up here, not
            # through a call of the memo of the first and one of the memo of the rest (a miss
            # anywhere takes the general path below, which does the same lookups)
            first, second = objs
            hit = self._by_first._memo.get(id(first))
            if hit is not None and hit() is first and hit.value is not None:
                rest = hit.value._memo.get(id(second))
                if rest is not None and rest() is second:
                    return rest.value
        if len(objs) != 1:
            if not objs:
                return self._compute()
            by_first = self._by_first
            if by_first is None:
                by_first = self._by_first = IdentityMemo(self._rest, self._max)
            rest = by_first(objs[0])
            if rest is None:
                return self._compute(*objs)
            # (a memo of the rest goes with its first object; its bound callback makes it a cycle
            # the full collection frees: rules, the first objects, live as long as the engine)
            return rest(*objs[1:])
        obj = objs[0]
        key = id(obj)
        hit = self._memo.get(key)
        if hit is not None and hit() is obj:  # the same object, not one that took its id
            return hit.value
        value = self._compute(obj)
        if len(self._memo) >= self._max:
            self._memo.clear()
        try:
            entry = _Entry(obj, self._forget)
        except TypeError:  # not weak-referenceable: compute every time
            return value
        entry.key, entry.value = key, value
        self._memo[key] = entry
        return value


def _positive_median(values: Any) -> float | None:
    """Median of the positive, finite values (sorted once in C; the model's values are finite,
    a history built by hand may hold NaN)."""
    ordered = sorted(values)
    if not math.isfinite(sum(ordered)):
        ordered = [t for t in ordered if math.isfinite(t)]
    times = ordered[bisect.bisect_right(ordered, 0.0):]
    if not times:
        return None
    mid = len(times) // 2
    return float(times[mid]) if len(times) % 2 else (times[mid - 1] + times[mid]) / 2.0


def finite_sum(values: Sequence[float]) -> float:
    """Sum of the finite values: summed once in C, filtered only when that sum is not finite (the
    model's values are finite; a history built by hand may hold NaN or inf). A generator that
    tested every value cost the input-wait rule ~10 µs a rank at every evaluation."""
    total = sum(values)
    if math.isfinite(total):
        return total
    return sum(v for v in values if math.isfinite(v))


def _median_history(h: History) -> float | None:
    return _positive_median(h.step_time_s)


_median_history_memo = IdentityMemo(_median_history)
_latest_memo = IdentityMemo(lambda job: newest_ranks(job.ranks), max_entries=256)


def median_step_s(r: RankSnapshot, last: int = 0) -> float | None:
    """Median wall time per step from history (last ``last`` steps; all when 0), else the rank's."""
    if last:
        return median_of(r, r.history.step_time_s[-last:])
    med = _median_history_memo(r.history)
    if med is not None:
        return med
    return r.step_time_s if finite(r.step_time_s) and r.step_time_s > 0 else None


def median_of(r: RankSnapshot, times: Sequence[float]) -> float | None:
    """:func:`median_step_s` over step times of ``r``'s history a measure read already: their
    median, else the rank's."""
    med = _positive_median(times)
    if med is not None:
        return med
    return r.step_time_s if finite(r.step_time_s) and r.step_time_s > 0 else None


def telemetry_number(r: RankSnapshot, key: str) -> float | None:
    """A finite device telemetry value, or None."""
    if r.telemetry is None:
        return None
    value = r.telemetry.device.get(key)
    return float(value) if finite(value) else None


def safe_div(a: float, b: float) -> float:
    """a / b, 0 when b is 0."""
    return a / b if b else 0.0


def clamp01(x: float) -> float:
    """x limited to 0..1 (impacts)."""
    return max(0.0, min(1.0, x))
