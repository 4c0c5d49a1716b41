"""The UI's lines are freed by reference counting when the screen replaces them
(flowtop.tui.widgets._strip_cycles): a monitor freezes its objects at each tick
(flowtop.monitor.gcpolicy), so every line left in a reference cycle waited for the full
collection."""

from __future__ import annotations

import gc
from typing import Iterator

import pytest
from rich.segment import Segment
from textual.strip import Strip

from flowtop.tui.app import FlowtopApp
from flowtop.tui.widgets import _strip_cycles
from synthetic.cluster import cluster_snapshot
from synthetic.replay import ReplaySource


@pytest.fixture()
def saving() -> Iterator[None]:
    """Collections keep what they find unreachable in gc.garbage while the test runs."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _cached_in(strip: Strip) -> list[object]:
    """What the caches of ``strip`` hold (each cache keeps a dict of results; a division's result
    is a list of strips)."""
    out: list[object] = []
    for cache in gc.get_referents(strip):
        for d in gc.get_referents(cache):
            if isinstance(d, dict):
                for v in d.values():
                    out.extend(v if isinstance(v, list) else [v])
    return out


def _unreachable_holding_themselves() -> int:
    """Unreachable strips that hold themselves in their own caches."""
    gc.collect()
    return sum(1 for o in gc.garbage if type(o) is Strip and any(v is o for v in _cached_in(o)))


def test_a_strip_cropped_or_divided_over_its_whole_width_does_not_hold_itself(saving: None) -> None:
    _strip_cycles.install()
    strip = Strip([Segment("flow"), Segment("top")], 7)
    assert strip.crop_extend(0, 7, None) is strip  # what Textual gives: the strip itself ...
    assert list(strip.divide([7])) == [strip]
    wider = strip.crop_extend(0, 9, None)  # ... or a new one, still cached
    assert wider is not strip and wider.cell_length == 9 and strip.crop_extend(0, 9, None) is wider
    assert [s.text for s in strip.divide([4, 7])] == ["flow", "top"]
    assert not any(v is strip for v in _cached_in(strip))
    del strip, wider
    assert _unreachable_holding_themselves() == 0


@pytest.mark.asyncio
async def test_the_rank_view_leaves_no_line_holding_itself_as_it_refreshes(saving: None) -> None:
    """Nine refreshes of 4,096 ranks at 200×50 (without the fix: ~820 lines left in cycles of
    their own). Other cycles Textual makes, such as the style nodes of the hints list that each
    refresh rebuilds, are not the lines' and not counted here."""
    snaps = [cluster_snapshot(t) for t in range(12)]
    app = FlowtopApp(ReplaySource(snaps[:1], advance=False), refresh_s=0)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        for i, snap in enumerate(snaps[1:]):
            if i == 2:  # what the app's start left behind is not a refresh's
                gc.collect()
                gc.garbage.clear()
            app.screen.show(snap)  # type: ignore[attr-defined]
            await pilot.pause()
        held = _unreachable_holding_themselves()
    assert held == 0
