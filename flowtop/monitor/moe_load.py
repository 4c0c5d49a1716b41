"""Per-expert load of MoE layers, per rank and per job, from ``expert_load``. No Textual.

Issue 14 part 4. Each rank sends, for its counted step, the tokens each of its *local* experts
received in each MoE layer (probe.flops.moe; summed over micro-batches). Figures (README "FP8, MoE
and precision"):

* **max/mean** of a layer: its busiest expert's tokens ÷ the mean over its experts (1.0 is a
  perfectly even routing; with E experts it is at most E). A rank shows its worst layer and
  the mean over its layers.
* **job, per expert-parallel group** (:func:`group_load`): the ranks of one EP group hold
  disjoint experts of one layer set, so a layer's experts in a group are its ranks' local experts
  together; the job shows the group with the worst layer (its ranks named) and how many groups
  there are. Which ranks form a group comes from their coordinates (flowtop.monitor.parallelism); without
  expert parallelism every rank holds every expert and is a group of its own; where the layout
  is unknown every rank's experts are pooled (:func:`job_load`; exact for one EP group only), and
  ``grouping`` says which. **rank max/mean**: the busiest rank's routed tokens (Σ over its
  experts and layers) ÷ the mean over all ranks — the expert-parallel straggler figure: the
  all-to-all waits for the rank whose experts got the most tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from probe.wire import FlopsReport

CONVENTION = ("max/mean: busiest expert's tokens / mean over experts of a layer (1.0 = even); "
              "rank max/mean: busiest rank's routed tokens / mean over ranks")
#: ``grouping`` of a job figure over every rank's experts (flowtop.monitor.parallelism says why).
POOLED = "all ranks' experts pooled"


@dataclass(frozen=True)
class ExpertLoad:
    """Tokens per expert of the counted step, summarised."""

    layers: int
    experts: int  # local experts per layer (largest layer); job: Σ over the worst group's ranks
    routed_tokens: int  # token-to-expert assignments, Σ over layers and experts
    max_over_mean: float | None  # worst layer
    worst_layer: str
    mean_max_over_mean: float | None  # averaged over layers
    ranks: int = 1
    rank_max_over_mean: float | None = None  # job only
    convention: str = CONVENTION
    groups: int | None = None  # job: expert-parallel groups compared (None: pooled, or a rank)
    worst_group: tuple[int, ...] = ()  # job: ranks of the group whose layer is the worst
    grouping: str = ""  # job: how ranks were grouped ("" for a rank)
    #: Per layer (max, sum, experts): for the job's aggregate; left out of the JSON.
    per_layer: Mapping[str, tuple[int, int, int]] = field(default_factory=dict, repr=False)


def _ratio(mx: int, total: int, n: int) -> float | None:
    return mx / (total / n) if n > 0 and total > 0 else None


def _summary(per_layer: Mapping[str, tuple[int, int, int]], ranks: int, rank_ratio: float | None) -> ExpertLoad:
    ratios = {k: _ratio(*v) for k, v in per_layer.items()}
    known = {k: r for k, r in ratios.items() if r is not None}
    worst = max(known, key=lambda k: known[k]) if known else ""
    return ExpertLoad(
        layers=len(per_layer),
        experts=max((v[2] for v in per_layer.values()), default=0),
        routed_tokens=sum(v[1] for v in per_layer.values()),
        max_over_mean=known.get(worst),
        worst_layer=worst,
        mean_max_over_mean=sum(known.values()) / len(known) if known else None,
        ranks=ranks,
        rank_max_over_mean=rank_ratio,
        per_layer=dict(per_layer),
    )


def rank_load(msg: FlopsReport) -> ExpertLoad | None:
    """A rank's :class:`ExpertLoad` from its ``flops`` message (None: not an MoE model)."""
    per_layer = {k: (max(v), sum(v), len(v)) for k, v in msg.expert_load.items() if v}
    return _summary(per_layer, 1, None) if per_layer else None


def job_load(loads: Sequence[ExpertLoad | None]) -> ExpertLoad | None:
    """The :class:`ExpertLoad` over every expert of the ranks that sent one, pooled: a layer's
    experts are all the ranks' local experts together (exact for the ranks of one EP group)."""
    ls = [x for x in loads if x is not None]
    if not ls:
        return None
    per_layer: dict[str, tuple[int, int, int]] = {}
    for x in ls:
        for k, (mx, total, n) in x.per_layer.items():
            m0, t0, n0 = per_layer.get(k, (0, 0, 0))
            per_layer[k] = (max(m0, mx), t0 + total, n0 + n)
    routed = [x.routed_tokens for x in ls]
    rank_ratio = _ratio(max(routed), sum(routed), len(routed)) if len(ls) > 1 else None
    return replace(_summary(per_layer, len(ls), rank_ratio), grouping=POOLED)


def group_load(groups: Sequence[Sequence[tuple[int, ExpertLoad]]], grouping: str) -> ExpertLoad | None:
    """The job's :class:`ExpertLoad` per expert-parallel group: ``groups`` lists each group's
    (rank, load) pairs, whose local experts are disjoint parts of one layer set. The figures of
    the group with the worst layer (ties: the first group), with routed tokens, ranks and rank
    max/mean over every group."""
    summaries = []
    for g in groups:
        s = job_load([x for _, x in g])
        if s is not None:
            summaries.append((tuple(sorted(r for r, _ in g)), s))
    if not summaries:
        return None
    ranks, worst = max(summaries, key=lambda t: -1.0 if t[1].max_over_mean is None else t[1].max_over_mean)
    routed = [x.routed_tokens for g in groups for _, x in g]
    return replace(worst, routed_tokens=sum(routed), ranks=len(routed),
                   rank_max_over_mean=_ratio(max(routed), sum(routed), len(routed)) if len(routed) > 1 else None,
                   groups=len(summaries), worst_group=ranks, grouping=grouping)


def load_json(x: ExpertLoad | None) -> dict[str, Any] | None:
    """JSON form (the per-layer table stays in memory: thousands of ranks × layers)."""
    if x is None:
        return None
    return {
        "layers": x.layers,
        "experts": x.experts,
        "routed_tokens": x.routed_tokens,
        "max_over_mean": x.max_over_mean,
        "worst_layer": x.worst_layer,
        "mean_max_over_mean": x.mean_max_over_mean,
        "ranks": x.ranks,
        "rank_max_over_mean": x.rank_max_over_mean,
        "convention": x.convention,
        "groups": x.groups,
        "worst_group": list(x.worst_group),
        "grouping": x.grouping,
    }
