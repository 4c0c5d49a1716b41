"""A job larger than RANKS_PER_TICK (flowtop.monitor.model): each tick rebuilds the full views of its
share of the ranks, the others get their step and liveness, and its hints run every ``spread``
ticks — with what the ranks sent all showing within one round."""

from __future__ import annotations

import pytest

from flowtop.monitor import accounting, rotation
from flowtop.monitor.model import Model
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey

RANKS, PER_TICK = 10, 4  # spread: ceil(10 / 4) = 3 ticks


@pytest.fixture
def small_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", PER_TICK)


def _feed(model, keys, first_step: int, now: float, wall: dict[int, float] | None = None) -> None:
    for key in keys:
        recs = [{"step": s, "wall_s": (wall or {}).get(key.rank, 0.1), "tokens": 32, "drops": 0}
                for s in range(first_step, first_step + 5)]
        model.ingest(wire.decode(wire.encode_steps(key, first_step, now, recs, 0)), now)


def test_a_large_job_spreads_full_views_and_hints_over_ticks(small_ticks: None) -> None:
    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    for key in keys:
        model.ingest(wire.decode(wire.encode("hello", key, 0, 1.0, {"local_rank": 0, "world_size": RANKS,
                                                                      "device": "cpu (test)", "probe_version": "t"})), 1.0)
    engine = model._hint_engine
    measured: dict[str, list[int]] = {r.id: [] for r in engine.rules}

    def recorded(rule_id, fn):
        return lambda rule, job, now: (measured[rule_id].append(model.ticks), fn(rule, job, now))[1]

    engine._measures = {k: recorded(k, fn) for k, fn in engine._measures.items()}
    _feed(model, keys, 1, 2.0)
    model.tick(2.0)  # the first tick builds every view (none existed)
    assert model.views.built == RANKS
    built, now = model.views.built, 2.0
    for step in range(6, 36, 5):  # six ticks, every rank sends 5 new steps before each
        now += 0.5
        _feed(model, keys, step, now)
        snap = model.tick(now)
        ranks = snap.jobs[0].ranks
        assert [r.step for r in ranks] == [step + 4] * RANKS  # every rank's step is current
        assert all(r.heard_at == now for r in ranks)
        # a third of the ranks (those whose turn it is) were rebuilt in full
        assert model.views.built - built == len([i for i in range(RANKS) if (i + model.ticks) % 3 == 0])
        built = model.views.built
    assert model.views.refreshed >= 6 * (RANKS - 4)
    # every rule is measured every third tick, all at the round's first (t % 3 == 0): one share
    # (a share every second tick at most, 3 // 2), its histories taken at the tick before
    assert {rule.id: measured[rule.id] for rule in engine.rules} == {rule.id: [3, 6] for rule in engine.rules}
    # within one round (3 ticks) every rank's full figures are rebuilt: a rank whose steps got
    # slower shows its new median step time (over its last 32 steps) within a round of it
    for step in range(36, 66, 5):  # six more ticks, rank 3's steps now take 0.3 s
        now += 0.5
        _feed(model, keys, step, now, {3: 0.3})
        snap = model.tick(now)
    times = {r.rank: r.step_time_s for r in snap.jobs[0].ranks}
    assert times[3] == pytest.approx(0.3) and times[2] == pytest.approx(0.1)  # 25+ of rank 3's last 32: 0.3 s


def test_a_job_within_the_budget_is_rebuilt_and_evaluated_every_tick(small_ticks: None) -> None:
    model = make_model()
    keys = [RankKey("small", "h", 600 + r, r, 0) for r in range(PER_TICK)]
    _feed(model, keys, 1, 2.0)
    model.tick(2.0)
    for i, step in enumerate(range(6, 21, 5)):
        _feed(model, keys, step, 2.5 + i / 2)
        model.tick(2.5 + i / 2)
    assert model.views.built == PER_TICK * 4 and model.views.refreshed == 0


def test_a_bye_in_a_large_job_rebuilds_only_this_ticks_share(small_ticks: None) -> None:
    """The last look a rank's bye takes at its job's hints rebuilds the views of the ranks whose
    turn it is, not all of them (at 4,096 ranks that was a second of the data thread per bye)."""
    model = make_model()
    keys = [RankKey("big", "h", 700 + r, r, 0) for r in range(RANKS)]
    now = 2.0
    for step in range(1, 31, 5):
        _feed(model, keys, step, now)
        model.tick(now)
        now += 0.5
    _feed(model, keys, 31, now)
    built = model.views.built
    model.ingest(wire.decode(wire.encode("bye", keys[0], 99, now, {"reason": "exit", "steps": 35, "drops": 0})), now)
    assert model.views.built - built <= -(-RANKS // 3) + 1  # a third of the job (and the rank leaving)


@pytest.mark.parametrize(("spread", "due"), [(2, {0: (0, 1)}), (3, {0: (0, 1)}), (4, {0: (0, 2), 2: (1, 2)}),
                                             (5, {0: (0, 2), 2: (1, 2)}), (6, {0: (0, 3), 2: (1, 3), 4: (2, 3)}),
                                             (8, {0: (0, 4), 2: (1, 4), 4: (2, 4), 6: (3, 4)}),
                                             (64, {0: (0, 4), 16: (1, 4), 32: (2, 4), 48: (3, 4)})])
def test_a_large_jobs_rules_are_measured_in_up_to_four_shares_a_round(spread: int, due: dict) -> None:
    for tick in range(3 * spread):
        assert rotation.hint_share(tick, spread) == due.get(tick % spread)
        # the tick before a share's takes its histories, and never has a share of its own
        assert rotation.prepares(tick, spread) == ((tick + 1) % spread in due)
        assert not (rotation.prepares(tick, spread) and rotation.hint_share(tick, spread))


def _rule(rule_id: str, cost: float, hidden_by: str | None = None):
    from dataclasses import replace

    from flowtop.monitor.hints.rules import RULES_BY_ID
    params = {**RULES_BY_ID["hang_rank"].params, "hidden_by": hidden_by} if hidden_by else {}
    base = RULES_BY_ID["hang_rank" if hidden_by else "hang_all"]
    return replace(base, id=rule_id, cost=cost, params={**base.params, **params})


def test_the_shares_of_the_rules_are_balanced_by_cost() -> None:
    from flowtop.monitor.hints.engine import HintEngine

    rules = [_rule("a", 10), _rule("b", 1, hidden_by="a"), _rule("c", 8), _rule("d", 3), _rule("e", 3), _rule("f", 2)]
    engine = HintEngine(rules, measures={r.id: lambda rule, job, now: {} for r in rules})
    # groups a+b (11), c (8), d (3), e (3), f (2), the costliest first, each to the cheapest share
    # so far (the lower of equals): two shares 11 | 8, 11 | 11 (d), 14 (e) | 11, 14 | 13 (f)
    assert engine.plan(2) == (0, 0, 1, 1, 0, 1)
    # three: 11 | 8 | 3 (d), 6 (e), 8 (f): a with the rule it hides, c alone, the small ones together
    assert engine.plan(3) == (0, 0, 1, 2, 2, 2)
    assert engine.plan(1) == (0,) * 6 and engine.plan(6) == (0, 0, 1, 2, 3, 4)


def test_the_rules_table_in_four_shares() -> None:
    from flowtop.monitor.hints.engine import HintEngine

    engine = HintEngine()
    plan = engine.plan(4)
    shares = [sorted(r.id for r, k in zip(engine.rules, plan) if k == s) for s in range(4)]
    # by the costs in the table (ms at 4,096 ranks): hang_all with hang_rank, which it hides, 115;
    # the straggler 104; the input wait 68, with the cheap rules filling the two lighter shares
    assert shares[0] == ["hang_all", "hang_rank"] and shares[1] == ["straggler"] and "input_wait" in shares[2]
    assert [sum(r.cost for r, k in zip(engine.rules, plan) if k == s) for s in range(4)] == [115, 104, 74, 74]


def test_what_a_tick_takes_serves_the_next_tick_alone_over_the_same_ranks() -> None:
    ranks = [object(), object()]
    held = rotation.Prepared[str](within_s=0.75)
    held.keep("j", 4, 10.0, list(ranks), "judged")
    assert held.take("j", 5, 10.5, ranks) == (10.0, "judged") and len(held) == 0  # taken once
    for tick, now, seen in ((6, 10.5, ranks), (5, 11.0, ranks), (5, 10.5, ranks[:1]), (5, 10.5, ranks[::-1]),
                            (5, 10.5, [ranks[0], object()])):
        held.keep("j", 4, 10.0, list(ranks), "judged")
        assert held.take("j", tick, now, seen) is None  # not the next tick, too late, other ranks
    held.keep("j", 4, 10.0, list(ranks), "judged")
    held.expire(4)
    assert len(held) == 1
    held.expire(5)  # the end of tick 5, which did not take it
    assert len(held) == 0 and held.take("j", 5, 10.5, ranks) is None


def test_the_tick_before_a_share_takes_the_histories_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A share's tick measured its rules and took every rank's history at once (~120 ms each at
    4,096 ranks); the tick before it takes the histories, unless a rank's bye came between or a
    rank joined."""
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 3)  # 10-12 ranks: rounds of 4 ticks, shares at 0 and 2
    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", 900 + r, r, 0) for r in range(RANKS)]
    taken: list[int] = []
    as_now = Model._as_now
    monkeypatch.setattr(Model, "_as_now", staticmethod(lambda snap, states: (taken.append(model.ticks),
                                                                            as_now(snap, states))[1]))
    measured: list[tuple[int, int]] = []  # (tick, newest step of rank 3 the rules read)
    engine = model._hint_engine
    evaluate = engine.evaluate
    engine.evaluate = lambda job, now, phase=None: (  # type: ignore[method-assign]
        measured.append((model.ticks, job.ranks[3].history.reached[-1][0])), evaluate(job, now, phase))[1]
    now, step = 2.0, 1

    def tick(ranks: list[RankKey]) -> None:
        nonlocal now, step
        _feed(model, ranks, step, now)
        model.tick(now)
        now, step = now + 0.5, step + 5

    for _ in range(10):
        tick(keys)
    assert taken == [1, 3, 5, 7, 9]  # only at the tick before a share's (t % 4 == 1 or 3), never at a share's
    # tick t's newest step is 5 t: each share read what the tick before it took
    assert measured == [(2, 5), (4, 15), (6, 25), (8, 35), (10, 45)]
    assert model._hints_seen["big"] == [2.0 + 0.5 * 6, 2.0 + 0.5 * 8]  # as of ticks 7 and 9
    # a rank's bye between the two ticks voids what was taken: the share's tick takes its own
    tick(keys)
    assert model.ticks == 11 and taken[-1] == 11
    model.ingest(wire.decode(wire.encode("bye", keys[7], 99, now, {"reason": "exit", "steps": step, "drops": 0})), now)
    tick(keys[:7])
    assert taken[-1] == 12 and measured[-1] == (12, step - 1)
    # so does a rank that joins between them
    tick(keys[:7])
    assert taken[-1] == 13
    tick([*keys[:7], RankKey("big", "h9", 999, 10, 0)])
    assert taken[-1] == 14 and measured[-1] == (14, step - 1)
    assert measured[-2] == (12, step - 11)  # nothing measured at 13
