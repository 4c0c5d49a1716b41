"""UI habits (issue 11 part 4): --version, an SVG screenshot key, the light theme, column headers
of the kernel tables sort on a click, the footer's recording state and monitor CPU. Pilot tests
over the synthetic stream, a real collector recording to a real file, a real recording replayed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import Static

from flowtop.monitor.collector import Collector
from flowtop.monitor.recording import Recorder, RecordingSource
from flowtop.monitor.selfload import LoadMeter
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tui.app import FlowtopApp
from flowtop.tui.screens.job_kernel_screen import JobKernelScreen
from flowtop.tui.screens.kernel_screen import KernelScreen
from flowtop.tui.widgets.job_kernel_table import JobKernelTable
from flowtop.tui.widgets.kernel_table import COLUMNS, KernelTable
from flowtop.tui.widgets.status_footer import StatusFooter
from synthetic.replay import ReplaySource, synthetic_stream

SIZE = (80, 24)
DATA = Path(__file__).resolve().parent / "data"


def _app(**kwargs: object) -> FlowtopApp:
    return FlowtopApp(ReplaySource(synthetic_stream(), advance=False), refresh_s=0, **kwargs)  # type: ignore[arg-type]


def _status(app: FlowtopApp) -> Static:
    return app.screen.query_one(StatusFooter).query_one("#monitor-status", Static)


def test_version() -> None:
    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert re.fullmatch(r"flowtop \S+ \(wire 1\.\d+, snapshot 1\.\d+\)\n", out.stdout), out.stdout


@pytest.mark.asyncio
async def test_p_saves_an_svg_of_the_screen_and_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWTOP_SCREENSHOT_DIR", str(tmp_path))
    app = _app()
    told: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.notify = lambda message, **kw: told.append(str(message))  # type: ignore[method-assign]
        await pilot.press("p")
        await pilot.press("enter")  # the kernel screen: a second shot, another file
        await pilot.press("p")
        await pilot.pause()
    files = sorted(tmp_path.glob("flowtop-*.svg"))
    assert {f.name.split("-")[-1] for f in files} == {"KernelScreen.svg", "MainScreen.svg"}
    main = next(f for f in files if "MainScreen" in f.name)
    svg = main.read_text()
    assert svg.startswith("<svg") and "gpt-demo" in svg.replace("&#160;", " ")
    assert any(str(main) in t and t.startswith("screenshot saved to") for t in told), told


@pytest.mark.asyncio
async def test_screenshot_into_a_missing_directory_is_an_error_notice(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWTOP_SCREENSHOT_DIR", str(tmp_path / "no" / "such"))
    app = _app()
    told: list[tuple[str, str]] = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.notify = lambda message, severity="information", **kw: told.append((str(message), severity))  # type: ignore
        await pilot.press("p")
    assert told and told[0][1] == "error" and "screenshot not saved" in told[0][0]


@pytest.mark.asyncio
async def test_light_theme() -> None:
    dark, light = _app(), _app()
    light.theme = "textual-light"  # what flowtop top --theme light does
    async with dark.run_test(size=SIZE) as pilot:
        await pilot.pause()
        dark_bg = dark.screen.styles.background
    async with light.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not light.current_theme.dark
        light_bg = light.screen.styles.background
        assert "gpt-demo" in light.export_screenshot()
    assert light_bg.brightness > 0.7 > 0.3 > dark_bg.brightness
    bad = subprocess.run([sys.executable, "-m", "flowtop.cli", "top", "--theme", "blue"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'blue'" in bad.stderr


def _header_x(key: str) -> int:
    """Offset of a kernel-table column's label (DataTable cells have one cell of padding each side)."""
    x = 0
    for k, _, width in COLUMNS:
        if k == key:
            return x + 2
        x += width + 2
    raise KeyError(key)


@pytest.mark.asyncio
async def test_a_click_on_a_kernel_column_header_sorts_by_it() -> None:
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, KernelScreen)
        table = app.screen.query_one(KernelTable)
        assert table.sort_index == 0 and not table.reverse
        await pilot.click(KernelTable, offset=(_header_x("calls"), 0))
        await pilot.pause()
        assert table.sort_index == 1 and not table.reverse
        calls = [r.calls for r in table.order]
        assert calls == sorted(calls, reverse=True)
        await pilot.click(KernelTable, offset=(_header_x("calls"), 0))  # again: reversed
        await pilot.pause()
        assert table.reverse and [r.calls for r in table.order] == sorted(calls)
        assert "▲" in str(table.columns["calls"].label)  # type: ignore[index]
        await pilot.click(KernelTable, offset=(_header_x("name"), 0))
        await pilot.pause()
        assert table.sort_index == 5 and not table.reverse
        await pilot.click(KernelTable, offset=(_header_x("category"), 0))  # no sort by category
        await pilot.pause()
        assert table.sort_index == 5


@pytest.mark.asyncio
async def test_a_click_on_a_job_kernel_header_picks_the_order() -> None:
    app = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("j")
        await pilot.pause()
        assert isinstance(app.screen, JobKernelScreen)
        table = app.screen.query_one(JobKernelTable)
        assert not table.by_mean
        mean_x = 3 + 29 + 6 + 2  # mark, name, category, then mean's label
        await pilot.click(JobKernelTable, offset=(mean_x, 0))
        await pilot.pause()
        assert table.by_mean and "by mean time" in str(app.screen.query_one("#job-kernel-title", Static).render())
        means = [r.mean_us for r in table.order]
        assert means == sorted(means, reverse=True)
        await pilot.click(JobKernelTable, offset=(mean_x + 27, 0))  # spread
        await pilot.pause()
        assert not table.by_mean


@pytest.mark.asyncio
async def test_footer_says_rec_and_the_monitor_cpu(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "live.rec")
    collector = Collector(make_model(), f"tcp://127.0.0.1:{free_port_pair()}", recorder=recorder)
    app = FlowtopApp(collector, refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        footer = app.screen.query_one(StatusFooter)
        label = _status(app)
        assert label.display and str(label.render()) == "REC"
        clock = {"wall": 100.0, "cpu": 10.0}
        footer.meter = LoadMeter(wall=lambda: clock["wall"], cpu=lambda: clock["cpu"])
        footer.update_status()
        clock["wall"], clock["cpu"] = 102.0, 11.25  # 1.25 CPU seconds in 2 s
        footer.update_status()
        assert str(label.render()) == "REC cpu 62%"
        # The keys keep their place: the status is docked at the right of the same line.
        assert footer.region.height == 1 and label.region.right == SIZE[0]
    recorder.error = "disk full"  # a recording that stopped
    app = FlowtopApp(collector, refresh_s=0)
    collector.recorder = None
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert str(_status(app).render()) == "REC stopped"


@pytest.mark.asyncio
async def test_footer_of_a_replay_and_of_a_live_app() -> None:
    app = FlowtopApp(RecordingSource(DATA / "h200-gpt-small.rec.gz", make_model(), speed=50.0), refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert str(_status(app).render()) == "replay"
        for key, screen in (("enter", KernelScreen), ("escape", None), ("d", None), ("escape", None), ("j", None)):
            await pilot.press(key)  # every screen's footer says it
            await pilot.pause()
            assert screen is None or isinstance(app.screen, screen)
            assert str(_status(app).render()) == "replay", type(app.screen).__name__
    app = _app()  # a prepared list (the goldens): nothing to say, no cell taken
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not _status(app).display
    live = FlowtopApp(ReplaySource(synthetic_stream()), refresh_s=0.5)
    async with live.run_test(size=SIZE) as pilot:
        for _ in range(50):  # the first reading after EVERY_S (2 s)
            await pilot.pause(0.1)
            if "cpu" in str(_status(live).render()):
                break
        text = str(_status(live).render())
        assert re.fullmatch(r"cpu \d+%", text), text
