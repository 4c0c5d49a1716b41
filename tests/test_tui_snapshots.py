"""Golden screens of the UI at 80x24: text always, SVG when the Textual/Rich versions match.

The committed goldens live in tests/snapshots/ (NAME.txt, NAME.svg) and copies of the SVGs in
screenshots/ for the README. Regenerate both after an intended change with::

    FLOWTOP_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_tui_snapshots.py

The text golden is the screen's characters (no colours), so it is stable across terminals and
font metrics; the SVG adds colours, with Rich's content-hash ids normalised. Textual's and Rich's
SVG writers change between releases, so pyproject.toml pins both exactly and
tests/snapshots/VERSIONS records the versions the goldens were drawn with: any other version
fails (it is never skipped), saying how to regenerate.
"""

from __future__ import annotations

import io
import os
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from rich.console import Console

from flowtop.monitor.recording import replay_all
from flowtop.monitor.wiring import make_model
from flowtop.tui.app import FlowtopApp
from synthetic.replay import ReplaySource, synthetic_stream

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "snapshots"
SCREENSHOTS = HERE.parent / "screenshots"
UPDATE = os.environ.get("FLOWTOP_UPDATE_SNAPSHOTS") == "1"
SIZE = (80, 24)
VERSIONS = f"textual {version('textual')}, rich {version('rich')}"

# name -> keys pressed on the main screen before the capture
SCENARIOS: dict[str, tuple[str, ...]] = {
    "main": ("tab", "enter", "shift+tab"),  # first hint expanded, cursor back on the ranks
    "kernels": ("enter",),  # rank 1's kernel window (the first row: worst first)
    "detail": ("d",),
    "job-kernels": ("j",),
}


def screen_text(app: FlowtopApp) -> str:
    """The current screen as plain text lines (what export_screenshot draws, minus styles)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def require_golden_versions(name: str) -> None:
    """Fail unless the running Textual and Rich are those the SVG goldens were recorded with."""
    recorded = (GOLDEN / "VERSIONS").read_text(encoding="utf-8").strip()
    if recorded != VERSIONS:
        pytest.fail(
            f"{name}: SVG goldens were recorded with {recorded}, running {VERSIONS}. Install the pinned "
            "versions (pip install -e .), or after an intended upgrade change the pins in pyproject.toml, "
            "regenerate with FLOWTOP_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_tui_snapshots.py "
            "tests/test_rank_view_snapshots.py and review the diff.",
            pytrace=False,
        )


def normalise_svg(svg: str) -> str:
    """Drop what may differ between two renders of the same screen (Rich's hash-based ids)."""
    return re.sub(r"terminal-\d+", "terminal", svg)


# Real data: the end of a recording made on an H200 by bench/gpu_check.py (940 M-parameter GPT,
# bf16, MFU 51 %), at a size that shows the whole kernel table.
RECORDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "h200-large": ("h200-gpt-large.rec.gz", ()),
    "h200-large-kernels": ("h200-gpt-large.rec.gz", ("enter",)),
    "h200-large-detail": ("h200-gpt-large.rec.gz", ("d",)),
    "h200-small": ("h200-gpt-small.rec.gz", ()),
}
RECORDED_SIZE = (110, 30)


async def capture(keys: tuple[str, ...], recording: str | None = None) -> tuple[str, str]:
    if recording is None:
        source, size = ReplaySource(synthetic_stream(), advance=False), SIZE
    else:
        snap = replay_all(HERE / "data" / recording, make_model())
        source, size = ReplaySource([snap], advance=False), RECORDED_SIZE
    app = FlowtopApp(source, refresh_s=0)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        return screen_text(app), app.export_screenshot(title=f"flowtop {' '.join(keys)}".strip())


@pytest.mark.asyncio
@pytest.mark.parametrize("name", [*SCENARIOS, *RECORDED])
async def test_screen_matches_golden(name: str) -> None:
    if name in RECORDED:
        recording, keys = RECORDED[name]
        text, svg = await capture(keys, recording)
    else:
        text, svg = await capture(SCENARIOS[name])
    txt_path, svg_path = GOLDEN / f"{name}.txt", GOLDEN / f"{name}.svg"
    versions_path = GOLDEN / "VERSIONS"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        SCREENSHOTS.mkdir(exist_ok=True)
        txt_path.write_text(text, encoding="utf-8")
        svg_path.write_text(svg, encoding="utf-8")
        (SCREENSHOTS / f"{name}.svg").write_text(svg, encoding="utf-8")
        versions_path.write_text(VERSIONS + "\n", encoding="utf-8")
    assert text == txt_path.read_text(encoding="utf-8"), f"{name}: screen text changed (see module docstring)"
    require_golden_versions(name)
    assert normalise_svg(svg) == normalise_svg(svg_path.read_text(encoding="utf-8")), f"{name}: SVG changed"


@pytest.mark.asyncio
async def test_capture_is_deterministic() -> None:
    first = await capture(SCENARIOS["kernels"])
    second = await capture(SCENARIOS["kernels"])
    assert first[0] == second[0]
    assert normalise_svg(first[1]) == normalise_svg(second[1])
    assert "GPU kernels · rank 1" in first[0]


def test_goldens_versions_are_the_ones_pyproject_pins() -> None:
    """The project declares exactly the Textual and Rich that drew the goldens (no range a user
    could install and then see different screens)."""
    import tomllib

    deps = tomllib.loads((HERE.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    pins = {d.split("==")[0]: d.split("==")[1] for d in deps if d.split("==")[0] in ("textual", "rich")}
    recorded = (GOLDEN / "VERSIONS").read_text(encoding="utf-8").strip()
    assert recorded == f"textual {pins.get('textual')}, rich {pins.get('rich')}", (recorded, deps)
