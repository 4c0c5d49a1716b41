"""Pilot tests of the Textual UI over a synthetic 2-rank stream (ReplaySource)."""

from __future__ import annotations

import dataclasses

import pytest

from flowtop.app import FlowtopApp, SnapshotSource
from flowtop.replay import ReplaySource, synthetic_snapshot, synthetic_stream
from flowtop.screens.help_screen import HelpScreen
from flowtop.screens.kernel_screen import KernelScreen
from flowtop.screens.main_screen import MainScreen
from flowtop.screens.rank_detail_screen import RankDetailScreen
from flowtop.widgets.hints_panel import HintsPanel
from flowtop.widgets.job_header import JobHeader
from flowtop.widgets.rank_table import RankTable

SIZE = (80, 24)


def _app(snaps: list | None = None) -> tuple[FlowtopApp, ReplaySource]:
    source = ReplaySource(snaps or synthetic_stream(), advance=False)
    return FlowtopApp(source, refresh_s=0), source


def _cells(table: RankTable, row: int) -> list[str]:
    return [str(getattr(c, "plain", c)) for c in table.get_row_at(row)]


def test_replay_source_is_a_snapshot_source() -> None:
    assert isinstance(ReplaySource(synthetic_stream()), SnapshotSource)


def test_replay_source_advances_then_stays_on_last() -> None:
    stream = synthetic_stream()
    src = ReplaySource(stream)
    served = [src.snapshot() for _ in range(5)]
    assert served == [stream[0], stream[1], stream[2], stream[2], stream[2]]
    with pytest.raises(ValueError):
        ReplaySource([])


@pytest.mark.asyncio
async def test_rows_appear_for_two_ranks_and_update() -> None:
    app, source = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert source.started
        table = app.screen.query_one(RankTable)
        assert table.row_count == 2
        assert _cells(table, 0) == ["0", "gpu-node-00", "120", "200.0ms", "81.9k", "500T", "50.5%", "100", "50", "live"]
        assert _cells(table, 1) == ["1", "gpu-node-00", "119", "236.0ms", "69.4k", "424T", "42.8%", "100", "42", "live"]
        table.move_cursor(row=1)
        source.advance()
        app.refresh_snapshot()
        await pilot.pause()
        # Next snapshot: values change in place, the cursor stays on rank 1.
        assert _cells(table, 0)[2:4] == ["121", "190.0ms"]
        assert _cells(table, 1)[2:4] == ["120", "250.0ms"]
        assert table.cursor_row == 1
        source.advance()
        app.refresh_snapshot()
        await pilot.pause()
        assert _cells(table, 1)[-1] == "stale"


@pytest.mark.asyncio
async def test_header_states_mfu_conventions() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        snap = app.latest
        assert snap is not None
        text = JobHeader.render_text(snap, snap.jobs[0], 0, 1).plain.splitlines()
        assert text[0] == "job gpt-demo  ranks 2/2  step 119  running  rx 4,120"
        assert text[1] == "step time 236.0ms  tokens/s 151.3k  model FLOP/s 847.5T  executed 949.2T"
        assert text[2] == "MFU 42.8 % (model FLOPs, attn full, peak bf16 989TF/GPU, datasheet H200 SXM)"
        assert text[3].startswith("HFU 48.0 % (executed FLOPs")


@pytest.mark.asyncio
async def test_q_quits_and_stops_the_source() -> None:
    app, source = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
        assert source.stopped
    assert app.return_code == 0


@pytest.mark.asyncio
async def test_help_opens_and_closes() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)


@pytest.mark.asyncio
async def test_k_requests_kernels_of_selected_rank() -> None:
    app, source = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down", "k")
        await pilot.pause()
        assert source.kernel_requests == [("gpt-demo", 1)]
        await pilot.press("up", "k")
        assert source.kernel_requests == [("gpt-demo", 1), ("gpt-demo", 0)]


@pytest.mark.asyncio
async def test_enter_opens_kernel_screen_and_escape_returns() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, KernelScreen)
        assert (app.screen.job_name, app.screen.rank) == ("gpt-demo", 1)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)


@pytest.mark.asyncio
async def test_d_opens_rank_detail() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, RankDetailScreen)
        assert app.screen.rank == 0
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)


@pytest.mark.asyncio
async def test_hint_expands_with_enter() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        hints = app.screen.query_one(HintsPanel)
        # Ordered by severity, then impact: critical idle GPU first.
        assert [o.id for o in hints.options] == ["gpu-idle|job|", "straggler|rank|rank 1", "info-attn|kernel|flash_bwd"]
        await pilot.press("tab", "down", "enter")
        await pilot.pause()
        assert hints.expanded == {"straggler|rank|rank 1"}
        prompt = str(hints.get_option("straggler|rank|rank 1").prompt)
        assert "evidence: step_time_s=0.236, median_s=0.2, ranks=2" in prompt
        assert "fix: check rank 1's input pipeline" in prompt
        # Expansion survives the next snapshot; Enter again collapses.
        app.refresh_snapshot()
        await pilot.pause()
        assert hints.expanded == {"straggler|rank|rank 1"}
        await pilot.press("enter")
        await pilot.pause()
        assert hints.expanded == set()


@pytest.mark.asyncio
async def test_no_snapshot_yet_and_broken_source() -> None:
    class Broken(ReplaySource):
        def snapshot(self):  # type: ignore[override]
            raise RuntimeError("socket gone")

    app = FlowtopApp(Broken(synthetic_stream()), refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.latest is None
        assert app.source_error == "RuntimeError: socket gone"
        assert app.screen.query_one(RankTable).row_count == 0


@pytest.mark.asyncio
async def test_next_job_cycles() -> None:
    a = synthetic_snapshot(120, with_kernels=False)
    b = synthetic_snapshot(50, (0.1,), statuses=("live",), with_kernels=False, job="bert")
    both = dataclasses.replace(a, jobs=a.jobs + b.jobs)
    app, _ = _app([both])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.screen.query_one(RankTable).row_count == 2
        await pilot.press("n")
        await pilot.pause()
        assert app.screen.job_name == "bert"
        assert app.screen.query_one(RankTable).row_count == 1
