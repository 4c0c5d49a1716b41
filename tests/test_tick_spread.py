"""A job larger than RANKS_PER_TICK (flowtop.monitor.model): each tick rebuilds the full views of its
share of the ranks, the others get their step and liveness, and its hints run every ``spread``
ticks — with what the ranks sent all showing within one round."""

from __future__ import annotations

import pytest

from flowtop.monitor import rotation
from flowtop.monitor.model import Model
from flowtop.monitor.snapshot import stalled_reason
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
    # (relay_silent's 0.5 among them)
    assert shares[0] == ["hang_all", "hang_rank"] and shares[1] == ["straggler"] and "input_wait" in shares[2]
    assert [sum(r.cost for r, k in zip(engine.rules, plan) if k == s) for s in range(4)] == [115, 104, 76, 74.5]


def test_what_a_tick_takes_serves_the_next_tick_alone_over_the_same_ranks() -> None:
    ranks = [object(), object()]
    held = rotation.Prepared[str](within_s=0.75)
    held.keep("j", 4, 10.0, list(ranks), "judged")
    assert held.take("j", 5, 10.5, ranks) == rotation.Taken(10.0, "judged") and len(held) == 0  # taken once
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


def test_a_bye_looks_again_unless_every_share_saw_its_last_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's last look (its bye) is skipped only when every share of the rules measured the job
    from histories taken after the rank's last step: after one share, the other has not seen it."""
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 3)  # 10 ranks: rounds of 4 ticks, shares at 0 and 2
    model = make_model()
    keys = [RankKey("big", "h", 800 + r, r, 0) for r in range(RANKS)]
    engine = model._hint_engine
    whole: list[float] = []
    evaluate = engine.evaluate
    engine.evaluate = lambda job, now, phase=None: (phase or whole.append(now), evaluate(job, now, phase))[1]
    now, step = 2.0, 1
    while True:  # run until a round's last tick (t % 4 == 3: share 0's histories taken)
        _feed(model, keys, step, now)
        model.tick(now)
        now, step = now + 0.5, step + 5
        if model.ticks > 4 and model.ticks % 4 == 3:
            break
    _feed(model, keys[:2], step, now)  # ranks 0 and 1 step once more
    for _ in range(3):  # share 0 (from histories taken before that step), histories taken, share 1
        model.tick(now)
        now += 0.5
    assert rotation.hint_share(model.ticks, 4) == (1, 2)
    model.ingest(wire.decode(wire.encode("bye", keys[0], 99, now, {"reason": "exit", "steps": 99, "drops": 0})), now)
    assert whole == [now]  # share 0 never saw rank 0's last step: a last look
    for _ in range(2):
        now += 0.5
        model.tick(now)  # histories taken, share 0: every rule has now seen rank 1's last step
    model.ingest(wire.decode(wire.encode("bye", keys[1], 99, now, {"reason": "exit", "steps": 99, "drops": 0})), now)
    assert whole == [now - 1.0]  # no second look


_HELLO = {"local_rank": 0, "world_size": RANKS, "device": "cpu (test)", "probe_version": "t"}


def _stepped_job(pid0: int) -> tuple[Model, list[RankKey], float]:
    """A large job whose ranks have a FLOP count (figures that a stall zeroes) and stepped for 3 s
    of ticks: (model, keys, the instant after its last step's tick)."""
    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", pid0 + r, r, 0) for r in range(RANKS)]
    now = 2.0
    for key in keys:
        model.ingest(wire.decode(wire.encode("flops", key, 0, now, {
            "step": 2, "model_flops": 1e9, "executed_flops": 1e9, "attention": "full", "dtype": "fp32",
            "peak_flops": 1e12, "peak_source": "test", "uncounted": {}, "tokens": 32})), now)
    for step in range(1, 31, 5):
        _feed(model, keys, step, now)
        model.tick(now)
        now += 0.5
    return model, keys, now


def test_a_hung_large_job_costs_a_tick_no_more_than_a_healthy_one(small_ticks: None) -> None:
    """Every rank of a large job stops stepping but keeps talking (hung in a collective; or a
    backlog that holds their steps back): the tick the stall starts rebuilds every view (their
    status changes), the ticks after it only the ranks whose turn it is — not all of them at each
    tick, which at 4,096 ranks made ticks of the whole job exactly when the user needs the monitor."""
    model, keys, now = _stepped_job(900)
    last_step_at = now - 0.5
    statuses, rebuilt, job_stall = [], [], []
    for _ in range(20):  # 10 s of heartbeats and no step: stalled past the 5 s limit
        for key in keys:
            model.ingest(wire.decode(wire.encode("hello", key, 0, now, _HELLO)), now)
        built = model.views.built
        snap = model.tick(now)
        statuses.append({r.status for r in snap.jobs[0].ranks})
        rebuilt.append(model.views.built - built)
        job_stall.append((now - last_step_at, snap.jobs[0].flops.stalled_s(now), snap.jobs[0].flops.reason_at(now)))
        now += 0.5
    start = statuses.index({"stalled"})
    assert statuses[start:] == [{"stalled"}] * (20 - start) and start > 0
    assert rebuilt[start] == RANKS  # the stall starts: every view shows it
    # then a third of the ranks a tick (their turn, (rank + tick) % 3 == 0), as for a healthy job
    assert all(n <= -(-RANKS // 3) for n in rebuilt[start + 1:]), rebuilt
    # every rank's view (its "no step for N s") rebuilt once a round: never more than a round old
    assert sum(rebuilt[start + 1:start + 4]) == RANKS, rebuilt
    ranks = snap.jobs[0].ranks
    assert all(r.tokens_per_s == 0.0 and r.flops.flops_per_s == 0.0 and r.flops.mfu == 0.0 for r in ranks)
    # the job's "no step for N s" is the time since its newest step now, at every tick, not a round old
    for since, stalled_s, reason in job_stall[start:]:
        assert stalled_s == pytest.approx(since) and reason == stalled_reason(since)


def test_a_job_with_a_dead_rank_and_the_others_hung_says_how_long_since_its_newest_step(small_ticks: None) -> None:
    """The usual hang: one rank dies (silent: stale), the others wait for it in a collective
    (talking, no step: stalled). The job's "no step for N s" is the time since its newest step at
    every tick, not a light copy's figure of a round ago."""
    model, keys, now = _stepped_job(950)
    last_step_at = now - 0.5
    seen = []
    for _ in range(20):  # rank 0 silent; the others heartbeat without a step
        for key in keys[1:]:
            model.ingest(wire.decode(wire.encode("hello", key, 0, now, _HELLO)), now)
        snap = model.tick(now)
        statuses = {r.status for r in snap.jobs[0].ranks}
        if statuses == {"stale", "stalled"}:
            seen.append((now - last_step_at, snap.jobs[0].flops.stalled_s(now)))
        now += 0.5
    assert len(seen) >= 5
    for since, stalled_s in seen:
        assert stalled_s == pytest.approx(since)


def test_between_turns_a_quiet_rank_costs_nothing_until_the_clock_changes_its_status(
        small_ticks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 ranks, 4 a tick: a round of 3 ticks. Every rank sends once (t = 2) and falls silent. A
    rank between its turns keeps the very same view object, without its stall being worked out
    again, until the clock makes it stale (more than STALE_AFTER_S = 5 s after its last frame:
    at the tick of t = 7.5), when every rank's view changes at once, turn or not."""
    from flowtop.monitor import rankstate

    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    _feed(model, keys, 1, 2.0)
    prev = {r.rank: r for r in model.tick(2.0).jobs[0].ranks}
    looks = [0]
    liveness = rankstate.liveness  # a view's look at a rank's stall and status (RankViews.view, _light)
    monkeypatch.setattr(rankstate, "liveness", lambda *a: (looks.__setitem__(0, looks[0] + 1), liveness(*a))[1])
    now = 2.0
    for _ in range(10):  # ticks at 2.5 ... 7.0
        now += 0.5
        looks[0] = 0
        ranks = model.tick(now).jobs[0].ranks
        turn = {i for i in range(RANKS) if (i + model.ticks) % 3 == 0}
        assert [r.status for r in ranks] == ["live"] * RANKS
        assert all(r is prev[r.rank] for r in ranks if r.rank not in turn)
        if now < 7.0:  # each look saw when its status could change (at 7.0, to be safe, it looks again)
            assert looks[0] == len(turn), (now, looks[0], turn)
        prev = {r.rank: r for r in ranks}
    ranks = model.tick(7.5).jobs[0].ranks
    assert [r.status for r in ranks] == ["stale"] * RANKS


def test_a_view_names_the_relay_its_rank_was_last_heard_through(small_ticks: None) -> None:
    """Between its turns too: a rank that leaves its relay for a direct connection shows no relay
    at the next tick."""
    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    for key in keys:
        recs = [{"step": 1, "wall_s": 0.1, "tokens": 32, "drops": 0}]
        model.ingest(wire.decode(wire.encode_steps(key, 1, 2.0, recs, 0)), 2.0, via="node-a:7:1")
    assert {r.relay for r in model.tick(2.0).jobs[0].ranks} == {"node-a:7:1"}
    _feed(model, keys, 2, 2.5)  # directly
    ranks = model.tick(2.5).jobs[0].ranks
    assert [r.relay for r in ranks] == [None] * RANKS and [r.step for r in ranks] == [6] * RANKS


def test_a_large_jobs_kernel_tables_are_merged_once_a_round(small_ticks: None) -> None:
    """10 ranks, 4 a tick: a round of 3 ticks. A window arriving on some rank at every tick does not
    make every tick merge the job's tables again: the merge is made at most once a round (like its
    ranks' figures), with every window that arrived meanwhile."""
    from flowtop.monitor.kernels.merge import CumulativeKernels
    from flowtop.monitor.rankkernels import KernelTables

    merges: list[int] = []

    def merge(tables):  # noqa: ANN001, ANN202 - KernelTables' merge signature
        merges.append(sum(t.windows for t in tables.values()))
        return object()

    model = Model(kernels=KernelTables(merge=merge))
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    _feed(model, keys, 1, 2.0)
    for key in keys:
        model.ranks[key].kernels_cumulative = CumulativeKernels()
        model.ranks[key].kernels_cumulative.windows = 1
    shown = [model.tick(2.0 + 0.5 * i).jobs[0].kernels_merged for i in range(1)]
    for i in range(1, 7):  # a new window on rank i at every tick
        model.ranks[keys[i]].kernels_cumulative.windows += 1
        shown.append(model.tick(2.0 + 0.5 * i).jobs[0].kernels_merged)
    assert merges == [10, 13, 16]  # ticks 1, 4, 7: 10 windows, then 3 more a round
    assert shown[0] is shown[1] is shown[2] and shown[3] is shown[4] is shown[5] and shown[6] is not shown[5]
    # a snapshot between two ticks (the TUI, a scrape) merges what it sees, but the ticks show what
    # a replay of them would: the round's merge until the round is over
    model.ranks[keys[7]].kernels_cumulative.windows += 1
    assert model.snapshot(5.6).jobs[0].kernels_merged is not shown[6] and merges == [10, 13, 16, 17]
    assert model.tick(5.5 + 0.5).jobs[0].kernels_merged is shown[6]


def test_a_rank_that_says_bye_between_its_turns_is_done_at_the_next_tick(small_ticks: None) -> None:
    """Its last look (the hints' final evaluation) saw it running; the next tick must not keep that
    view for the rest of the round."""
    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    _feed(model, keys, 1, 2.0)
    model.tick(2.0)
    model.tick(2.5)
    _feed(model, keys[1:2], 6, 2.8)
    model.ingest(wire.decode(wire.encode("bye", keys[1], 9, 2.9, {"reason": "exit", "steps": 10, "drops": 0})), 2.9)
    assert [r.status for r in model.tick(3.0).jobs[0].ranks if r.rank == 1] == ["done"]


def test_a_large_jobs_views_keep_no_history_their_rings_dropped(small_ticks: None) -> None:
    # A view is kept between a rank's turns (a round: 32 s at 4,096 ranks and spread 8) while its
    # ring goes on; a view that shared the ring's step, receive-time, wait and lead blocks kept
    # the dropped ones alive (~10 KB a rank at a 10 ms step). A large job's hints read histories
    # taken when they are measured, so its views hold only what the UI shows.
    import weakref

    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    _feed(model, keys, 1, 2.0)
    for step in range(6, 200, 5):
        _feed(model, keys, step, 2.0)
    snap = model.tick(2.0)
    view = snap.jobs[0].ranks[3]
    ring = model.ranks[keys[3]].steps
    assert view.history.step_time_s[-1] == pytest.approx(0.1) and len(view.history.step_time_s) == 120
    assert not view.history.reached and not view.history.steps and not view.history.lead_s
    oldest = [weakref.ref(a) for block in (ring._long[0], ring._short[0]) for a in block]
    for step in range(200, 700, 5):  # the ring turns over; the view is still held
        _feed(model, keys, step, 2.0)
    assert all(r() is None for r in oldest[:2])  # step and receive time blocks: nothing holds them
    assert sum(r() is not None for r in oldest[2:]) == 1  # of wall, tokens, wait, lead, known: the step times
    assert view.history.step_time_s[-1] == pytest.approx(0.1)
    # the hints read whole histories, taken when they measure (Model._as_now)
    states = [model.ranks[k] for k in keys]
    judged = Model._as_now(snap.jobs[0], states).ranks[3].history
    assert [s for s, _ in judged.reached] == list(range(444, 700)) and list(judged.steps) == list(range(580, 700))
    assert not model._hints_failed


def test_a_small_jobs_views_hold_whole_histories() -> None:
    model = make_model()
    keys = [RankKey("small", "h", 600 + r, r, 0) for r in range(PER_TICK)]
    _feed(model, keys, 1, 2.0)
    h = model.tick(2.0).jobs[0].ranks[0].history
    assert list(h.steps) == [1, 2, 3, 4, 5] and [s for s, _ in h.reached] == [1, 2, 3, 4, 5]


def test_the_histories_a_large_jobs_hints_read_die_with_their_evaluation(
        small_ticks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Kept by the rings until each rank's next frame, 4,096 ranks' judged histories were ~80 k
    # objects the garbage collector walked at every young collection (30-130 ms each live).
    import gc

    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    judged: list = []
    as_now = Model._as_now

    def kept(snap, states):
        out = as_now(snap, states)
        judged.extend(seq for r in out.ranks for seq in (r.history.steps, r.history.input_wait_s,
                                                          r.history.lead_s, r.history.reached))
        return out

    monkeypatch.setattr(Model, "_as_now", staticmethod(kept))
    now = 2.0
    for step in range(1, 40, 5):
        _feed(model, keys, step, now)
        model.tick(now)
        now += 0.5
    # the last tick took the next share's histories (rotation.Prepared): they die with that
    # share's evaluation, at the next tick
    assert model.ticks % 3 == 2 and rotation.prepares(model.ticks, 3)
    model.tick(now)
    assert len(judged) >= 4 * RANKS and all(len(seq) for seq in judged)  # the hints measured, with steps
    # nothing but this list holds them: one walk of the heap for all of them (gc.get_referrers
    # returns every object that refers to any of its arguments, its own argument tuple left out)
    assert gc.get_referrers(*judged) == [judged]
