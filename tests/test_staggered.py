"""Stragglers among ranks whose histories have no steps in common: a large job's fast steps under
a long pace (flowtop.monitor.hints.staggered).

The simulated job: RANKS ranks in lockstep at a 10 ms step, each sending its steps every 2 s
(the pace a 4,096-rank job gets) at its own phase, so at a tick the ranks' newest steps are up to
200 apart while a history keeps 120: no step is in every rank's history."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flowtop.monitor.hints import RULES_BY_ID, staggered
from flowtop.monitor.hints.measures_straggler import straggler
from flowtop.monitor.model import Model
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey

RANKS, STEP_S, PACE_S, TICK_S = 24, 0.01, 2.0, 0.5

#: (rank, step) -> the record's step time and lead
Timing = Callable[[int, int], tuple[float, float]]


def _lockstep(rank: int, step: int) -> tuple[float, float]:
    # a little per-rank, per-step noise, as real ranks have (±3 %)
    jitter = ((rank * 7919 + step * 104729) % 61 - 30) / 1000.0
    return STEP_S * (1 + jitter), 0.002 * (1 + jitter)


def _run(timing: Timing, seconds: float, stage: Callable[[int], int] | None = None,
         on_tick: Callable[[Model, MonitorSnapshot], None] | None = None) -> tuple[Model, list[set[str]], list[int]]:
    """Ticks every TICK_S for ``seconds``; each rank flushes its steps every PACE_S at its own
    phase (``stage``: each rank's pipeline stage of 2, in its hello). Returns the model, each
    tick's straggler targets and the since_step of each straggler hint seen."""
    model = make_model()
    keys = [RankKey("big", f"h{r // 8}", 500 + r, r, 0) for r in range(RANKS)]
    for key in keys:
        hello = {"local_rank": key.rank % 8, "world_size": RANKS, "device": "cpu (test)", "probe_version": "t"}
        if stage is not None:
            pp = stage(key.rank)
            hello.update(coords={"dp": [key.rank % (RANKS // 2), RANKS // 2], "pp": [pp, 2]}, pp_stages=[pp])
        model.ingest(wire.decode(wire.encode("hello", key, 0, 0.0, hello)), 0.0)
    sent = [0] * RANKS  # the last step each rank sent
    seq = [0] * RANKS
    flushes = sorted((PACE_S * (r + 0.5) / RANKS + PACE_S * n, r)
                     for r in range(RANKS) for n in range(int(seconds / PACE_S) + 1))
    seen: list[set[str]] = []
    since: list[int] = []
    now, i = 0.0, 0
    while now < seconds:
        now += TICK_S
        while i < len(flushes) and flushes[i][0] <= now:
            t, r = flushes[i]
            i += 1
            newest = int(t / STEP_S)
            recs = []
            for s in range(sent[r] + 1, newest + 1):
                wall, lead = timing(r, s)
                recs.append({"step": s, "wall_s": wall, "tokens": 64, "drops": 0, "lead_s": lead})
            if recs:
                seq[r] += 1
                model.ingest(wire.decode(wire.encode_steps(keys[r], seq[r], t, recs, 0)), t)
                sent[r] = newest
        snap = model.tick(now)
        if on_tick is not None:
            on_tick(model, snap)
        hints = [h for h in snap.jobs[0].hints if h.id == "straggler"]
        seen.append({h.target for h in hints})
        since.extend(h.evidence["since_step"] for h in hints)
    return model, seen, since


def test_the_simulated_ranks_have_no_step_in_common() -> None:
    model, _, _ = _run(_lockstep, 6.0)
    newest = [st.step for st in model.ranks.values()]
    assert max(newest) - min(newest) > 120  # up to 200 apart, against 120 steps of history
    snap = model.tick(6.5)
    firsts = [r.history.steps[0] for r in snap.jobs[0].ranks]
    lasts = [r.history.steps[-1] for r in snap.jobs[0].ranks]
    assert max(firsts) > min(lasts)


def test_a_rank_whose_forward_ends_late_is_found_though_no_step_is_common() -> None:
    """Rank 5 finishes its forward 4 ms after the others each step (40 % of the step): the
    others wait for it in the all-reduce, their step times equal its own."""
    def late(rank: int, step: int) -> tuple[float, float]:
        wall, lead = _lockstep(rank, step)
        return wall, lead + (0.004 if rank == 5 else 0.0)

    model, seen, since = _run(late, 12.0)
    assert set().union(*seen[-8:]) == {"rank 5"}
    # since when: the step at which it was first measured behind, the same at every tick
    assert len(set(since[-8:])) == 1
    assert all(s == {"rank 5"} for s in seen[-4:])  # it stays (the hysteresis of one rank's figure)
    snap = model.tick(12.5)
    hint = [h for h in snap.jobs[0].hints if h.id == "straggler"][0]
    assert hint.evidence["basis"] == "lead"
    # 4 ms of a 10 ms step, as the records say (±3 % noise on both)
    assert 35.0 <= hint.evidence["slower_pct"] <= 45.0
    assert abs(hint.evidence["lead_lag_s"] - 0.004) < 0.0005
    assert hint.evidence["window_steps"] == 20  # the rule's window_steps
    assert hint.evidence["since_step"] == since[-1]


def test_a_later_pipeline_stage_is_no_straggler_though_no_step_is_common() -> None:
    """A large pipelined job's second stage ends its forward later by design (it waits for the
    first stage's activations): compared with the whole job its ranks read as late, in the
    windows read when no step is common too (a review). Leads compare within a stage; a rank
    late within its stage is still found."""
    def piped(late_rank: int | None) -> Timing:
        def timing(rank: int, step: int) -> tuple[float, float]:
            wall, lead = _lockstep(rank, step)
            extra = 0.004 if rank >= RANKS // 2 else 0.0  # stage 1
            return wall, lead + extra + (0.003 if rank == late_rank else 0.0)
        return timing

    stage = lambda rank: int(rank >= RANKS // 2)  # noqa: E731
    _, seen, _ = _run(piped(None), 12.0, stage)
    assert set().union(*seen[-8:]) == set()
    _, seen, _ = _run(piped(17), 12.0, stage)
    assert set().union(*seen[-8:]) == {"rank 17"}
    _, seen, _ = _run(piped(None), 12.0)  # the same job, its stages unknown: the second stage reads late
    assert len(set().union(*seen[-8:])) >= RANKS // 4


def test_a_late_rank_of_a_job_viewed_in_turns_is_found_from_histories_taken_when_measured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same job viewed in turns (4 ticks a round): its published views hold only what the UI
    shows, and the rule reads every rank's whole history as it is when it measures."""
    from flowtop.monitor import rotation

    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 6)

    def late(rank: int, step: int) -> tuple[float, float]:
        wall, lead = _lockstep(rank, step)
        return wall, lead + (0.004 if rank == 5 else 0.0)

    model, seen, _ = _run(late, 16.0)
    snap = model.tick(16.5)
    assert model.ticks_per_round(RANKS) == 4
    assert not any(r.history.reached or r.history.lead_s for r in snap.jobs[0].ranks)
    assert set().union(*seen[-16:]) == {"rank 5"}


def test_the_row_of_a_rank_a_hint_names_is_current_at_every_tick_of_a_job_viewed_in_turns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In turns (4 ticks a round) a rank's row keeps its figures of up to a round before; the rank
    a straggler hint names has its view rebuilt at every tick: its row's last step time is its
    newest record's from the tick after the hint on, while other rows lag behind theirs."""
    from flowtop.monitor import rotation

    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 6)

    def late(rank: int, step: int) -> tuple[float, float]:
        wall, lead = _lockstep(rank, step)
        return wall, lead + (0.004 if rank == 5 else 0.0)

    hinted_before: list[bool] = []
    current: dict[int, list[bool]] = {5: [], 7: []}  # rank -> its row current at each tick after a hint

    def look(model: Model, snap: MonitorSnapshot) -> None:
        if hinted_before and hinted_before[-1]:
            for r in snap.jobs[0].ranks:
                if r.rank in current:
                    newest = next(st for st in model.ranks.values() if st.key.rank == r.rank).steps.last()
                    current[r.rank].append(r.history.step_time_s[-1] == newest.wall_s)
        hinted_before.append(any(h.target == "rank 5" for h in snap.jobs[0].hints))

    _run(late, 16.0, on_tick=look)
    assert len(current[5]) >= 8
    assert all(current[5])
    assert not all(current[7])  # the turns are at work: another row reads a round old


def test_a_rank_whose_steps_take_longer_is_found_though_no_step_is_common() -> None:
    def slow(rank: int, step: int) -> tuple[float, float]:
        wall, lead = _lockstep(rank, step)
        return (wall * 1.5 if rank == 17 else wall), lead

    _, seen, _ = _run(slow, 12.0)
    assert set().union(*seen[-8:]) == {"rank 17"}


def test_healthy_ranks_and_a_job_wide_slowdown_make_no_straggler() -> None:
    """Every rank's steps take 30 % longer from step 500 on: ranks compared at different steps
    would read as 30 % slower or faster by their phase; compared at the same steps, none is."""
    def slower_later(rank: int, step: int) -> tuple[float, float]:
        wall, lead = _lockstep(rank, step)
        return (wall * 1.3, lead * 1.3) if step >= 500 else (wall, lead)

    _, seen, _ = _run(slower_later, 12.0)
    assert not set().union(*seen)


def _chosen(runs: list[range]) -> list[int | None]:
    return staggered.choose_windows([r.start for r in runs], [r.stop - 1 for r in runs], 20)


def test_each_rank_is_read_in_a_window_many_ranks_covered_whole() -> None:
    # steps 100-119 are in all four histories: one window for all
    assert _chosen([range(0, 120), range(60, 180), range(100, 220), range(100, 220)]) == [100] * 4
    # two windows: D..H share 60-99 (80-99, the newer, is picked first: five ranks); A, B and C
    # then 40-59 (with D: four ranks). D covers both and is read in the one more ranks covered.
    three, five = [range(0, 60)] * 3, [range(40, 100)] + [range(60, 120)] * 4
    assert _chosen(three + five) == [40, 40, 40] + [80] * 5
    # rank 3 covers 40-79, shared with rank 0 alone: two ranks are not a group (it is left out)
    assert _chosen([range(0, 60), range(0, 20), range(0, 20), range(40, 80)]) == [0, 0, 0, None]
    # no whole window: 5-24 covers none of the grid's
    assert _chosen([range(5, 25)] * 3) == [None] * 3


def test_a_rank_whose_steps_have_a_gap_is_read_after_it() -> None:
    assert staggered.tail_start([1, 2, 3, 7, 8, 9, 10]) == 3
    assert staggered.tail_start([4, 5, 6]) == 0
    assert staggered.tail_start([4, 9]) == 1
    assert staggered.tail_start([]) == 0


def test_windows_past_a_handful_are_not_read() -> None:
    """Ranks thousands of steps apart are not in lockstep: at most MAX_WINDOWS windows (each a
    pass over every rank), three ranks each."""
    runs = [range(1000 * g, 1000 * g + 120) for g in range(20) for _ in range(3)]
    chosen = _chosen(runs)
    assert len({w for w in chosen if w is not None}) == staggered.MAX_WINDOWS
    assert sum(w is not None for w in chosen) == 3 * staggered.MAX_WINDOWS


def test_ranks_with_some_steps_in_common_are_compared_on_them() -> None:
    """A rank whose first frames came late (15 steps in common with the others, fewer than the
    rule's 20) is compared with them over those steps, as before: every rank measured (the late
    one too), over at most the 15 steps; the grid windows are for ranks with no step in common."""
    from test_hints_factories import history, job, rank

    ranks = [rank(r, hist=history(100, 0.1, slow_from=1 if r == 2 else None, slow_step_s=0.15)) for r in range(3)]
    ranks.append(rank(3, hist=history(15, 0.1, first=86)))
    measured = straggler(RULES_BY_ID["straggler"], job(*ranks), 0.0)
    assert all(m is not None and m.steps_covered <= 15 for m in measured.values()), measured
    slow = measured["rank 2"]
    assert slow is not None and slow.evidence["slower_pct"] == pytest.approx(50.0)
