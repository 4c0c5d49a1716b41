"""Measures over node relays: ranks unheard behind a relay that fell silent or closed."""

from __future__ import annotations

from dataclasses import dataclass

from flowtop.monitor.format import fmt_ranks
from flowtop.monitor.hintclock import HintClock
from flowtop.monitor.hints.base import Measurement
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.relayviews import unheard_hosts
from flowtop.monitor.snapshot import JobSnapshot


@dataclass(frozen=True, slots=True)
class _Relay:
    """One relay that ranks of the job are cut off behind, and those ranks (in job order)."""

    host: str
    silent_since: float | None  # monitor time it was last heard; None: closed
    ranks: tuple[int, ...]

    @property
    def phrase(self) -> str:
        """"relay node2 (rank 2)", "relay node3 (closed; ranks 4-5)": how long a silent one has
        been silent is the summary's growing figure, said at display (HintClock)."""
        state = "" if self.silent_since is not None else "closed; "
        return f"relay {self.host} ({state}rank{'s' if len(self.ranks) > 1 else ''} {fmt_ranks(list(self.ranks))})"

    def evidence(self) -> dict[str, object]:
        return {"host": self.host, "state": "closed" if self.silent_since is None else "silent",
                "ranks": list(self.ranks)}


def relay_silent(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Job: how many of its rank processes are unheard behind a silent or closed relay
    (JobSnapshot.unheard) while a heard rank still steps, or when no rank is heard at all (every
    relay silent: measured while the job is stale, SILENCE_RULES); 0 else (the hint clears).

    Such ranks may train on: the job's figures leave them out (flowtop.monitor.accounting), and
    this names the relay(s) to look at. With no heard rank stepping the job is hung or over, which
    the hang rules or its end say; a cut rank's relay is judged by its RelayCut (since when). The
    seconds since the longest-silent relay was heard grow: the hint holds since when (HintClock),
    and its readers say them at a snapshot's time, as a hang hint's (flowtop.monitor.hintclock)."""
    cut = job.unheard
    # "the other N step on": the heard ranks that step, not those done or stalled
    stepping = sum(1 for r in job.ranks if r.status == "live" and r.cut is None)
    every = len(cut) == len(job.ranks)  # no rank heard: no hang rule judges them, this says why
    if not cut or not (stepping or every):
        return {"": Measurement(value=0.0, evidence={"unheard_ranks": 0}, impact=0.0, step=job.step)}
    ranks: dict[tuple[str, float | None], list[int]] = {}
    for r in cut:
        if r.cut is not None:  # always: JobSnapshot.unheard holds the cut ranks only (for the type checker)
            ranks.setdefault((r.cut.host, r.cut.silent_since), []).append(r.rank)
    relays = [_Relay(host, since, tuple(rs)) for (host, since), rs in ranks.items()]
    hosts = list(unheard_hosts([r.cut for r in cut]))  # as the job's unheard_relays
    silent = [r.silent_since for r in relays if r.silent_since is not None]
    ev: dict[str, object] = {
        "unheard_ranks": len(cut),
        "heard_ranks": len(job.ranks) - len(cut),
        "stepping_ranks": stepping,
        "relays": [r.evidence() for r in relays],
        "hosts": hosts,
    }
    text = {"relays_phrase": ", ".join(r.phrase for r in relays), "hosts": ", ".join(hosts),
            "ranks_word": "rank" if len(cut) == 1 else "ranks",
            "silent_word": "silent" if len(silent) == 1 else "the longest silent"}
    # silent_s = now - the longest-silent relay's last report, at display; none for closed relays only
    clock = HintClock(None, 1.0, min(silent)) if silent else None
    if clock is None:
        ev["silent_s"] = None
    variant = "_".join(word for word, on in (("all", every), ("silent", bool(silent))) if on)
    return {"": Measurement(value=float(len(cut)), evidence=ev, impact=len(cut) / len(job.ranks),
                            step=job.step, steps_covered=job.step, text=text,
                            variant=variant, clock=clock)}
