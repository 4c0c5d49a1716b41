"""Measures over node relays: ranks unheard behind a relay that fell silent or closed."""

from __future__ import annotations

from typing import Any

from flowtop.monitor.format import fmt_ranks
from flowtop.monitor.hints.base import Measurement
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.snapshot import JobSnapshot


def relay_silent(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Job: how many of its rank processes are unheard behind a silent or closed relay
    (JobSnapshot.unheard) while a heard rank still steps; 0 else (the hint clears).

    Such ranks may train on: the job's figures leave them out (flowtop.monitor.accounting), and
    this names the relay(s) to look at. With no heard rank stepping the job is hung or over, which
    the hang rules or its end say; a cut rank's relay is judged by its RelayCut (since when)."""
    cut = job.unheard
    heard = len(job.ranks) - len(cut)
    if not cut or not any(r.status == "live" and r.cut is None for r in job.ranks):
        return {"": Measurement(value=0.0, evidence={"unheard_ranks": 0}, impact=0.0, step=job.step)}
    relays: dict[str, dict[str, Any]] = {}
    for r in cut:
        c = r.cut
        if c is None:  # never: JobSnapshot.unheard holds the cut ranks only (for the type checker)
            continue
        rec = relays.setdefault(c.host, {
            "host": c.host,
            "state": "closed" if c.silent_since is None else "silent",
            "silent_s": None if c.silent_since is None else max(0.0, now - c.silent_since),
            "ranks": [],
        })
        rec["ranks"].append(r.rank)
    phrases = []
    for rec in relays.values():
        when = "closed" if rec["silent_s"] is None else f"silent for {rec['silent_s']:.0f} s"
        phrases.append(f"relay {rec['host']} ({when}; rank{'s' if len(rec['ranks']) > 1 else ''} "
                       f"{fmt_ranks(rec['ranks'])})")
    silent = [rec["silent_s"] for rec in relays.values() if rec["silent_s"] is not None]
    ev = {
        "unheard_ranks": len(cut),
        "heard_ranks": heard,
        "relays": list(relays.values()),
        "hosts": sorted(relays),
        "silent_s": max(silent) if silent else None,
    }
    text = {"relays_phrase": ", ".join(phrases), "hosts": ", ".join(sorted(relays)),
            "ranks_word": "rank" if len(cut) == 1 else "ranks"}
    return {"": Measurement(value=float(len(cut)), evidence=ev, impact=len(cut) / len(job.ranks),
                            step=job.step, steps_covered=job.step, text=text)}
