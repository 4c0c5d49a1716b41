"""A hang hint holds since when its stall counts (flowtop.monitor.hintclock): its summary and its
growing evidence are said at a snapshot's time, it stays the same record from evaluation to
evaluation while nothing else of it moves, and it stops growing once only held or ended."""

from __future__ import annotations

import dataclasses

import pytest

from flowtop.monitor.hintclock import Growing, HintClock, with_parts
from flowtop.monitor.hints import HintEngine
from flowtop.monitor.snapshot import Hint
from tests.test_hints_factories import _stalled, history, job, rank, small_hang_rules


def _hang(hints: tuple[Hint, ...]) -> Hint:
    (h,) = [h for h in hints if h.id == "hang_all"]
    return h


def test_a_hang_hint_is_the_same_record_while_its_stall_holds_and_says_its_seconds_at_display() -> None:
    snap = job(_stalled(0, 5.0, 0.0), _stalled(1, 5.5, 0.0))  # last steps 5 s and 5.5 s before t = 0
    engine = HintEngine(small_hang_rules())
    first = _hang(engine.evaluate(snap, 0.0))
    assert first.summary == "" and "stalled_s" not in first.evidence and first.clock is not None
    later = _hang(engine.evaluate(snap, 7.0))
    assert later is first  # measured again (its stall_x grew), nothing else moved: no new record
    assert first.summary_at(0.0).startswith("all 2 ranks stopped at step 10: no step for 5 s ")
    assert first.summary_at(7.0).startswith("all 2 ranks stopped at step 10: no step for 12 s ")
    ev = first.evidence_at(7.0)
    assert ev["stalled_s"] == pytest.approx(12.0) and ev["stalled_x"] == ev["stalled_s"] / ev["limit_s"]


def test_a_held_hang_hint_stops_growing_where_it_last_measured() -> None:
    engine = HintEngine(small_hang_rules())
    hung = job(_stalled(0, 5.0, 0.0))
    first = _hang(engine.evaluate(hung, 0.0))
    assert first.summary_at(0.0).startswith("the only rank stopped at step 10: no step for 5 s")
    stepping = job(rank(0, step=60, hist=history(60, 0.1, t0=-5.0)))  # it stepped again at t = 1
    held = _hang(engine.evaluate(stepping, 1.0))  # back past the clear value: held for HOLD_S
    assert held.clock is None and held.summary_at(9.0) == held.summary_at(1.0) == held.summary
    assert held.summary.startswith("the only rank stopped at step 10: no step for 5 s")  # as at t = 0


def test_a_summary_splits_at_its_templates_fields_never_in_the_text_of_a_field() -> None:
    """A failed rank's exception may hold braces; only the template's own fields are split."""
    template = "{who} ({why}) for {stalled_s:.0f} s; silent {silent_s:.1f} s {{x}}"
    clock = with_parts(HintClock(100.0, 10.0, 90.0), template,
                       {"who": "rank 2", "why": "KeyError('{stalled_s}')"}, lambda t, f: t.format_map(f))
    assert clock.parts == ("rank 2 (KeyError('{stalled_s}')) for ", Growing("stalled_s", ".0f"), " s; silent ",
                           Growing("silent_s", ".1f"), " s {x}")
    assert clock.text(112.4) == "rank 2 (KeyError('{stalled_s}')) for 12 s; silent 22.4 s {x}"
    assert dataclasses.replace(clock, silent_since=None).figures(110.0) == {"stalled_s": 10.0, "stalled_x": 1.0}
