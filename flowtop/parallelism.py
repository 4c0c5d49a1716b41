"""Job figures that depend on the parallel layout (issue 14 parts 2 and 3). No Textual.

Conventions:

* **Tokens once per data-parallel replica.** The ranks of one replica that see the same tokens are
  its tensor-parallel ranks (each computes on the whole batch) and its pipeline stages (only the
  first embeds them; later stages see activations). A replica's tokens are those of its ranks at
  tp rank 0 on the first pipeline stage, summed over its context-parallel ranks, each of which
  embeds its own shard of the sequences. Job tokens/s = Σ over those representative ranks. Expert
  parallelism re-splits data-parallel ranks, which train tokens of their own: they all count.
* This needs every rank's coordinates (the hello's ``coords``, probe.parallel). Where one is
  missing the job keeps the plain sum over all ranks and says so in ``tokens_basis``.
* **FLOPs are never deduplicated**: every rank's count is local (what its kernels compute), so
  the job's FLOPs are Σ over ranks, pipeline stages included. Job FLOPs per token = Σ over ranks of
  the counted step's FLOPs ÷ the representative ranks' tokens of that step (the mean of per-rank
  figures would halve it under TP 2, and a later pipeline stage has no tokens of its own).
* **Pipeline stages** (:func:`pipeline_stages`): the ranks at one pp rank form a stage; its FLOPs
  per step are Σ over its ranks ÷ the data-parallel replicas (one replica's stage: its tp × cp
  ranks together), its times the medians over its ranks.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Mapping, Sequence

from flowtop.snapshot import FlopsView, RankSnapshot, StageView

TOKENS_ONCE = ("tokens once per data-parallel replica: ranks at tp rank 0 on the first pipeline stage, "
               "context-parallel shards summed")
TOKENS_SUMMED = "tokens summed over all ranks (no mesh known)"
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


def job_tokens(ranks: Sequence[RankSnapshot]) -> tuple[float | None, str]:
    """Job tokens/s and how it was counted (see the module doc)."""
    missing = sum(1 for r in ranks if not r.coords)
    if ranks and not missing:
        tps = [r.tokens_per_s for r in ranks if is_representative(r) and r.tokens_per_s is not None]
        return (sum(tps) if tps else None), TOKENS_ONCE
    tps = [r.tokens_per_s for r in ranks if r.tokens_per_s is not None]
    basis = TOKENS_SUMMED if missing == len(ranks) else (
        f"tokens summed over all ranks (no mesh known on {missing} of {len(ranks)} ranks)")
    return (sum(tps) if tps else None), basis


def job_flops_per_token(flops: FlopsView | None, ranks: Sequence[RankSnapshot], basis: str) -> FlopsView | None:
    """The job view with FLOPs per token = Σ over all ranks of the counted step's model FLOPs ÷ the
    tokens of those counted steps on the representative ranks, where tokens are counted once (else
    the view as it is). Per step, not per second: a later pipeline stage has no tokens, and its
    FLOP/s come from its own median step time, which a ratio of rates would mix with stage 0's."""
    if flops is None or basis != TOKENS_ONCE:
        return flops
    views = [r.flops for r in ranks]
    if not views or any(v is None or v.model_flops_per_step is None for v in views):
        return flops
    counted_tokens = 0.0
    for r in ranks:
        if is_representative(r):
            v = r.flops
            if v is None or not v.flops_per_token:
                return flops  # a representative rank without a token count: no per-token figure
            counted_tokens += v.model_flops_per_step / v.flops_per_token  # type: ignore[operator]
    if counted_tokens <= 0:
        return flops
    total = sum(v.model_flops_per_step for v in views)  # type: ignore[union-attr, misc]
    return replace(flops, flops_per_token=total / counted_tokens)


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
        counts = [r.flops.model_flops_per_step if r.flops is not None else None for r in rs]
        # One replica of this stage holds tp × cp ranks: the stage's ranks ÷ that are its replicas.
        per_replica = max(1, _size_of(rs[0], "tp") * _size_of(rs[0], "cp"))
        replicas = max(1.0, len(rs) / per_replica)
        flops[pp] = sum(counts) / replicas if all(c is not None for c in counts) else None  # type: ignore[arg-type]
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
