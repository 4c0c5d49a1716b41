"""Measures over rank identity: several processes claiming one rank number."""

from __future__ import annotations

from flowtop.monitor.hints.base import Measurement
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.snapshot import JobSnapshot


def rank_conflict(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per rank number claimed by more than one process: how many other processes claim it.

    The model keeps such processes apart (RankSnapshot.conflict). The measure's step is the
    step every claimant has reached, so a provisional claim that ends before its first step
    (a probe that then reads its rank from the process group) does not fire the hint."""
    out: dict[str, Measurement | None] = {}
    for n in sorted({r.rank for r in job.ranks if r.conflict}):
        rows = [r for r in job.ranks if r.rank == n and r.conflict]
        step = min(r.step for r in rows)
        ev = {
            "other_processes": len(rows) - 1,
            "processes_n": len(rows),
            "pids": [r.pid for r in rows],
            "hosts": sorted({r.host for r in rows}),
        }
        text = {"job": job.job, "claimants": ", ".join(f"{r.host} pid {r.pid}" for r in rows)}
        out[f"rank {n}"] = Measurement(value=float(len(rows) - 1), evidence=ev, impact=0.0, step=step,
                                       steps_covered=step, text=text)
    return out
