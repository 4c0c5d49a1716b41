"""Bounded, compact per-rank memory (issue 15 part 5): the step ring and sparkline series keep
machine numbers in blocks, their frozen views share storage and read like the tuples they
replace, and a rank's state stays within a fixed size however long it runs."""

from __future__ import annotations

import collections
import random
import tracemalloc

import pytest

from flowtop.monitor import rankstate as rs
from array import array

from flowtop.monitor.compact import BLOCK, ArraySeq, Column, PairSeq, Window
from flowtop.monitor.stepring import StepRing
from flowtop.monitor.model import Model
from probe.wire import Message, RankKey


@pytest.mark.parametrize("cap", [1, 5, 63, 64, 65, 300])
def test_a_column_keeps_the_last_cap_values_and_its_views_read_like_tuples(cap: int) -> None:
    col, ref = Column("d", cap), []
    for i in range(700):
        col.append(i / 3)
        ref = (ref + [i / 3])[-cap:]
        if i % 23 and i > 140:
            continue
        assert len(col) == len(ref) and col.last() == ref[-1] and list(col) == ref
        for n in (0, 1, 10, 120, 1000):
            want = tuple(ref[-n:]) if n else ()
            view = col.view(n)
            assert view == want and len(view) == len(want) and hash(view) == hash(want)
            assert [view[k] for k in range(-len(want), len(want))] == list(want + want)
            for a, b in ((0, 5), (-5, None), (3, -2), (None, None), (10, 3)):
                assert view[a:b] == want[a:b] and view[a:b][1:] == want[a:b][1:]
            assert view[::2] == want[::2]
    assert col.nbytes <= (cap + BLOCK) * 8


def test_a_view_is_frozen_and_shares_the_full_blocks() -> None:
    col = Column("d", 512)
    for i in range(300):
        col.append(float(i))
    view = col.view()
    assert col.view() is view  # reused until the next append
    col.append(300.0)
    assert tuple(view) == tuple(float(i) for i in range(300))  # the view did not move
    again = col.view()
    assert again is not view and again[-1] == 300.0
    # every block shared, the part-filled one too: values are only appended
    assert sum(a is b for a in view._blocks for b in again._blocks) == -(-300 // BLOCK)
    for i in range(301, 700):  # the shared tail fills, rolls, and old blocks leave the column
        col.append(float(i))
    assert tuple(view) == tuple(float(i) for i in range(300)) and view[-1] == 299.0 and len(view) == 300
    assert tuple(col.view()) == tuple(float(i) for i in range(700 - 512, 700))


def test_the_step_ring_reads_like_the_deque_of_records_it_replaces() -> None:
    rng = random.Random(1)
    for cap, recent in ((512, 128), (64, 64), (100, 7)):
        ring, ref = StepRing(cap, recent), collections.deque(maxlen=cap)
        for i in range(1500):
            wait = None if rng.random() < 0.3 else rng.choice([0.0, rng.random()])
            lead = None if rng.random() < 0.5 else rng.random()
            rec = (i, rng.random(), rng.randint(0, 10**12), wait, 1e4 + i / 10, lead)
            ring.append(rec)
            ref.append(rec)
            if i % 13 and i > 200:
                continue
            assert len(ring) == len(ref) and ring[-1] == ref[-1] and bool(ring)
            assert list(ring) == list(ref)[-recent:]
            for n in (1, 32, 120, 600):
                assert ring.recent(n) == list(ref)[-min(n, recent):]
                assert ring.values(StepRing.WALL, n) == [r[1] for r in list(ref)[-min(n, recent):]]
                assert ring.values(StepRing.STEP, n) == [r[0] for r in list(ref)[-n:]]
            m = min(120, recent, len(ref))
            last = list(ref)[-m:]
            assert ring.column(StepRing.WAIT, m) == tuple(r[3] or 0.0 for r in last)  # the history's 0.0
            assert ring.column(StepRing.LEAD, m) == tuple(r[5] or 0.0 for r in last)
            assert PairSeq(ring.column(StepRing.STEP), ring.column(StepRing.RECV)) == tuple((r[0], r[4]) for r in ref)
    assert not StepRing(4, 2) and ArraySeq.of("q", [1, 2])[-1] == 2


def test_a_frames_records_extended_at_once_read_like_records_appended_one_by_one() -> None:
    """Frames of 1 to 300 records (whole blocks of 64 among them, at any offset in the tails),
    some of them without input wait or lead: the ring reads as if each record had been appended."""
    rng = random.Random(2)
    nan = float("nan")
    for cap, recent in ((256, 128), (64, 64), (100, 7)):
        ring, ref, step = StepRing(cap, recent), StepRing(cap, recent), 0
        for frame in range(60):
            n = rng.choice([1, 5, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 200, 300])
            recv = 1e4 + frame
            whole = rng.random() < 0.5  # every record sent both (the ring's common case), or some did not
            recs = [(step + i, rng.random(), rng.randint(0, 10**9), rng.random() if whole else rng.choice([None, rng.random()]),
                     recv, rng.random() if whole else rng.choice([None, rng.random()])) for i in range(n)]
            step += n
            waits = None if all(r[3] is None for r in recs) else array("d", [nan if r[3] is None else r[3] for r in recs])
            leads = None if all(r[5] is None for r in recs) else array("d", [nan if r[5] is None else r[5] for r in recs])
            ring.extend(array("q", [r[0] for r in recs]), array("d", [r[1] for r in recs]),
                        array("q", [r[2] for r in recs]), waits, leads, recv)
            for r in recs:
                ref.append(r)
            assert len(ring) == len(ref) and list(ring) == list(ref)
            for col in range(7):
                assert ring.column(col, len(ring)) == ref.column(col, len(ref))


def test_a_whole_history_reads_the_columns_as_column_makes_them() -> None:
    """StepRing.history_columns (the hints' whole histories, two passes over the blocks) equals
    column() of each, empty, within a tail, at whole blocks and after blocks were dropped, by
    appends and by frames."""
    rng = random.Random(5)
    for cap, recent in ((256, 128), (64, 64), (100, 7)):
        ring, step = StepRing(cap, recent), 0
        for frame in range(80):
            for n in (0, 1, 3, recent, recent + 5, 10_000):
                got = [tuple(v) for v in ring.history_columns(n)]
                k = min(n, ring.recent_len)
                want = [ring.column(c, k) for c in (StepRing.STEP, StepRing.WALL, StepRing.WAIT, StepRing.LEAD)]
                assert got == [tuple(v) for v in want + [ring.column(StepRing.STEP), ring.column(StepRing.RECV)]]
                assert len(got[0]) == k and len(got[4]) == len(ring)
            n = rng.choice([1, 2, BLOCK - 1, BLOCK, BLOCK + 3, 150])
            if frame % 3:
                for i in range(n):
                    ring.append((step + i, rng.random(), 7, rng.random(), 1e4 + frame, None))
            else:
                ring.extend(array("q", range(step, step + n)), array("d", [rng.random() for _ in range(n)]),
                            array("q", [7] * n), None, array("d", [rng.random() for _ in range(n)]), 1e4 + frame)
            step += n


def _feed(model: Model, key: RankKey, steps: int, telemetry: int) -> float:
    """Steps in batches of 10, then telemetry samples; returns the last frame's time."""
    seq, now = 0, 100.0
    for s in range(1, steps + 1, 10):
        now += 0.1
        recs = [{"step": k, "wall_s": 0.01, "tokens": 64, "drops": 0, "input_wait_s": 0.001, "lead_s": 0.005,
                 "probe_s": 1e-5} for k in range(s, s + 10)]
        model.ingest(Message("steps", key, seq, now, {"records": recs}), now)
        seq += 1
    for _ in range(telemetry):
        now += 0.5
        gpu = {"power_w": 500.0, "sm_clock_mhz": 1980, "tensor_active": 0.5}
        model.ingest(Message("telemetry", key, seq, now, {"gpu": gpu, "proc": {}}), now)
        seq += 1
    return now


def test_a_ranks_state_is_bounded_however_long_it_runs() -> None:
    """10 k steps and 1,000 telemetry samples keep the last RING steps (RECENT with every
    field) and SERIES samples; the ring and series hold at most their caps plus a block."""
    model = Model()
    key = RankKey("j", "h", 1, 0, 0)
    _feed(model, key, 10_000, 1_000)
    st = model.ranks[key]
    assert len(st.steps) == rs.RING and len(st.steps.recent(10**6)) == rs.RECENT
    assert st.steps.nbytes <= (rs.RING + BLOCK) * 16 + (rs.RECENT + BLOCK) * 33
    assert all(len(c) == rs.SERIES and c.nbytes <= (rs.SERIES + BLOCK) * 4 for c in st.series.values())
    h = rs.history(st)
    assert h.steps == tuple(range(10_000 - rs.HISTORY + 1, 10_001)) and len(h.reached) == rs.RING
    assert h.step_time_s[-1] == 0.01 and h.input_wait_s[-1] == 0.001 and h.power_w[-1] == 500.0


def test_memory_per_rank_stays_small() -> None:
    """A rank in steady state (full ring and series, its view built) costs the model a few
    tens of KB (it was ~200 KB with deques of tuples); `bench/ingest.py --memory` measures the
    full figure with kernel tables."""
    model = Model()
    keys = [RankKey("j", f"h{i // 8}", 100 + i, i, 0) for i in range(32)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for key in keys:
        now = _feed(model, key, 600, 320)
    snap = model.tick(now)
    per_rank = (tracemalloc.get_traced_memory()[0] - base) / len(keys)
    tracemalloc.stop()
    assert len(snap.jobs[0].ranks) == len(keys)
    assert per_rank < 40_000, per_rank


def test_a_column_extends_block_by_block_and_keeps_its_cap() -> None:
    col = Column("d", 100)
    col.extend([float(i) for i in range(30)])
    col.extend(array("d", [float(i) for i in range(30, 150)]))  # across blocks, past the cap
    assert len(col) == 100 and tuple(col.view()) == tuple(float(i) for i in range(50, 150))
    assert all(len(b) == BLOCK for b in col._blocks)  # full blocks stay exactly BLOCK long
    col.extend(array("d", [float(i) for i in range(150, 1150)]))  # ten times the cap at once
    assert len(col) == 100 and tuple(col.view()) == tuple(float(i) for i in range(1050, 1150))
    col.append(1150.0)
    assert tuple(col.view())[-2:] == (1149.0, 1150.0) and len(col) == 100
    view = col.view()
    for i in range(1151, 1400, 3):  # a few values at a time: the tail grows, fills, rolls into blocks
        col.extend(array("d", [float(i), float(i + 1), float(i + 2)]))
        assert tuple(col.view()) == tuple(float(v) for v in range(i + 3 - 100, i + 3))
    assert tuple(view)[-2:] == (1149.0, 1150.0) and len(view) == 100  # a view taken before did not move
    small = Column("d", 32)  # a cap below a block (a rank's stage times)
    small.extend(array("d", [float(i) for i in range(40)]))
    small.extend(array("d", [40.0, 41.0]))
    assert tuple(small.view()) == tuple(float(i) for i in range(10, 42)) and len(small) == 32
    view = small.view()
    small.extend([])
    assert small.view() is view  # nothing appended: the same view


def test_last_recv_is_the_newest_records_receive_time_across_blocks() -> None:
    ring = StepRing(2 * BLOCK, BLOCK)
    with pytest.raises(IndexError):
        ring.last_recv()
    for s in range(1, BLOCK + 1):  # the tail fills and rolls into a block: read from the block
        ring.append((s, 0.1, 8, None, 100.0 + s, None))
        assert ring.last_recv() == 100.0 + s == ring[-1].recv
    ring.extend(array("q", [BLOCK + 1, BLOCK + 2]), array("d", [0.1, 0.1]), array("q", [8, 8]), None, None, 500.0)
    assert ring.last_recv() == 500.0 == ring[-1].recv


def test_full_blocks_are_kept_at_their_exact_size() -> None:
    # Tails grow by appends and by frames' extends, and array over-allocates as it grows: a block
    # of 64 floats held 75 (600 bytes, past what Python's allocator serves). Kept blocks are copies
    # of exactly their values; a view made before the copy still reads what it read.
    import sys
    from array import array

    exact_d, exact_q = sys.getsizeof(array("d", [0.0] * BLOCK)), sys.getsizeof(array("q", [0] * BLOCK))
    ring = StepRing(256, 128)
    for s in range(1, 46):
        ring.append((s, 0.01, 8, None, float(s), None))
    early = ring.column(ring.WALL)
    ring.extend(array("q", range(46, 200)), array("d", [0.02] * 154), array("q", [8] * 154), None, None, 9.0)
    assert [sys.getsizeof(a) for blk in ring._long for a in blk] == [exact_q, exact_d] * len(ring._long)
    assert all(sys.getsizeof(blk[0]) == exact_d for blk in ring._short)
    assert list(early) == [0.01] * 45 and list(ring.column(ring.WALL))[-3:] == [0.02] * 3
    col = Column("d", 300)
    for i in range(130):
        col.append(float(i))
    assert [sys.getsizeof(b) for b in col._blocks] == [exact_d, exact_d] and list(col.view())[63:66] == [63.0, 64.0, 65.0]


def test_a_frames_columns_never_become_the_rings_tails() -> None:
    """The records left after a frame's whole blocks go into tails of the ring's own: the frame's
    columns (its message's, which a recording or a hint may still hold) are never appended to."""
    ring = StepRing(256, 128)
    steps, wall, tokens = array("q", range(1, 11)), array("d", [0.5] * 10), array("q", [8] * 10)
    ring.extend(steps, wall, tokens, None, None, 1.0)
    ring.extend(array("q", range(11, 21)), array("d", [0.25] * 10), array("q", [8] * 10), None, None, 2.0)
    assert list(steps) == list(range(1, 11)) and list(wall) == [0.5] * 10 and len(tokens) == 10
    assert list(ring.column(ring.WALL)) == [0.5] * 10 + [0.25] * 10


def test_slices_and_reversed_views_read_like_tuples_across_blocks() -> None:
    """A view's slices (ArraySeq.within: no clamping) and its reversed iteration (block by block,
    not a tuple of the view) read as the same operations on a tuple, at any offset and length,
    slices of slices included."""
    rng = random.Random(11)
    for _ in range(400):
        n = rng.randint(0, 5 * BLOCK)
        seq, ref = ArraySeq.of("q", range(n)), tuple(range(n))
        lo = rng.randint(0, n)
        hi = rng.randint(lo, n)
        sub, want = seq[lo:hi], ref[lo:hi]
        assert tuple(sub) == want and tuple(reversed(sub)) == want[::-1] and len(sub) == len(want)
        a = rng.randint(-len(want) - 2, len(want) + 2)
        assert tuple(sub[a:]) == want[a:] and tuple(reversed(sub[a:])) == want[a:][::-1]
        assert tuple(sub[:a]) == want[:a] and tuple(reversed(sub[:a])) == want[:a][::-1]


def test_a_window_keeps_the_last_cap_values_oldest_first() -> None:
    w = Window("d", 4)
    assert not w and len(w) == 0 and list(w) == [] and w._a is None  # nothing sent: no array
    w.extend(array("d", [1.0, 2.0, 3.0]))
    assert list(w) == [1.0, 2.0, 3.0] and len(w) == 3
    w.extend([4.0, 5.0])  # a list, and round past the array's end
    assert list(w) == [2.0, 3.0, 4.0, 5.0] and len(w) == 4
    w.extend(array("d", [6.0, 7.0, 8.0]))  # across the end again
    assert list(w) == [5.0, 6.0, 7.0, 8.0]
    w.extend(array("d", [float(i) for i in range(10, 20)]))  # more than the cap at once
    assert list(w) == [16.0, 17.0, 18.0, 19.0]
    w.append(20.0)
    w.extend(array("d"))  # nothing: unchanged
    assert list(w) == [17.0, 18.0, 19.0, 20.0] and len(w._a) == 4  # one array of exactly cap values


def test_a_ranks_probe_samples_are_one_array_of_their_cap() -> None:
    """A rank's probe times (read only as a median) are held in 64 doubles, not a Column's
    blocks of 64 plus a tail (up to 127 values, two arrays and a list)."""
    model = Model()
    key = RankKey("j", "h0", 100, 0, 0)
    _feed(model, key, 300, 0)
    st = model.ranks[key]
    assert len(st.probe_s) == rs.PROBE_SAMPLES == 64 and list(st.probe_s) == [1e-5] * 64
    assert st.probe_s._a is not None and st.probe_s._a.buffer_info()[1] == 64
