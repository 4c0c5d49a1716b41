"""StepRing.extend's paths (tails only, one block completed, many blocks with only the kept ones
made) against the ring filled record by record with StepRing.append: every view the model reads
must be the same, whatever the frame sizes, the records skipped and the fields not sent."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from flowtop.monitor.stepring import StepRing

NAN = float("nan")


def _views(ring: StepRing) -> tuple[object, ...]:
    """Everything a reader of the ring can see, as plain values (NaN-free: the ring stores 0.0)."""
    cols = tuple(tuple(ring.column(c)) for c in range(7))
    partial = tuple(tuple(ring.column(c, k)) for c in range(7) for k in (0, 1, 63, 64, 65, 130))
    hist = tuple(tuple(v) for v in ring.history_columns(120))
    return (len(ring), ring.recent_len, bool(ring), cols, partial, hist, tuple(ring.recent(300)),
            ring.last() if ring else None, ring.last_recv() if ring else None, ring.nbytes,
            tuple(ring.values(c, 200) for c in range(7)))


def _frame(rng: random.Random, first: int, n: int) -> tuple[array, array, array, array | None, array | None]:
    steps = array("q", range(first, first + n))
    wall = array("d", [rng.random() for _ in range(n)])
    tokens = array("q", [rng.randrange(5000) for _ in range(n)])
    cols: list[array | None] = []
    for _ in range(2):
        shape = rng.random()
        if shape < 0.2:
            cols.append(None)
        elif shape < 0.4:
            cols.append(array("d", [NAN if rng.random() < 0.5 else rng.random() for _ in range(n)]))
        else:
            cols.append(array("d", [rng.random() for _ in range(n)]))
    return steps, wall, tokens, cols[0], cols[1]


def _append_each(ring: StepRing, frame: tuple[array, array, array, array | None, array | None], recv: float,
                 start: int) -> None:
    steps, wall, tokens, wait, lead = frame
    for i in range(start, len(steps)):
        w = None if wait is None or math.isnan(wait[i]) else wait[i]
        ld = None if lead is None or math.isnan(lead[i]) else lead[i]
        ring.append((steps[i], wall[i], tokens[i], w, recv, ld))


@pytest.mark.parametrize("cap,recent", [(256, 128), (100, 30), (64, 64), (300, 1), (1, 1)])
def test_extend_matches_record_by_record(cap: int, recent: int) -> None:
    rng = random.Random(cap * 1000 + recent)
    for _ in range(12):
        by_frame, by_record = StepRing(cap, recent), StepRing(cap, recent)
        step = 1
        for k in range(40):
            n = rng.choice([1, 2, 7, 45, 63, 64, 65, 127, 128, 129, 200, 256, 300, 512])
            start = rng.randrange(n) if rng.random() < 0.2 else 0
            frame = _frame(rng, step, n)
            step += n
            finite = all(c is not None and sum(c) == sum(c) for c in frame[3:]) and rng.random() < 0.5
            by_frame.extend(*frame, recv=float(k), start=start, finite=finite)
            _append_each(by_record, frame, float(k), start)
            assert _views(by_frame) == _views(by_record)


def test_a_200_record_frame_keeps_what_the_caps_need() -> None:
    """Worked by hand: 200 records into an empty ring of 256 steps and 128 whole records make
    three blocks of 64 and a tail of 8; the step and receive columns keep all 200 (3 blocks of
    64 + 8: under 256), the others 2 blocks + the tail (the third block from the end would
    leave 2 × 64 + 8 = 136 >= 128 without it, so it goes): 136 values held, 128 of them read."""
    ring = StepRing(256, 128)
    ring.extend(array("q", range(1, 201)), array("d", [0.5] * 200), array("q", [7] * 200),
                array("d", [0.25] * 200), array("d", [0.125] * 200), 9.0, 0, True)
    assert len(ring) == 200 and ring.recent_len == 128
    # bytes: step + recv 8 + 8 of 200 values; wall, tokens, wait, lead 8 each and the flag 1 of 136
    assert ring.nbytes == 200 * 16 + 136 * 33
    assert list(ring.column(ring.STEP)) == list(range(1, 201))
    assert list(ring.column(ring.WALL)) == [0.5] * 128
    assert ring.recent(2)[0] == (199, 0.5, 7, 0.25, 9.0, 0.125)
