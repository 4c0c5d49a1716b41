"""Measure of step-time spikes: the time a job loses to steps far slower than its usual one."""

from __future__ import annotations

import statistics
from typing import Any

from flowtop.monitor.hints.base import Measurement, clamp01, finite_sum, latest_ranks, safe_div
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.snapshot import ENDED, JobSnapshot, RankSnapshot

#: Fewest slow steps in the window for a pattern: one-off slow steps are no stall pattern (the
#: first steps' compilation and warm-up, a checkpoint, and the probe's own sampled work: a kernel
#: window every ~280 steps and a FLOP count every 500 on a small step cost 0.15 s each).
MIN_SPIKES = 3
#: Steps before the window may start: a run's first steps (allocation, compilation) are slow.
WARMUP_STEPS = 20
#: Ranks read at most, evenly spaced: in synchronous training every rank's step waits for the
#: slowest, so a stall anywhere shows on all of them; thousands read would cost for nothing.
SAMPLED_RANKS = 64


def _sampled(job: JobSnapshot) -> list[RankSnapshot]:
    if job.status in ENDED:
        return []
    ranks = [r for r in latest_ranks(job) if r.status not in ENDED]
    every = max(1, -(-len(ranks) // SAMPLED_RANKS))
    return ranks[::every]


def _spikes(times: list[float], factor: float) -> tuple[float, int, float, float] | None:
    """(share of the time beyond ``factor`` × the median step, steps beyond it, the longest step,
    the median step) over ``times``; None without a positive median."""
    med = statistics.median(times)
    if not med > 0:
        return None
    cut = factor * med
    over = [t for t in times if t > cut]
    lost = finite_sum([t - cut for t in over])
    return safe_div(lost, finite_sum(times)), len(over), max(times), med


def step_spikes(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Job: over each sampled running rank's last ``window_steps`` steps (past WARMUP_STEPS, with
    MIN_SPIKES slow ones at least), Σ time beyond ``factor`` × its median step ÷ Σ step time; the
    rank with the most lost (FLOP/s and MFU divide by the median step: periodic stalls do not show
    in them)."""
    n = max(rule.window_steps, 1)
    factor = float(rule.params["factor"])
    best: tuple[float, int, float, float] | None = None
    worst: RankSnapshot | None = None
    for r in _sampled(job):
        times, steps = list(r.history.step_time_s[-n:]), r.history.steps
        if len(times) < n or len(steps) < n or steps[-n] <= WARMUP_STEPS:
            continue  # too few steps yet, or the run's first ones
        found = _spikes(times, factor)
        if found is not None and found[1] >= MIN_SPIKES and (best is None or found[0] > best[0]):
            best, worst = found, r
    if best is None or worst is None:
        return {}
    share, count, longest, med = best
    ev: dict[str, Any] = {"spike_pct": 100.0 * share, "spikes": count, "max_step_s": longest,
                          "median_step_time_s": med, "window_steps": n, "rank": worst.rank}
    return {"": Measurement(value=ev["spike_pct"], evidence=ev, impact=clamp01(share), step=worst.step,
                            steps_covered=n)}
