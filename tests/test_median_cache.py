"""RankState.med_cache (rankstate.MedianCache): the median step time and tokens per step that every
status check reads, computed again only when a step arrived; pinned by hand."""

from __future__ import annotations

import statistics

import pytest

from flowtop.monitor import rankstate as rs
from probe.wire import RankKey


def _step(st: rs.RankState, step: int, wall_s: float, tokens: int) -> None:
    st.steps.append((step, wall_s, tokens, None, float(step), None))
    st.step = step  # as the model sets it


def test_the_median_is_kept_until_a_step_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    sorts: list[int] = []
    median = statistics.median
    monkeypatch.setattr(rs.statistics, "median", lambda xs: sorts.append(len(xs)) or median(xs))
    st = rs.RankState(key=RankKey("j", "h", 1, 0, 0), first_seen=0.0, last_recv=0.0)
    assert rs.median_step(st) is None and st.med_cache == rs.MedianCache(0, 0, None, 0.0)
    for step, wall in enumerate((9.0, 0.1, 0.3, 0.2, 0.4), start=1):
        _step(st, step, wall, 512)
    # step 1 (warm-up) left out: median of 0.1, 0.3, 0.2, 0.4 = 0.25; tokens 512 a step
    sorts.clear()
    assert rs.median_step(st) == pytest.approx(0.25)
    assert st.med_cache == rs.MedianCache(5, 5, pytest.approx(0.25), 512.0) and sorts == [4, 5]
    st.version += 1  # a telemetry frame: no new step, nothing sorted again
    assert rs.median_step(st) == pytest.approx(0.25)
    assert rs.tokens_per_s(st, 0.25, None) == pytest.approx(512 / 0.25)
    assert rs.tokens_per_s(st, 0.25, 3.0) == 0.0  # stalled: no rate
    assert sorts == [4, 5]
    _step(st, 6, 0.5, 0)  # a step without tokens: its rate is unknown
    assert rs.median_step(st) == pytest.approx(0.3) and sorts == [4, 5, 5]  # the tokens' median not taken
    assert st.med_cache.tokens == 0.0 and rs.tokens_per_s(st, 0.3, None) is None
