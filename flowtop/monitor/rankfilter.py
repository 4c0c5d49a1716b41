"""The rank view's filter (the ``/`` key): host globs, rank ranges, statuses, hint ids.

Pure data (no Textual). A filter is space-separated terms; each is a host glob (``node01*``),
a rank or rank range (``7``, ``128-255``, ``4000-``), a status (``stalled``; ``hung`` is the
same), ``conflict``, or a hint id (``input_wait``: the ranks an active hint of that id names).
A bare word is classified in that order (digits, status, hint id, else a host glob);
``host:``, ``rank:``, ``status:`` and ``hint:`` prefixes force a kind, and commas list values
(``rank:0-7,64-71``). Terms of one kind are alternatives, different kinds must all match:
``node0* stalled stale`` is "on node0*, and stalled or stale".
"""

from __future__ import annotations

import bisect
import fnmatch
import re
import sys
from dataclasses import dataclass
from typing import Callable, Iterable

from flowtop.monitor.format import fmt_ranks
from flowtop.monitor.snapshot import Hint, JobSnapshot, RankSnapshot

STATUSES = frozenset({"live", "stalled", "stale", "done", "failed", "stopped"})
#: Words people use for a status: a rank that talks but makes no step is hung.
STATUS_ALIASES = {"hung": "stalled"}
CONFLICT = "conflict"
KINDS = ("host", "rank", "status", "hint")
_RANGE = re.compile(r"^(\d+)(?:-(\d*))?$")
_RANK_TARGET = re.compile(r"^rank (\d+)$")


class FilterError(ValueError):
    """A filter text that does not parse; the message says which term and why."""


@dataclass(frozen=True)
class RankFilter:
    """A parsed filter; the empty filter keeps every rank."""

    text: str = ""
    hosts: tuple[str, ...] = ()  # globs, matched against the full and the short host name
    ranges: tuple[tuple[int, int], ...] = ()  # inclusive rank ranges
    statuses: frozenset[str] = frozenset()  # may hold CONFLICT
    hints: frozenset[str] = frozenset()  # hint ids

    @property
    def active(self) -> bool:
        """Whether the filter drops anything at all."""
        return bool(self.hosts or self.ranges or self.statuses or self.hints)

    def matcher(self, job: JobSnapshot) -> Callable[[RankSnapshot], bool]:
        """A predicate over ``job``'s ranks (hint targets and host matches computed once)."""
        if not self.active:
            return lambda r: True
        tests: list[Callable[[RankSnapshot], bool]] = []
        if self.hosts:
            tests.append(_host_test(self.hosts))
        if self.ranges:
            tests.append(_range_test(self.ranges))
        if self.statuses:
            statuses = self.statuses
            conflict = CONFLICT in statuses
            tests.append(lambda r: r.status in statuses or (conflict and bool(r.conflict)))
        if self.hints:
            tests.append(_hint_test(job, self.hints))
        if len(tests) == 1:  # one kind of term (the usual): no generator per rank
            return tests[0]
        return lambda r: all(t(r) for t in tests)


def _range_test(ranges: tuple[tuple[int, int], ...]) -> Callable[[RankSnapshot], bool]:
    """Inclusive rank ranges, by bisection (``f`` on a hint of every node's rank 0 makes hundreds)."""
    spans = sorted(ranges)
    los = [lo for lo, _ in spans]
    reach, top = [], -1
    for _, hi in spans:  # the highest rank any range starting at or before this one reaches
        top = max(top, hi)
        reach.append(top)

    def test(r: RankSnapshot) -> bool:
        i = bisect.bisect_right(los, r.rank) - 1
        return i >= 0 and r.rank <= reach[i]

    return test


def _host_test(globs: tuple[str, ...]) -> Callable[[RankSnapshot], bool]:
    """Host globs, cached per host name (thousands of ranks, a few hundred hosts)."""
    seen: dict[str, bool] = {}

    def test(r: RankSnapshot) -> bool:
        hit = seen.get(r.host)
        if hit is None:
            hit = seen[r.host] = any(_host_match(r.host, g) for g in globs)
        return hit

    return test


def _host_match(host: str, glob: str) -> bool:
    """Whether ``glob`` matches the full or the short name of ``host``."""
    return fnmatch.fnmatchcase(host, glob) or fnmatch.fnmatchcase(host.split(".")[0], glob)


def target_rank(hint: Hint) -> int | None:
    """The rank a rank-scope hint is about ("rank 3"), else None (a job's, a kernel's)."""
    m = _RANK_TARGET.match(hint.target) if hint.scope == "rank" else None
    return int(m.group(1)) if m is not None else None


def _hint_test(job: JobSnapshot, ids: frozenset[str]) -> Callable[[RankSnapshot], bool]:
    """Ranks named by an active hint of one of ``ids``. A job- or kernel-scope hint is about
    every rank of the job; an ended hint is history, not a current problem, so it is skipped."""
    ranks: set[int] = set()
    for h in job.hints:
        if h.id not in ids or h.ended:
            continue
        rank = target_rank(h)
        if rank is None:
            return lambda r: True
        ranks.add(rank)
    return lambda r: r.rank in ranks


def hinted_ranks(hints: Iterable[Hint], hint_id: str | None = None) -> dict[int, float]:
    """Rank number -> impact of each active rank hint (of ``hint_id`` only, when given)."""
    out: dict[int, float] = {}
    for h in hints:
        if (hint_id is None or h.id == hint_id) and not h.ended and (rank := target_rank(h)) is not None:
            out[rank] = max(h.impact, out.get(rank, 0.0))
    return out


def hint_filter(hints: Iterable[Hint]) -> str:
    """The filter text that shows the ranks ``hints`` are about (one hint, or a group's): the
    ranks they target ('rank:3', 'rank:0-3,7'), else those a job's hint lists in its evidence
    (hang_all's silent and failed ranks, the heaviest of an MoE layer: lists under a key ending
    in ``_ranks``), else the first hint's id (a hint about every rank of the job)."""
    hints = tuple(hints)
    ranks = {rank for h in hints if (rank := target_rank(h)) is not None}
    if not ranks:
        ranks = {int(r) for h in hints for k, v in h.evidence.items() if k.endswith("_ranks")
                 and isinstance(v, (list, tuple)) for r in v if type(r) is int and r >= 0}
    if not ranks:
        # an ended hint is no longer matched by hint:<id> (_hint_test): no filter, every rank
        return "" if not hints or all(h.ended for h in hints) else f"hint:{hints[0].id}"
    return "rank:" + fmt_ranks(sorted(ranks), width=sys.maxsize)


def known_hint_ids(job: JobSnapshot | None = None) -> frozenset[str]:
    """Hint ids a bare word may name: every rule's, plus any the job's hints carry."""
    from flowtop.monitor.hints.rules import RULES

    ids = {rule.id for rule in RULES}
    if job is not None:
        ids.update(h.id for h in job.hints)
    return frozenset(ids)


def parse_filter(text: str, hint_ids: Iterable[str] | None = None, hosts: Iterable[str] | None = None) -> RankFilter:
    """Parse the ``/`` filter's text (see the module docstring); raises :class:`FilterError`.
    ``hosts``: the job's host names; a bare word that is no status or hint id and matches none
    of them is refused rather than read as a host glob that keeps no rank (a typo, ``stalld``,
    emptied the table with nothing said). ``host:`` takes any glob."""
    ids = frozenset(hint_ids) if hint_ids is not None else known_hint_ids()
    known_hosts = None if hosts is None else frozenset(hosts)
    parts: dict[str, list] = {k: [] for k in KINDS}
    for term in text.split():
        kind, _, values = term.partition(":") if ":" in term else ("", "", term)
        if kind and kind not in KINDS:
            raise FilterError(f"unknown filter kind {kind!r} in {term!r} (host:, rank:, status:, hint:)")
        for value in (v for v in values.split(",") if v):
            k = kind or _classify(value, ids)
            if not kind and k == "host" and known_hosts is not None \
                    and not any(_host_match(h, value) for h in known_hosts):
                raise FilterError(f"{value!r} is no status, hint id or host of this job "
                                  f"(host:{value} filters by that host glob all the same)")
            parts[k].append(_value(k, value, term))
    return RankFilter(
        text=" ".join(text.split()),
        hosts=tuple(parts["host"]),
        ranges=tuple(parts["rank"]),
        statuses=frozenset(parts["status"]),
        hints=frozenset(parts["hint"]),
    )


def _classify(value: str, ids: frozenset[str]) -> str:
    if _RANGE.match(value):
        return "rank"
    if value in STATUSES or value in STATUS_ALIASES or value == CONFLICT:
        return "status"
    return "hint" if value in ids else "host"


def _value(kind: str, value: str, term: str) -> object:
    if kind == "rank":
        m = _RANGE.match(value)
        if m is None:
            raise FilterError(f"{term!r}: a rank range is N, N-M or N- (e.g. 128-255)")
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (int(m.group(2)) if m.group(2) else 1 << 62)
        if hi < lo:
            raise FilterError(f"{term!r}: the range ends before it starts")
        return (lo, hi)
    if kind == "status":
        status = STATUS_ALIASES.get(value, value)
        if status not in STATUSES and status != CONFLICT:
            raise FilterError(f"{term!r}: a status is live, stalled (hung), stale, done, failed, stopped or conflict")
        return status
    return value
