"""A node relay that comes back: its ranks stop being unheard at the first tick they are heard
again, everywhere (the rank rows, the relay_silent hint, the JSON, Prometheus); a relay merely
late raises nothing. Real wire frames and relay stamps (Relays.unstamp, as the collector applies
a batch) into one Model (flowtop.monitor.wiring.make_model), ticked on its own clock every 0.5 s
(tests/test_unheard.py's ``_Job``: ranks 0-2 heard directly, rank 3 through node-b's relay)."""

from __future__ import annotations

from flowtop.export.exporter import snapshot_families
from flowtop.monitor.relays import SILENT_AFTER_S
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json
from test_unheard import _Job, _job

TICK_S = 0.5  # _Job.run ticks the model every 0.5 s


def _shown(snap: MonitorSnapshot) -> dict[str, object]:
    """What each reader sees of rank 3 and of the relay_silent hint at one tick."""
    job, data = _job(snap), to_json(snap)["jobs"][0]
    samples = [s for m in snapshot_families(snap) for s in m.samples]
    return {
        "cut": job.ranks[3].cut is not None,
        "status": job.ranks[3].status,
        "hint": [h.id for h in job.hints if h.id == "relay_silent" and not h.ended],
        "json_unheard": (data["unheard_ranks"], data["unheard_relays"], data["ranks"][3]["status"]),
        "prom_unheard": [s.value for s in samples if s.name == "flowtop_job_unheard_ranks"],
        "prom_hint": [s.value for s in samples if s.name == "flowtop_job_hints" and s.labels["id"] == "relay_silent"],
        "prom_rank3": [s.labels["flowtop_rank_status"] for s in samples
                       if s.name == "flowtop_rank_status" and s.labels["rank"] == "3" and s.value == 1],
    }


HEARD = {"cut": False, "status": "live", "hint": [], "json_unheard": (0, [], "live"), "prom_unheard": [0.0],
         "prom_hint": [], "prom_rank3": ["live"]}
CUT = {"cut": True, "status": "stale", "hint": ["relay_silent"], "json_unheard": (1, ["node-b"], "stale"),
       "prom_unheard": [1.0], "prom_hint": [1.0], "prom_rank3": ["unheard"]}


def test_relay_silent_clears_at_the_first_tick_its_ranks_are_heard_again() -> None:
    """node-b's relay is unheard for SILENT_AFTER_S + 2 s: rank 3 cut off, the hint raised. Its
    batches come again: at the next tick (0.5 s later) rank 3 is live and nothing says it is
    unheard. The hint had stayed ~10 s more (HOLD_S), "silent for 5 s" frozen, while the rank's
    row, the JSON and Prometheus already had it live."""
    j = _Job()
    assert _shown(j.run(3.0)) == HEARD
    j.relayed = False
    ticks = [_shown(j.run(TICK_S)) for _ in range(round((SILENT_AFTER_S + 2.0) / TICK_S))]
    # heard until SILENT_AFTER_S after its last batch, cut from then on (the tick 3 s after it
    # may fall either side: the clock is summed 0.05 s steps), the hint with it
    heard = ticks.index(CUT)
    assert heard in (5, 6) and ticks == [HEARD] * heard + [CUT] * (len(ticks) - heard)
    j.relayed = True
    assert [_shown(j.run(TICK_S)) for _ in range(4)] == [HEARD] * 4


def test_a_relay_merely_late_raises_nothing() -> None:
    """The guard against flapping is on the raise side: a relay whose batches pause for 2.5 s
    (under SILENT_AFTER_S), again and again, never cuts its rank off nor raises the hint."""
    j = _Job()
    j.run(3.0)
    seen = []
    for _ in range(6):
        j.relayed = False
        seen += [_shown(j.run(TICK_S)) for _ in range(5)]  # 2.5 s without a batch
        j.relayed = True
        seen.append(_shown(j.run(TICK_S)))
    assert seen == [HEARD] * 36
