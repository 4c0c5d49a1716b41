"""StepRing's tails are blocks of their final size from the start, written in place and kept as
the full block once filled: no array of a step ring is ever reallocated through Python's small
size classes (tails grown by array.extend were: 4,096 ranks' tails, each left at its own size,
pinned otherwise empty pools of those classes, ~56 MB at 4,096 ranks)."""

from __future__ import annotations

from array import array

from flowtop.monitor.stepring import StepRing


def _cols(first: int, n: int) -> tuple[array, array, array, array, array]:
    return (array("q", range(first, first + n)), array("d", [0.5] * n), array("q", [7] * n),
            array("d", [0.25] * n), array("d", [0.125] * n))


def _tails(ring: StepRing) -> list[array]:
    return [*ring._lt, *ring._st]


def test_tails_hold_a_block_from_the_start_and_are_never_reallocated() -> None:
    ring = StepRing(256, 128)
    ring.extend(*_cols(1, 10), recv=100.0)
    tails = _tails(ring)
    # 64 values each: 512 bytes of int64 / float64, 64 of the one-byte "known" flags
    assert [len(a) * a.itemsize for a in tails] == [512, 512, 512, 512, 512, 512, 64]
    where = [a.buffer_info()[0] for a in tails]
    ring.extend(*_cols(11, 20), recv=101.0)
    ring.append((31, 0.5, 7, 0.25, 102.0, 0.125))
    assert _tails(ring) == tails and [a.buffer_info()[0] for a in _tails(ring)] == where  # in place
    assert all(a is b for a, b in zip(_tails(ring), tails))
    assert ring.column(StepRing.STEP) == tuple(range(1, 32))
    assert ring.column(StepRing.RECV) == (100.0,) * 10 + (101.0,) * 20 + (102.0,)
    assert ring.last() == (31, 0.5, 7, 0.25, 102.0, 0.125)
    assert ring.nbytes == 31 * (8 * 6 + 1)  # the values written, not the zeros past them


def test_a_filled_tail_is_the_block_and_earlier_views_still_read_their_values() -> None:
    ring = StepRing(256, 128)
    ring.extend(*_cols(1, 40), recv=5.0)
    steps_tail, recv_tail = ring._lt
    view = ring.column(StepRing.STEP)  # shares the tail
    ring.extend(*_cols(41, 30), recv=6.0)  # 70 values: the tails filled to 64, 6 in new tails
    assert ring._long[0][0] is steps_tail and ring._long[0][1] is recv_tail  # no copy
    assert tuple(steps_tail) == tuple(range(1, 65))
    assert tuple(recv_tail) == (5.0,) * 40 + (6.0,) * 24
    assert view == tuple(range(1, 41))  # the view reads no further than its 40
    assert tuple(ring._lt[0][:6]) == (65, 66, 67, 68, 69, 70) and len(ring._lt[0]) == 64
    assert ring.column(StepRing.STEP) == tuple(range(1, 71))
    assert ring.values(StepRing.RECV, 8) == [6.0] * 8
    for _ in range(58):  # appends fill the new tails: 64 values, they are the second block
        ring.append((71 + _, 0.5, 7, None, 7.0, None))
    assert len(ring._long) == 2 and ring._lt[0] is not ring._long[1][0]
    assert ring._long[1][0][-1] == 128 and ring._nl == 128 and ring.last_recv() == 7.0
    assert ring.last() == (128, 0.5, 7, None, 7.0, None)


def test_a_ring_without_values_in_its_tails_holds_none_of_its_own() -> None:
    """A rank that never steps held 7 tails of zeros (3.8 KB); so did a ring whose tails had just
    become a block until its next write. They share one set of empty tails, never written."""
    fresh, other = StepRing(256, 128), StepRing(256, 128)
    assert all(a is b for a, b in zip(_tails(fresh), _tails(other)))  # shared, not made per ring
    shared = [bytes(a) for a in _tails(fresh)]
    fresh.append((1, 0.5, 7, 0.25, 10.0, None))  # its own tails at its first write
    assert not any(a is b for a, b in zip(_tails(fresh), _tails(other)))
    assert fresh.last() == (1, 0.5, 7, 0.25, 10.0, None) and len(fresh) == 1
    fresh.extend(*_cols(2, 63), recv=11.0)  # 64 values: the tails are the first block
    assert all(a is b for a, b in zip(_tails(fresh), _tails(other)))  # back to sharing
    assert fresh.column(StepRing.STEP) == tuple(range(1, 65)) and fresh.last_recv() == 11.0
    other.extend(*_cols(1, 200), recv=12.0)  # 3 blocks and 8 values: tails of its own
    assert other.column(StepRing.STEP)[-3:] == (198, 199, 200)
    assert [bytes(a) for a in _tails(fresh)] == shared and not any(shared[0])  # never written
    assert fresh.values(StepRing.RECV, 2) == [11.0, 11.0] and fresh.recent(1)[0].step == 64


def test_copied_and_pickled_empty_rings_write_only_their_own_tails() -> None:
    """Two fresh rings copied together (deepcopy, pickle) and one written: its record reads back
    as written and the other stays empty (the copies once wrote into the shared empty tails,
    copied as new arrays: (7, 0.5, 3, ...) read back as (3, 0.125, 3, 0.125, ...))."""
    import copy
    import pickle

    for how in (copy.deepcopy, lambda x: pickle.loads(pickle.dumps(x))):
        a, b = how([StepRing(256, 128), StepRing(256, 128)])
        a.append((7, 0.5, 3, 0.25, 10.0, 0.125))
        assert a.last() == (7, 0.5, 3, 0.25, 10.0, 0.125)
        assert len(b) == 0 and all(not any(t) for t in _tails(b))
        c = how(a)  # a ring with values in its own tails copies them
        assert c.last() == (7, 0.5, 3, 0.25, 10.0, 0.125) and len(c) == 1
