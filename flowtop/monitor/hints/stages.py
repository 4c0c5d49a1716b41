"""Pipeline stages for the hints: which ranks may be compared by when their forward ends, and
which ranks' wait before the forward is their input's. No Textual.

Under pipeline parallelism a later stage's forward starts when the earlier stage's activations
arrive: its wait before the forward is the pipeline's bubble, not the data loader's, and its
forward ends later by design. A 2-stage GPipe or 1F1B job read "rank 1 waits for input 23 % of
each step" and "finishes its forward 9 ms after the others" on every run (a new user's trial).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from flowtop.monitor.snapshot import RankSnapshot

V = TypeVar("V")


def _stage(r: RankSnapshot) -> tuple[int, ...] | None:
    """The pipeline stages the rank runs (None: not pipelined, or not known)."""
    if r.pp_stages:
        return tuple(r.pp_stages)
    pp = r.coords.get("pp")
    return (pp[0],) if pp is not None and pp[1] > 1 else None


def feeds_itself(r: RankSnapshot) -> bool:
    """Whether the rank's wait before its forward is its input's: not a pipeline stage that
    waits for an earlier one's activations (a rank running the first stage reads the data)."""
    stage = _stage(r)
    return stage is None or 0 in stage


def stage_groups(ranks: Sequence[RankSnapshot]) -> dict[tuple[int, ...] | None, list[int]]:
    """Indices of ``ranks`` by pipeline stage (None: no stage known), in order of first
    appearance (one group when the job is not pipelined)."""
    groups: dict[tuple[int, ...] | None, list[int]] = {}
    for i, r in enumerate(ranks):
        groups.setdefault(_stage(r), []).append(i)
    return groups


def per_stage(ranks: Sequence[RankSnapshot], measure: Callable[[list[RankSnapshot]], dict[int, V]]) -> dict[int, V]:
    """``measure`` (indices into the list it is given → figures) over the ranks of each stage
    with at least two, keyed by index into ``ranks``; the whole list at once when not pipelined.
    In a pipelined job the ranks of no known stage are not compared (they may be of any stage:
    a rank whose hello had no coordinates yet)."""
    groups = stage_groups(ranks)
    if len(groups) == 1:
        return measure(list(ranks))
    out: dict[int, V] = {}
    for stage, group in groups.items():
        if stage is not None and len(group) >= 2:
            out.update((group[j], v) for j, v in measure([ranks[i] for i in group]).items())
    return out
