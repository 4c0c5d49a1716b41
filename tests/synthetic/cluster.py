"""A made-up large job for the rank view's tests, goldens and bench (nothing here is measured).

``cluster_snapshot(tick)`` is 4,096 ranks on 512 nodes of 8 (hosts ``node000`` ...) training
at about 200 ms a step and 45 % MFU, with the troubles a rank view must make visible: one
slow node (a straggler), a rank that hangs (stalled), a dead rack (four nodes gone silent),
ranks waiting for input, and a rank number claimed twice. Values depend only on the
arguments; every ``tick`` moves the steps on and shuffles the healthy ranks' MFU a little, so
rows move between two snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from flowtop.monitor.snapshot import (
    Claimant,
    FlopsView,
    Hint,
    JobSnapshot,
    MonitorSnapshot,
    RankSnapshot,
    TelemetryView,
)

T0 = 5000.0  # monitor clock of tick 0
PEAK = 989.4e12  # H200 dense bf16
FLOPS_PER_STEP = 0.45 * PEAK * 0.200  # 45 % MFU at 200 ms


@dataclass(frozen=True)
class Troubles:
    """Where the synthetic job's problems are (node and rank numbers)."""

    slow_node: int = 37  # its ranks step 30 % slower and lag 3 steps
    stalled_rank: int = 1234  # talks, makes no step
    dead_nodes: tuple[int, ...] = (300, 301, 302, 303)  # a rack gone silent
    input_wait_ranks: tuple[int, ...] = (2001, 2002)
    conflict_rank: int = 3000  # a second process claims it


def _wobble(rank: int, tick: int) -> float:
    """A deterministic -1..1 per (rank, tick): healthy ranks trade places between ticks."""
    return ((rank * 2654435761 + tick * 40503) % 1000) / 500.0 - 1.0


def _flops(step_s: float, stepping: bool, taken_at: float) -> FlopsView:
    mfu = FLOPS_PER_STEP / step_s / PEAK if stepping else 0.0
    return FlopsView(
        model_flops_per_step=FLOPS_PER_STEP, executed_flops_per_step=FLOPS_PER_STEP * 1.1,
        estimated_flops_per_step=None, estimate_source=None,
        flops_per_s=mfu * PEAK, executed_flops_per_s=mfu * PEAK * 1.1, mfu=mfu, hfu=mfu * 1.1,
        peak_flops=PEAK, peak_source="datasheet H200 SXM", dtype="bf16", attention_convention="full",
        flops_per_token=FLOPS_PER_STEP / 16384, stalled_since=None if stepping else taken_at - 12.0,
    )


_TELEMETRY = {
    a: TelemetryView(device={"gpu_util": 100.0, "tensor_active": a}, host={}, reasons={}, received_at=T0)
    for a in (0.0, 31.0, 44.0, 47.0)
}


def cluster_rank(rank: int, tick: int = 0, per_node: int = 8, troubles: Troubles = Troubles()) -> RankSnapshot:
    """One rank of the synthetic job."""
    node = rank // per_node
    step, step_s = 1000 + tick, 0.200 * (1.0 + 0.03 * _wobble(rank, tick))
    status, age, wait, tensor = "live", 0.2, 0.01, 47.0
    if node == troubles.slow_node:
        step, step_s, tensor = step - 3, 0.26, 31.0
    if rank in troubles.input_wait_ranks:
        wait, step_s, tensor = 0.30, 0.27, 31.0
    if rank == troubles.stalled_rank:
        step, status, age, tensor = 990, "stalled", 0.3, 0.0
    if node in troubles.dead_nodes:
        step, status, age, tensor = 996, "stale", 14.0 + tick * 0.5, 44.0
    stepping = status == "live"
    return RankSnapshot(
        rank=rank, host=f"node{node:03d}", pid=20000 + rank % per_node, local_rank=rank % per_node,
        incarnation=0, device="cuda", status=status, step=step, step_time_s=step_s,
        device_time_s=step_s * 0.95, tokens_per_step=16384, tokens_per_s=16384 / step_s if stepping else 0.0,
        input_wait_frac=wait, heard_at=_taken_at(tick) - age, lost_messages=0, dropped_messages=0,
        probe_overhead_frac=0.001,
        flops=_flops(step_s, stepping, _taken_at(tick)), telemetry=_TELEMETRY[tensor],
        conflict=(Claimant("node375", 29999),) if rank == troubles.conflict_rank else (),
    )


def _hints(troubles: Troubles, per_node: int) -> tuple[Hint, ...]:
    def hint(id: str, severity: str, rank: int, summary: str, impact: float) -> Hint:
        return Hint(id=id, severity=severity, scope="rank", target=f"rank {rank}", summary=summary,
                    evidence={}, action="", impact=impact)

    slow = range(troubles.slow_node * per_node, (troubles.slow_node + 1) * per_node)
    return (
        hint("hang_rank", "critical", troubles.stalled_rank,
             f"rank {troubles.stalled_rank} made no step for 12 s", 1.0),
        *(hint("straggler", "warning", r, f"rank {r} is 30 % slower than the other ranks by median step time over "
               "the same 20 steps (0.26 s vs their median 0.2 s) since step 990", 0.3) for r in slow),
        *(hint("input_wait", "warning", r, f"rank {r} waits for input 30 % of each step", 0.3)
          for r in troubles.input_wait_ranks),
    )


def cluster_job(n_ranks: int = 4096, tick: int = 0, *, per_node: int = 8, job: str = "llm-4k",
                troubles: Troubles = Troubles()) -> JobSnapshot:
    """The synthetic job at ``tick``."""
    ranks = [cluster_rank(r, tick, per_node, troubles) for r in range(n_ranks)]
    if troubles.conflict_rank < n_ranks:
        twin = ranks[troubles.conflict_rank]
        ranks.append(replace(twin, host="node375", pid=29999, conflict=(Claimant(twin.host, twin.pid),)))
    live = [r for r in ranks if r.status == "live"]
    tokens = sum(r.tokens_per_s or 0.0 for r in ranks)
    return JobSnapshot(
        job=job, world_size=n_ranks, ranks=tuple(ranks), step=min(r.step for r in live),
        step_time_s=max(r.step_time_s or 0.0 for r in live), tokens_per_s=tokens,
        flops=_flops(max(r.step_time_s or 0.0 for r in live), True, _taken_at(tick)), status="running",
        hints=_hints(troubles, per_node), rank_conflicts=1 if troubles.conflict_rank < n_ranks else 0,
    )


def _taken_at(tick: int) -> float:
    return T0 + tick * 0.5  # 2 Hz


def cluster_snapshot(tick: int = 0, n_ranks: int = 4096, **kwargs: Any) -> MonitorSnapshot:
    """A monitor snapshot holding the synthetic job at ``tick``."""
    job = cluster_job(n_ranks, tick, **kwargs)
    return MonitorSnapshot(taken_at=_taken_at(tick), listen="tcp://0.0.0.0:5759", jobs=(job,),
                           received=800_000 + tick * 8192, rejected=0)
