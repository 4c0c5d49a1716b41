"""Golden screens of the rank view at 4,096 synthetic ranks, 80x24 and 200x50.

Same mechanism and policy as tests/test_tui_snapshots.py (text and SVG; any Textual or Rich
other than the pinned ones the goldens were recorded with fails); regenerate with
``FLOWTOP_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_rank_view_snapshots.py``.
"""

from __future__ import annotations

import pytest

from flowtop.tui.app import FlowtopApp
from synthetic.replay import ReplaySource
from synthetic.cluster import cluster_snapshot
from test_tui_snapshots import GOLDEN, SCREENSHOTS, UPDATE, VERSIONS, normalise_svg, require_golden_versions, screen_text

# name -> (terminal size, keys pressed on the main screen before the capture)
SCENARIOS: dict[str, tuple[tuple[int, int], tuple[str, ...]]] = {
    "rank-view-80x24": ((80, 24), ()),  # 512 node rows worst first, the map at 8 ranks a cell
    "rank-view-200x50": ((200, 50), ("enter",)),  # the hung rank's node opened; the 64x64 map
}


async def capture(size: tuple[int, int], keys: tuple[str, ...]) -> tuple[str, str]:
    app = FlowtopApp(ReplaySource([cluster_snapshot(0)], advance=False), refresh_s=0)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        return screen_text(app), app.export_screenshot(title=f"flowtop {' '.join(keys)}".strip())


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_rank_view_matches_golden(name: str) -> None:
    text, svg = await capture(*SCENARIOS[name])
    txt_path, svg_path, versions_path = GOLDEN / f"{name}.txt", GOLDEN / f"{name}.svg", GOLDEN / "VERSIONS"
    if UPDATE:
        txt_path.write_text(text, encoding="utf-8")
        svg_path.write_text(svg, encoding="utf-8")
        (SCREENSHOTS / f"{name}.svg").write_text(svg, encoding="utf-8")
        versions_path.write_text(VERSIONS + "\n", encoding="utf-8")
    assert text == txt_path.read_text(encoding="utf-8"), f"{name}: screen text changed (see module docstring)"
    require_golden_versions(name)
    assert normalise_svg(svg) == normalise_svg(svg_path.read_text(encoding="utf-8")), f"{name}: SVG changed"
