"""Per-expert load of MoE layers, per rank and per job, from ``expert_load``. No Textual.

Issue 14 part 4. Each rank sends, for its counted step, the tokens each of its *local* experts
received in each MoE layer (probe.moe; summed over micro-batches). Figures (README "FP8, MoE
and precision"):

* **max/mean** of a layer: its busiest expert's tokens ÷ the mean over its experts (1.0 is a
  perfectly even routing; with E experts it is at most E). A rank shows its worst layer and
  the mean over its layers.
* **job**: the same over every rank's local experts of a layer (under expert parallelism these
  are the layer's experts spread over the EP group; with experts replicated on every rank, each
  rank's own routing), and **rank max/mean**: the busiest rank's routed tokens (Σ over its
  experts and layers) ÷ the mean over ranks — the expert-parallel straggler figure: the all-to-all
  waits for the rank whose experts got the most tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CONVENTION = ("max/mean: busiest expert's tokens / mean over experts of a layer (1.0 = even); "
              "rank max/mean: busiest rank's routed tokens / mean over ranks")


@dataclass(frozen=True)
class ExpertLoad:
    """Tokens per expert of the counted step, summarised."""

    layers: int
    experts: int  # local experts per layer (largest layer); job: Σ over ranks
    routed_tokens: int  # token-to-expert assignments, Σ over layers and experts
    max_over_mean: float | None  # worst layer
    worst_layer: str
    mean_max_over_mean: float | None  # averaged over layers
    ranks: int = 1
    rank_max_over_mean: float | None = None  # job only
    convention: str = CONVENTION
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


def rank_load(msg: Mapping[str, Any]) -> ExpertLoad | None:
    """A rank's :class:`ExpertLoad` from its ``flops`` message (None: not an MoE model)."""
    loads = msg.get("expert_load")
    if not isinstance(loads, Mapping) or not loads:
        return None
    per_layer = {str(k): (max(v), sum(v), len(v)) for k, v in loads.items() if v}
    return _summary(per_layer, 1, None) if per_layer else None


def job_load(loads: Sequence[ExpertLoad | None]) -> ExpertLoad | None:
    """The job's :class:`ExpertLoad` over the ranks that sent one."""
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
    return _summary(per_layer, len(ls), rank_ratio)


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
    }
