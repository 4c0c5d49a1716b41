"""Alignment by step index for the cross-rank measures (flowtop.monitor.hints.aligned): the index path
for contiguous runs gives what the step maps give, and the O(1) "median without me" equals the
median of the others."""

from __future__ import annotations

import random
import statistics

from flowtop.monitor.hints.aligned import align, medians_without, run_start, values_at


def _values(aligned, n):  # every rank's values at the common steps
    assert len(aligned.rows) == n and all(len(row) == len(aligned.steps) for row in aligned.rows)
    return aligned.rows


def test_contiguous_runs_take_the_index_path_and_agree_with_maps() -> None:
    rng = random.Random(5)
    pairs = []
    for first, last in ((10, 130), (25, 128), (3, 140)):
        steps = tuple(range(first, last + 1))
        pairs.append((steps, tuple(rng.random() for _ in steps)))
    fast = align(pairs, 20)
    assert list(fast.steps) == list(range(109, 129)) and isinstance(fast.steps, range)
    # the same data with one gap in an unrelated place forces the map path on every rank
    gapped = [(tuple(s for s in steps if s != 12), tuple(v for s, v in zip(steps, vals) if s != 12))
              for steps, vals in pairs]
    slow = align(gapped, 20)
    assert not isinstance(slow.steps, range) and list(slow.steps) == list(fast.steps)
    assert _values(fast, 3) == _values(slow, 3) == [[vals[s - steps[0]] for s in range(109, 129)] for steps, vals in pairs]


def test_a_gap_inside_the_window_is_left_out_and_keep_filters_values() -> None:
    pairs = [((1, 2, 3, 4, 5), (1.0, 2.0, 3.0, 4.0, 5.0)), ((1, 2, 4, 5), (1.0, 2.0, 4.0, 5.0))]
    assert run_start(pairs[0][0]) == 1 and run_start(pairs[1][0]) is None
    assert list(align(pairs).steps) == [1, 2, 4, 5]
    leads = [((1, 2, 3), (0.5, 0.0, 0.7)), ((1, 2, 3), (0.4, 0.3, 0.2))]  # 0.0: not known
    known = align(leads, above=0.0)
    assert list(known.steps) == [1, 3] and known.columns() == [(0.5, 0.4), (0.7, 0.2)]
    assert values_at(range(2, 5), pairs[1]) == [2.0, 0.0, 4.0] and values_at(range(2, 5), pairs[0]) == [2.0, 3.0, 4.0]
    assert list(align(pairs, 0).steps) == []


def test_median_without_one_value_equals_the_median_of_the_others() -> None:
    rng = random.Random(11)
    for n in range(1, 40):
        values = [rng.choice([0.1, 0.2, 0.3, rng.random()]) for _ in range(n)]  # duplicates too
        without = medians_without(sorted(values))
        for i, v in enumerate(values):
            others = values[:i] + values[i + 1:]
            assert without(v) == (float(statistics.median(others)) if others else 0.0)


def _paced_rank(rank: int, step_s: float, flush_s: float, phase: float, until: float = 60.0):
    """A rank's reach history as the monitor records it when its records leave in frames every
    ``flush_s`` (phase ``phase``): every step of a frame carries that frame's receive time."""
    from types import SimpleNamespace as NS

    steps, recv, pending, s, t, due = [], [], [], 1, step_s, phase
    while t <= until:
        pending.append(s)
        s, t = s + 1, t + step_s
        if t >= due:
            steps += pending
            recv += [t + 0.001] * len(pending)
            pending, due = [], due + flush_s
    return NS(rank=rank, history=NS(reached=tuple(zip(steps[-256:], recv[-256:]))))


def test_pace_from_frame_ends_is_exact_for_batched_ranks_and_still_sees_a_slow_one() -> None:
    from flowtop.monitor.hints.measures_straggler import _by_reach

    rng = random.Random(3)
    for flush in (0.1, 0.15, 0.45):
        ranks = [_paced_rank(r, 0.01, flush, rng.random() * flush) for r in range(9)]
        pace, span, _ = _by_reach(ranks, 20, 256)
        # every rank takes 10 ms a step: read within 1 %, whatever its flush phase (mid-frame
        # steps gave 7.5-22 ms, and 100 % "stragglers" under a 0.15 s pace)
        assert set(pace) == set(range(9)) and all(abs(p - 0.01) < 1e-4 for p in pace.values()), (flush, pace)
        assert span >= 20
    # a rank 30 % slower (3 s in: its last 256 steps still overlap the others')
    slow = [_paced_rank(r, 0.013 if r == 4 else 0.01, 0.45, rng.random() * 0.45, until=3.0) for r in range(9)]
    pace, _, _ = _by_reach(slow, 20, 256)
    assert abs(pace[4] / 0.01 - 1.3) < 0.02 and all(abs(p - 0.01) < 1e-4 for r, p in pace.items() if r != 4)


def test_no_pace_over_a_span_shorter_than_a_second() -> None:
    """Two ranks in lockstep whose frames end at different steps of a short run (0.3 s of 15 ms
    steps, the last frame flushed by both at exit): their paces read 29 % apart, a straggler
    hint on a 2-rank expert-parallel job whose step times were equal (a new user's trial). A
    frame's end is off by up to a step each side: a pace needs PACE_MIN_SPAN_S of receive time."""
    from types import SimpleNamespace as NS

    from flowtop.monitor.hints.measures_straggler import PACE_MIN_SPAN_S, _by_reach

    def rank(r: int, ends: list[int], n: int, step_s: float) -> NS:
        reached, start = [], 1
        for e in ends:  # every step of a frame carries the frame's receive time: its last step's
            reached += [(s, e * step_s) for s in range(start, e + 1)]
            start = e + 1
        return NS(rank=r, history=NS(reached=tuple(reached[-n:])))

    short = [rank(0, [7, 9, 29, 31, 40], 40, 0.015), rank(1, [5, 12, 31, 34, 40], 40, 0.015)]
    short[0].history.reached = tuple((s, t + (0.02 if s > 31 else 0.0)) for s, t in short[0].history.reached)
    assert _by_reach(short, 5, 256)[0] == {}  # 0.4 s: no pace figure at all
    ends = list(range(7, 301, 7)) + [300]
    long = [rank(0, ends, 300, 0.015), rank(1, [e + 3 for e in ends[:-2]] + [300], 300, 0.015)]
    pace, span, _ = _by_reach(long, 20, 256)
    assert set(pace) == {0, 1} and all(abs(p - 0.015) < 1e-3 for p in pace.values())
    assert 0.015 * span >= PACE_MIN_SPAN_S


def test_no_pace_from_a_backlog_arriving_at_once() -> None:
    """Ranks stepping every 0.1 s behind a relay stopped for 30 s: their steps of those 30 s then
    arrive within 2 s. By receive time they took ~7 ms a step, and the rank whose span
    started before the burst read "660 % slower" (a trial's SIGSTOP). Steps cannot steadily arrive
    faster than they are made: a rank reaching its steps at under CATCH_UP of its own step time
    gets no pace figure; ranks arriving steadily keep theirs."""
    from types import SimpleNamespace as NS

    from flowtop.monitor.hints.measures_straggler import CATCH_UP, _by_reach

    def rank(r: int, burst: bool) -> NS:
        # 300 steps of 0.1 s: steadily received, or the last 290 received over 2 s at the end
        times = [0.1 * s if not burst or s <= 10 else 1.0 + 30.0 + (s - 10) / 145 for s in range(1, 301)]
        return NS(rank=r, history=NS(reached=tuple(zip(range(1, 301), times))))

    ranks = [rank(0, True), rank(1, True), rank(2, True), rank(3, False), rank(4, False)]
    step_s = dict.fromkeys(range(5), 0.1)
    unbounded, _, _ = _by_reach(ranks, 20, 256)
    assert unbounded[0] < CATCH_UP * 0.1 < unbounded[3]  # what the pace read before
    pace, _, _ = _by_reach(ranks, 20, 256, step_s)
    assert set(pace) == {3, 4} and all(abs(p - 0.1) < 1e-9 for p in pace.values())


class _Counted(tuple):
    """A rank's values that count how many of them were read (by index, slice or iteration)."""

    reads = 0

    def __iter__(self):
        for v in super().__iter__():
            _Counted.reads += 1
            yield v

    def __getitem__(self, i):
        got = super().__getitem__(i)
        if isinstance(i, slice):
            return _Counted(got)
        _Counted.reads += 1
        return got


def test_rows_are_read_only_when_asked_and_only_at_the_common_steps() -> None:
    # 4,096 ranks' 256 receive times each were copied at every straggler measure, read for the
    # few slow ranks only; the leads' check read every rank's whole history, not its window.
    series = [(tuple(range(first, 300)), _Counted(float(s) for s in range(first, 300))) for first in (1, 40, 100)]
    _Counted.reads = 0
    al = align(series)
    assert list(al.steps) == list(range(100, 300)) and _Counted.reads == 0
    assert al.rows[1][:2] == [100.0, 101.0] and _Counted.reads == 3 * 200
    # a lead not sent (0.0) long before the window: the window's 20 values of each rank are read
    leads = [(tuple(range(1, 300)), _Counted([0.0] + [0.5] * 298)), (tuple(range(1, 300)), _Counted([0.4] * 299))]
    _Counted.reads = 0
    known = align(leads, 20, above=0.0)
    assert list(known.steps) == list(range(280, 300)) and known.rows == [[0.5] * 20, [0.4] * 20]
    assert _Counted.reads == 2 * 20
    # ... and a lead not sent inside it still leaves that step out (the maps)
    gap = [(tuple(range(1, 300)), tuple([0.5] * 290 + [0.0] + [0.5] * 8)), leads[1]]
    assert 291 not in align(gap, 20, above=0.0).steps and len(align(gap, 20, above=0.0).steps) == 20


def test_a_nan_in_the_window_is_left_out_as_the_maps_leave_it_out() -> None:
    nan = float("nan")
    ok = ((1, 2, 3, 4), (0.5, 0.5, 0.5, 0.5))
    for values, steps in (((nan, 0.5, 0.5, nan), [2, 3]), ((0.5, 0.5, nan, 0.5), [2, 4])):
        got = align([ok, ((1, 2, 3, 4), values)], 2, above=0.0)
        assert list(got.steps) == steps and got.rows == [[0.5, 0.5], [0.5, 0.5]]
