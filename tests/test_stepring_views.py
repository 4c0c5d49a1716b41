"""Views of a StepRing share its tails, which are written in place: a view or history taken
between writes of any size (a record, part of a block, a block, several) must keep reading what
it read when taken, never a value written after it nor the zeros past its length, and no full
block (shared receive times, the shared 'both sent' flags) may ever be written again."""

from __future__ import annotations

import random
from array import array

import flowtop.monitor.stepring as stepring
from flowtop.monitor.stepring import StepRing

NAN = float("nan")
SIZES = (1, 63, 64, 65, 128, 200, 300, 2, 127, 129)


def _reference(records: list[tuple], cap: int, recent: int) -> list[list[float]]:
    """The seven columns a ring keeping every record as a tuple would give (0.0 where not sent)."""
    longs, shorts = records[-cap:], records[-recent:]
    return [[r[0] for r in longs], [r[4] for r in longs], [r[1] for r in shorts], [r[2] for r in shorts],
            [r[3] or 0.0 for r in shorts], [r[5] or 0.0 for r in shorts],
            [(r[3] is not None) | (r[5] is not None) << 1 for r in shorts]]


def test_views_taken_between_writes_keep_their_values() -> None:
    rng = random.Random(7)
    for cap, recent in ((256, 128), (65, 1), (130, 70)):
        ring, records, kept = StepRing(cap, recent), [], []
        step = 1
        for t in range(60):
            n, mode = rng.choice(SIZES), t % 3
            steps = array("q", range(step, step + n))
            wall = array("d", [rng.random() for _ in range(n)])
            wait = array("d", [rng.random() if mode == 0 or rng.random() < .5 else NAN for _ in range(n)])
            lead = None if mode == 2 else array("d", [rng.random() for _ in range(n)])
            sent = [(None if w != w else w, None if lead is None else lead[i]) for i, w in enumerate(wait)]
            if t % 4 == 3:  # record by record
                for i in range(n):
                    ring.append((steps[i], wall[i], 9, sent[i][0], float(t), sent[i][1]))
            else:
                ring.extend(steps, wall, array("q", [9] * n), wait, lead, float(t))
            records += [(steps[i], wall[i], 9, sent[i][0], float(t), sent[i][1]) for i in range(n)]
            step += n
            ref = _reference(records, cap, recent)
            for col in range(7):
                for m in (None, 1, 64, 65, 100):
                    want = ref[col] if m is None else ref[col][-m:]
                    view = ring.column(col, m)
                    assert list(view) == want
                    kept.append((view, tuple(want)))
                    if len(view) > 2:
                        kept.append((view[1:-1], tuple(want[1:-1])))
            short = min(len(records), recent, 120)
            history = ring.history_columns(120)
            wants = [c[len(c) - short:] for c in (ref[0], ref[2], ref[4], ref[5])] + [ref[0], ref[1]]
            for view, want in zip(history, wants):
                assert list(view) == want
                kept.append((view, tuple(want)))
            assert tuple(ring.last()) == records[-1] and ring.last_recv() == float(t)
        assert [tuple(view) for view, _ in kept] == [want for _, want in kept]
    assert stepring._KNOWN_BLOCK == array("b", [3] * 64)  # shared by every ring: never written
    assert not any(stepring._ZQ) and not any(stepring._ZD) and not any(stepring._ZB)
    assert all(not any(pad) for pads in (stepring._PAD_Q, stepring._PAD_D, stepring._PAD_B) for pad in pads)
