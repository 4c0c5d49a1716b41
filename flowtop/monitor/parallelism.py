"""Job figures that depend on the parallel layout (issue 14 parts 2 and 3). No Textual.

Conventions:

* **Tokens once per data-parallel replica.** The ranks of one replica that see the same tokens are
  its tensor-parallel ranks (each computes on the whole batch) and its pipeline stages (only the
  first embeds them; later stages see activations). A replica's tokens are those of its ranks at
  tp rank 0 on the first pipeline stage, summed over its context-parallel ranks, each of which
  embeds its own shard of the sequences. Job tokens/s = Σ over those representative ranks. Expert
  parallelism re-splits data-parallel ranks, which train tokens of their own: they all count.
* This needs every rank's coordinates (the hello's ``coords``, probe.steps.parallel). Where one is
  missing the job keeps the plain sum over all ranks and says so in ``tokens_basis``.
* **Whole replicas** (:func:`whole_replicas`): a replica with a rank unheard behind a silent relay
  is left out of the job's tokens and FLOPs together, so FLOPs per token stays the model's.
* **FLOPs are never deduplicated**: every rank's count is local (what its kernels compute), so
  the job's FLOPs are Σ over ranks, pipeline stages included. Job FLOPs per token = Σ over ranks of
  the counted step's FLOPs ÷ the representative ranks' tokens of that step (the mean of per-rank
  figures would halve it under TP 2, and a later pipeline stage has no tokens of its own).
* **Expert load per expert-parallel group** (:func:`ep_groups`): an EP group's ranks hold disjoint
  experts of one layer set, so a layer's max/mean is taken over the group's experts together
  (flowtop.monitor.moe_load.group_load), and the job shows its worst group. The expert mesh re-splits the
  data ranks (dp × cp, cp minor) with ep innermost, as torchtitan and DeviceMesh slicing do: the
  group of a rank is (its pp rank, its tp rank, data index // ep) with data index = dp·cp_size +
  cp, and its ep rank is data index % ep — which every rank must satisfy (else, with experts split
  over tp too, the data index takes tp as its minor part and tp leaves the key). Coordinates that
  fit neither, or a rank without coordinates, pool every rank's experts and say so.
* **Pipeline stages** (:func:`pipeline_stages`): the ranks at one pp rank form a stage; its FLOPs
  per step are Σ over its ranks ÷ the data-parallel replicas (one replica's stage: its tp × cp
  ranks together), its times the medians over its ranks.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Mapping, Sequence

from flowtop.monitor import moe_load
from flowtop.monitor.snapshot import FlopsView, RankSnapshot, StageView

TOKENS_ONCE = ("tokens once per data-parallel replica: ranks at tp rank 0 on the first pipeline stage, "
               "context-parallel shards summed")
TOKENS_SUMMED = "tokens summed over all ranks (no mesh known)"
#: Added to tokens_basis where whole_replicas left some out.
REPLICAS_LEFT_OUT = "data-parallel replicas with an unheard rank left out"
POOLED_UNKNOWN = f"{moe_load.POOLED} (parallel layout unknown)"
POOLED_MISFIT = f"{moe_load.POOLED} (the ranks' ep coordinates fit no expert-parallel grouping)"
ROLES = ("dp", "tp", "pp", "cp", "ep")


def coords_of(hello: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """The hello's coordinates (validated on the wire) as role -> (rank, size); {} when absent."""
    raw = hello.get("coords")
    if not isinstance(raw, Mapping):
        return {}
    return {r: (int(raw[r][0]), int(raw[r][1])) for r in ROLES if r in raw}


def _rank_of(r: RankSnapshot, role: str) -> int:
    return r.coords.get(role, (0, 1))[0]


def _size_of(r: RankSnapshot, role: str) -> int:
    return r.coords.get(role, (0, 1))[1]


def is_representative(r: RankSnapshot) -> bool:
    """Whether the rank's tokens count for its replica: tp rank 0 on the first pipeline stage."""
    return _rank_of(r, "tp") == 0 and _rank_of(r, "pp") == 0


def whole_replicas(ranks: Sequence[RankSnapshot]) -> tuple[list[RankSnapshot], int]:
    """The heard ranks whose data-parallel replica (its dp rank: tp, pp, cp ranks together) has
    no rank cut off behind a silent relay (RankSnapshot.cut), and how many heard ranks that
    leaves out. Tokens count once, on a replica's representative rank, and FLOPs on all its ranks:
    a replica partly heard would count its tokens without some FLOPs (or FLOPs without its
    tokens) and skew FLOPs per token; so the job's figures take whole replicas. Without every
    rank's coordinates each rank counts its own tokens: only the unheard ones are left out."""
    heard = [r for r in ranks if r.cut is None]
    if not ranks or any(not r.coords for r in ranks):
        return heard, 0
    cut = {_rank_of(r, "dp") for r in ranks if r.cut is not None}
    whole = [r for r in heard if _rank_of(r, "dp") not in cut]
    return whole, len(heard) - len(whole)


def job_tokens(ranks: Sequence[RankSnapshot]) -> tuple[float | None, str]:
    """Job tokens/s and how it was counted (see the module doc)."""
    missing = len([r for r in ranks if not r.coords])  # a list: a generator cost ~2x a rank
    if ranks and not missing:
        tps = [r.tokens_per_s for r in ranks if is_representative(r) and r.tokens_per_s is not None]
        return (sum(tps) if tps else None), TOKENS_ONCE
    tps = [r.tokens_per_s for r in ranks if r.tokens_per_s is not None]
    basis = TOKENS_SUMMED if missing == len(ranks) else (
        f"tokens summed over all ranks (no mesh known on {missing} of {len(ranks)} ranks)")
    return (sum(tps) if tps else None), basis


def job_flops_per_token(flops: FlopsView | None, ranks: Sequence[RankSnapshot], basis: str) -> FlopsView | None:
    """The job view completed with what needs the layout: its expert load per expert-parallel
    group (:func:`job_expert_load`), and FLOPs per token = Σ over all ranks of the counted step's
    model FLOPs ÷ the tokens of those counted steps on the representative ranks, where tokens are
    counted once. Per step, not per second: a later pipeline stage has no tokens, and its FLOP/s
    come from its own median step time, which a ratio of rates would mix with stage 0's."""
    if flops is None:
        return None
    flops = job_expert_load(flops, ranks)
    if basis != TOKENS_ONCE:
        return flops
    per_step = [r.flops.model_flops_per_step for r in ranks
                if r.flops is not None and r.flops.model_flops_per_step is not None]
    if not ranks or len(per_step) < len(ranks):
        return flops
    counted_tokens = 0.0
    for r in ranks:
        if is_representative(r):
            v = r.flops
            if v is None or v.model_flops_per_step is None or not v.flops_per_token:
                return flops  # a representative rank without a token count: no per-token figure
            counted_tokens += v.model_flops_per_step / v.flops_per_token
    if counted_tokens <= 0:
        return flops
    total = sum(per_step)
    return replace(flops, flops_per_token=total / counted_tokens)


def ep_groups(ranks: Sequence[RankSnapshot]) -> tuple[list[list[RankSnapshot]], str] | None:
    """The ranks' expert-parallel groups (ordered by their key) and how they were formed; None
    where a rank has no coordinates or the ep coordinates fit no grouping (see the module doc)."""
    if not ranks or any(not r.coords for r in ranks):
        return None
    ep = _size_of(ranks[0], "ep")
    if any(_size_of(r, "ep") != ep for r in ranks):
        return None
    for tp_in_ep in (False, True):
        groups: dict[tuple[int, int, int], list[RankSnapshot]] = {}
        for r in ranks:
            index = _rank_of(r, "dp") * _size_of(r, "cp") + _rank_of(r, "cp")
            if tp_in_ep:
                index = index * _size_of(r, "tp") + _rank_of(r, "tp")
            if _rank_of(r, "ep") != index % ep:
                break
            groups.setdefault((_rank_of(r, "pp"), 0 if tp_in_ep else _rank_of(r, "tp"), index // ep), []).append(r)
        else:
            ordered = [sorted(groups[k], key=lambda r: r.rank) for k in sorted(groups)]
            if ep == 1:
                return ordered, f"per rank ({len(ordered)}; no expert parallelism: each rank holds every expert)"
            over = "dp·cp·tp" if tp_in_ep else "dp·cp"
            return ordered, (f"per expert-parallel group ({len(ordered)} groups of ep {ep} over {over}: "
                             "a group's ranks hold disjoint experts of one layer set)")
    return None


def job_expert_load(flops: FlopsView, ranks: Sequence[RankSnapshot]) -> FlopsView:
    """``flops`` with its expert load taken per expert-parallel group (flowtop.monitor.moe_load), or the
    pooled figure labelled as such where the groups are unknown; as it is for dense models."""
    if flops.expert_load is None:
        return flops
    moe = [r for r in ranks if r.flops is not None and r.flops.expert_load is not None]
    found = ep_groups(moe)
    if found is None:
        why = POOLED_UNKNOWN if any(not r.coords for r in moe) else POOLED_MISFIT
        return replace(flops, expert_load=replace(flops.expert_load, grouping=why))
    groups, grouping = found
    load = moe_load.group_load([[(r.rank, r.flops.expert_load) for r in g
                                 if r.flops is not None and r.flops.expert_load is not None] for g in groups],
                               grouping)
    return replace(flops, expert_load=load)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def pipeline_stages(ranks: Sequence[RankSnapshot]) -> tuple[StageView, ...]:
    """The job's pipeline stages (pp size > 1 on some rank), in pp-rank order; () otherwise."""
    staged = [r for r in ranks if r.coords and _size_of(r, "pp") > 1]
    if not staged:
        return ()
    groups: dict[int, list[RankSnapshot]] = {}
    for r in staged:
        groups.setdefault(_rank_of(r, "pp"), []).append(r)
    flops: dict[int, float | None] = {}
    for pp, rs in groups.items():
        counts = [r.flops.model_flops_per_step for r in rs
                  if r.flops is not None and r.flops.model_flops_per_step is not None]
        # One replica of this stage holds tp × cp ranks: the stage's ranks ÷ that are its replicas.
        per_replica = max(1, _size_of(rs[0], "tp") * _size_of(rs[0], "cp"))
        replicas = max(1.0, len(rs) / per_replica)
        flops[pp] = sum(counts) / replicas if len(counts) == len(rs) else None
    known = [f for f in flops.values() if f is not None]
    total = sum(known) if len(known) == len(flops) else None
    out = []
    for pp in sorted(groups):
        rs = sorted(groups[pp], key=lambda r: r.rank)
        f = flops[pp]
        out.append(StageView(
            pp_rank=pp,
            stages=tuple(sorted({s for r in rs for s in r.pp_stages})),
            ranks=tuple(r.rank for r in rs),
            model_flops_per_step=f,
            flops_share=f / total if f is not None and total else None,
            stage_time_s=_median([r.stage_time_s for r in rs if r.stage_time_s is not None]),
            step_time_s=_median([r.step_time_s for r in rs if r.step_time_s is not None]),
        ))
    return tuple(out)
