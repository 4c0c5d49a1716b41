"""Measures over the parallel layout: pipeline stage imbalance (issue 14 part 2)."""

from __future__ import annotations

from typing import Any

from flowtop.monitor.format import fmt_si, fmt_time
from flowtop.monitor.hints.base import Measurement, clamp01
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.snapshot import JobSnapshot


def pipeline_imbalance(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Job: how much more the heaviest pipeline stage computes than the stages' mean, in percent
    (model FLOPs per step of one data-parallel replica, flowtop.monitor.parallelism.pipeline_stages).

    In a pipeline every stage waits for the slowest each micro-batch, so the others idle for
    1 − mean ÷ max of the pipeline's compute: that is the impact. The stages' compute times
    (forward and backward chunks, neighbour waits excluded) are evidence beside the FLOPs."""
    stages = job.stages
    flops = [s.model_flops_per_step for s in stages if s.model_flops_per_step is not None]
    if len(stages) < 2 or len(flops) < len(stages):
        return {"": None}
    values = [float(f) for f in flops]
    mean = sum(values) / len(values)
    if mean <= 0:
        return {"": None}
    heavy = max(range(len(stages)), key=lambda i: (values[i], -i))
    top = stages[heavy]
    ev: dict[str, Any] = {
        "heavier_pct": 100.0 * (values[heavy] / mean - 1.0),
        "heaviest_pp_rank": top.pp_rank,
        "heaviest_stages": list(top.stages),
        "heaviest_ranks": list(top.ranks),
        "stage_flops_per_step": values[heavy],
        "mean_stage_flops_per_step": mean,
        "flops_share_pct": [100.0 * v / sum(values) for v in values],
        "stages_n": len(stages),
        "stage_time_s": top.stage_time_s,
        "mean_stage_time_s": None,
    }
    times = [s.stage_time_s for s in stages if s.stage_time_s is not None]
    note = ""
    if len(times) == len(stages):
        ev["mean_stage_time_s"] = sum(times) / len(times)
        note = (f"; its compute takes {fmt_time(top.stage_time_s)} per step, "
                f"the stages' mean {fmt_time(ev['mean_stage_time_s'])}")
    ranks = ", ".join(map(str, top.ranks))
    text = {
        "stage": ", ".join(map(str, top.stages)) if top.stages else f"at pp rank {top.pp_rank}",
        "where": f"pp rank {top.pp_rank}, rank{'s' if len(top.ranks) > 1 else ''} {ranks}",
        "stage_flops": fmt_si(values[heavy], "FLOP"),
        "mean_flops": fmt_si(mean, "FLOP"),
        "time_note": note,
    }
    return {"": Measurement(value=ev["heavier_pct"], evidence=ev, impact=clamp01(1.0 - mean / values[heavy]),
                            step=job.step, steps_covered=job.step, text=text)}
