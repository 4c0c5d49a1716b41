"""Rank hints that many ranks share, shown as one line. No Textual.

Ranks of one job mostly run the same kernels on the same shapes: when a kernel window makes one
rank launch-bound, it makes all of them so, and a 4,096-rank job then holds 4,096 hints that say
the same thing. The snapshot keeps every one (scripts and the exporter count them); the hints
panel and the text report show a :class:`HintGroup` instead — how many ranks, which (as ranges),
and the hint of the rank with the most at stake, whose evidence stands for the group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from flowtop.monitor.hints.base import rank_target
from flowtop.monitor.snapshot import Hint, RankSnapshot

#: Rank hints of one id, severity and state (active or ended) are grouped from this many ranks on.
GROUP_AT = 4


@dataclass(frozen=True)
class HintGroup:
    """Rank hints of one id, severity and state, on ``len(hints)`` ranks."""

    lead: Hint  # the hint with the largest impact (first in rank order among equals)
    hints: tuple[Hint, ...]  # every hint of the group, in rank order
    ranks: tuple[int, ...]  # their rank numbers, ascending (a rank whose number is not known: left out)

    @property
    def key(self) -> str:
        """Identity across snapshots (the panel keeps a group expanded while it lasts)."""
        return group_key(self.lead)

    def label(self) -> str:
        """'4,096 ranks (0-4095)', '5 ranks (0-3, 7)': the count, then the ranks as ranges (', …'
        after them when some hint's rank is no longer among the job's)."""
        more = ", …" if len(self.ranks) < len(self.hints) else ""
        return f"{len(self.hints):,} ranks ({rank_ranges(self.ranks)}{more})"


@dataclass(frozen=True, slots=True)
class HintLine:
    """What a hint's one line says: ``where`` (a group's ranks, or the hint's target where its
    summary does not name it; "" otherwise), then ``summary``. Every renderer (the hints panel,
    the text report) reads it here: each had added the target before a summary that begins with
    it ("rank 2: rank 2: the optimizer takes ...", a trial)."""

    where: str
    summary: str

    def text(self) -> str:
        return f"{self.where}: {self.summary}" if self.where else self.summary


def hint_line(row: Hint | HintGroup, now: float) -> HintLine:
    """The line of a hint, or of a group (its ranks, then its lead's summary: the rank with the
    most at stake, which that summary names), at monitor time ``now``."""
    h = row.lead if isinstance(row, HintGroup) else row
    summary = h.summary_at(now)
    # rules' summaries mostly name their target ("{target} waits for input ...", "kernel
    # {target} takes ..."): it is added only where one does not
    names_it = not h.target or re.search(rf"(?<!\w){re.escape(h.target)}(?!\w)", summary) is not None
    if isinstance(row, HintGroup):
        return HintLine(f"{row.label()}, most at stake", summary if names_it else f"{h.target}: {summary}")
    return HintLine("" if names_it else h.target, summary)


def group_key(h: Hint) -> str:
    """The key of the group ``h`` belongs to, or would, with enough ranks sharing it."""
    return f"group|{h.id}|{h.severity}|{h.ended}"


def rank_ranges(ranks: Sequence[int], most: int = 6) -> str:
    """Ascending rank numbers as ranges, 'a-b' for runs; after ``most`` ranges, '…'."""
    runs: list[tuple[int, int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most]]
    return ", ".join(parts) + (", …" if len(runs) > most else "")


def grouped(hints: Iterable[Hint], ranks: Iterable[RankSnapshot]) -> list[Hint | HintGroup]:
    """``hints`` in their order, with the rank hints of one (id, severity, ended) replaced by one
    group at the place of its first member when at least :data:`GROUP_AT` ranks hold them.
    ``ranks``: the job's ranks, which name the rank number behind each target."""
    hints = list(hints)
    number = {rank_target(r): r.rank for r in ranks}
    members: dict[tuple[str, str, bool], list[Hint]] = {}
    for h in hints:
        if h.scope == "rank":
            members.setdefault((h.id, h.severity, h.ended), []).append(h)
    out: list[Hint | HintGroup] = []
    placed: set[tuple[str, str, bool]] = set()
    for h in hints:
        which = (h.id, h.severity, h.ended)
        group = members.get(which) if h.scope == "rank" else None
        if group is None or len(group) < GROUP_AT:
            out.append(h)
        elif which not in placed:
            placed.add(which)
            out.append(_group(group, number))
    return out


def _group(hints: list[Hint], number: dict[str, int]) -> HintGroup:
    # A target none of the job's ranks names (an ended hint of a process the monitor forgot to
    # make room) sorts after the known ranks and is counted, not listed.
    unknown = 1 << 25  # past every rank number the wire admits (≤ 2**24)

    def rank_of(h: Hint) -> int:
        return number.get(h.target, unknown)

    ordered = sorted(hints, key=rank_of)
    lead = max(ordered, key=lambda h: h.impact)  # max keeps the first of equals: the lowest rank
    return HintGroup(lead, tuple(ordered), tuple(r for r in map(rank_of, ordered) if r != unknown))
