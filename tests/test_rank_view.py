"""Pilot tests of the rank view at 4,096 synthetic ranks: node rows, filter, sorts (keys and a
header click), the rank map's cursor, the selection staying on its rank while rows move, and
only changed lines refreshed. Snapshots come from synthetic.cluster (real dataclasses)
and are handed to the screen's ``show`` as the app hands it each snapshot."""

from __future__ import annotations

import dataclasses

import pytest

from flowtop.tui.app import FlowtopApp
from synthetic.replay import ReplaySource
from flowtop.monitor.rankorder import LazyRows
from flowtop.monitor.rankview import NodeRow, RankRow, node_key
from synthetic.cluster import cluster_snapshot
from flowtop.tui.widgets.hints_panel import HintsPanel
from flowtop.tui.widgets.rank_map import RankMap
from flowtop.tui.widgets.rank_summary import RankSummary
from flowtop.tui.widgets.rank_table import COLUMNS, RankTable
from textual.widgets import Input

NARROW, WIDE = (80, 24), (200, 50)
SNAPS = [cluster_snapshot(t) for t in range(3)]


def _app(snaps: list | None = None) -> FlowtopApp:
    return FlowtopApp(ReplaySource(snaps or SNAPS[:1], advance=False), refresh_s=0)


async def _deliver(app: FlowtopApp, pilot, snap) -> None:
    """Render ``snap`` as the screen renders every snapshot it is handed."""
    app.screen.show(snap)  # type: ignore[attr-defined]
    await pilot.pause()


def _hosts(table: RankTable, n: int) -> list[str]:
    return [row.host if isinstance(row, NodeRow) else row.rank.host for row in table.view.rows[:n]]


def _map_cell(rank_map: RankMap, x: int, y: int):
    """The segment drawing character (x, y) of the map."""
    left = 0
    for seg in rank_map.render_line(y)._segments:
        if left <= x < left + len(seg.text):
            return seg
        left += len(seg.text)
    raise AssertionError(f"no character at {x}")


@pytest.mark.asyncio
async def test_grouped_view_opens_and_closes_nodes() -> None:
    app = _app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        # 512 node rows, closed, worst first: the dead rack (silent), the hung rank's node, the
        # node whose rank is claimed twice, the slow node.
        assert table.row_count == 512
        assert _hosts(table, 7) == ["node300", "node301", "node302", "node303", "node154", "node375", "node037"]
        # A node row: rank count, lowest step, largest lag, slowest step, worst input wait, sums,
        # min/median MFU, worst status.
        assert table.row_text(0) == ["▸ 8", "node300", "996", "4", "206ms", "1.0%", "0", "0", "0/0%", "",
                                     "stale"]  # fmt: skip
        assert table.row_text(4) == ["▸ 8", "node154", "990", "10", "205ms", "1.0%", "573k", "3.11P", "0/45%", "",
                                     "stalled"]  # fmt: skip
        assert table.row_text(6) == ["▸ 8", "node037", "997", "3", "260ms", "1.0%", "504k", "2.74P", "35/35%", "",
                                     "live"]  # fmt: skip
        assert "4,097 ranks · 512 nodes · worst first" in str(table.border_title)
        await pilot.press("down", "down", "down", "down", "enter")  # open node154: its ranks follow, the hung one first
        assert table.row_count == 520
        assert isinstance(table.view.rows[5], RankRow) and table.view.rows[5].rank.rank == 1234
        assert table.row_text(4)[0] == "▾ 8"
        await pilot.press("down", "left")  # from one of its ranks, ← closes the node
        assert table.row_count == 512 and table.cursor_key == node_key("llm-4k", "node154")
        await pilot.press("plus")  # every node open
        assert table.row_count == 512 + 4097
        await pilot.press("minus", "g")  # flat: one row per rank process
        assert table.row_count == 4097 and table.selected is not None and table.selected.rank == 1234
        assert "flat" in str(table.border_title)
        rows = table.view.rows
        made = rows.made if isinstance(rows, LazyRows) else -1
        assert 0 < made < 100  # those drawn and around the cursor, not the 4,097
        await pilot.press("plus")  # no node row to open: it made every one of the 4,097 rows
        assert table.view.rows is rows and rows.made == made and table.row_count == 4097


@pytest.mark.slow
@pytest.mark.asyncio
async def test_filter_by_glob_range_status_and_hint_then_escape() -> None:
    app = _app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        await pilot.press("slash")
        box = app.screen.query_one("#rank-filter", Input)
        assert box.display and box.has_focus
        await pilot.press(*"node01*")
        assert _hosts(table, 20) == [f"node0{n}" for n in range(10, 20)][: table.row_count] or table.row_count == 10
        assert sorted(_hosts(table, 10)) == [f"node0{n}" for n in range(10, 20)]
        assert "80 of 4,097 ranks" in str(table.border_title) and "filter: node01*" in str(table.border_title)
        await pilot.press("enter")  # close the line, keep the filter, back to the table
        assert not box.display and table.has_focus and table.row_count == 10
        for text, rows in (("128-255", 16), ("stalled", 1), ("input_wait", 2), ("stale stalled", 5 + 33)):
            await pilot.press("slash", "ctrl+u", *text, "enter")  # ctrl+u: the line editor clears what is left of the cursor
            assert table.row_count == rows, text
        assert [r.rank.rank for r in table.view.rows[:2] if isinstance(r, RankRow)] == [2400]  # open: the silent first
        await pilot.press("slash")
        box.value = "rank:9-1"  # no such range: the filter stays as it was
        await pilot.pause()
        assert box.has_class("-invalid") and table.spec.filter.text == "stale stalled"
        box.value = "stalld"  # a typo is no host of the job: said, not a glob that keeps no rank
        await pilot.pause()
        assert box.has_class("-invalid") and "'stalld' is no status" in str(box.tooltip)
        assert table.spec.filter.text == "stale stalled"
        await pilot.press("escape")  # clears the filter and closes the line
        assert not box.display and not table.spec.filter.active and table.row_count == 512


@pytest.mark.asyncio
async def test_a_filter_error_quoting_brackets_is_shown_as_typed() -> None:
    """A filter line with brackets ('rank:[/x]') is refused and its tooltip says so as typed: read
    as markup, the tooltip raised MarkupError on hover and ended the TUI (a reviewer's pilot)."""
    from textual.widgets._tooltip import Tooltip

    app = _app()
    async with app.run_test(size=WIDE, tooltips=True) as pilot:
        await pilot.pause()
        await pilot.press("slash", *"rank:[/x]")
        await pilot.pause()
        box = app.screen.query_one("#rank-filter", Input)
        assert box.has_class("-invalid") and "[/x]" in str(box.tooltip)
        await pilot.hover("#rank-filter", offset=(2, 0))
        await pilot.pause(1.0)  # the tooltip shows after its delay
        assert app.is_running and app.return_code is None
        (tip,) = app.screen.query(Tooltip)
        assert tip.display and "[/x]" in str(tip.render())


@pytest.mark.asyncio
async def test_sort_by_keys_and_by_clicking_a_header() -> None:
    app = _app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        await pilot.press("g", "s")  # flat, then the first column: rank
        assert table.spec.sort == "rank" and [table.row_text(i)[0] for i in range(3)] == ["0", "1", "2"]
        await pilot.press("r")
        assert table.row_text(0)[0] == "4095"
        await pilot.press("s")  # host
        assert table.row_text(0)[1] == "node000" and "by host ▲" in str(table.border_title)
        await pilot.press("w")
        assert table.spec.sort == "worst" and table.row_text(0)[0] == "2400"  # the dead rack's first rank
        x = 1 + sum(c.width + 1 for c in COLUMNS[: [c.key for c in COLUMNS].index("mfu")])
        await pilot.click(RankTable, offset=(x + 2, 1))  # the header line, under the border
        assert table.spec.sort == "mfu" and not table.spec.reverse
        assert table.row_text(0)[8] == "0.0%"  # lowest MFU first
        await pilot.click(RankTable, offset=(x + 2, 1))  # again: reversed
        assert table.spec.reverse and table.row_text(0)[8] == "46.4%"
        assert "▼MFU" in "".join(s.text for s in table.render_line(0)._segments)
        await pilot.click(RankTable, offset=(3, 1))  # the rank column
        assert table.spec.sort == "rank"


@pytest.mark.asyncio
async def test_selection_stays_on_its_rank_while_rows_move() -> None:
    app = _app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        await pilot.press("g")  # flat, worst first: healthy ranks are ordered by MFU
        table.move_cursor(300)
        key = table.cursor_key
        moved = 0
        for snap in SNAPS[1:]:
            before = table.cursor_row
            await _deliver(app, pilot, snap)
            assert table.cursor_key == key and table.view.rows[table.cursor_row].key == key
            moved += table.cursor_row != before
        assert moved  # the rank changed rows, the cursor went with it
        await pilot.press("g")  # grouped: the cursor lands on the rank's node row
        assert table.cursor_key == node_key("llm-4k", key[1])
        await _deliver(app, pilot, SNAPS[0])
        assert table.cursor_key == node_key("llm-4k", key[1])


@pytest.mark.asyncio
async def test_rank_map_cursor_selects_a_rank() -> None:
    app = _app()
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        table, rank_map = app.screen.query_one(RankTable), app.screen.query_one(RankMap)
        layout = rank_map.grid.layout
        assert (layout.per_cell, layout.width, layout.text_size) == (1, 64, (64, 32))  # 4,096 in 64x64
        assert rank_map.cursor_rank == 2400  # the table's selection (the dead rack's first node)
        # Click the character holding ranks 1170 (top) and 1234 (bottom): the worse one wins.
        await pilot.click(RankMap, offset=(1 + 1234 % 64, 1 + 1234 // 128))
        assert table.selected is not None and table.selected.rank == 1234 and table.has_focus
        assert _map_cell(rank_map, 1234 % 64, 1234 // 128).style.bgcolor.name == "#ffffff"  # the lower half
        assert isinstance(table.view.rows[table.cursor_row], RankRow)  # its node was opened
        await pilot.press("tab", "tab")  # table -> hints -> map
        assert rank_map.has_focus
        await pilot.press("home", "right", "right", "down")  # rank 66: moving selects it...
        assert rank_map.cursor_rank == 66
        assert table.cursor_key == node_key("llm-4k", "node008")  # ...on its (closed) node row
        await pilot.press("enter")  # ...and Enter opens it there
        assert table.has_focus and table.selected.rank == 66 and table.cursor_key[3] == 66  # type: ignore[index]
        await pilot.press("m", "m", "m")  # MFU -> step time -> input wait -> status
        assert rank_map.metric == "status" and "status" in str(rank_map.border_title)


@pytest.mark.asyncio
async def test_rank_map_on_80x24_takes_8_ranks_a_cell() -> None:
    app = _app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        rank_map = app.screen.query_one(RankMap)
        assert rank_map.display and rank_map.grid.layout.per_cell == 8 and rank_map.size.height == 4
        rank_map.focus()
        await pilot.press("home", "down", "enter")  # one cell row down: ranks 512-519
        table = app.screen.query_one(RankTable)
        assert table.selected is not None and 512 <= table.selected.rank < 520
        await pilot.press("M")  # hide the map: room for the table
        assert not rank_map.display and table.size.height > 6


@pytest.mark.asyncio
async def test_only_changed_lines_are_refreshed() -> None:
    app = _app()
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        table, rank_map = app.screen.query_one(RankTable), app.screen.query_one(RankMap)
        await pilot.press("g", "s", "home")  # flat, by rank (rows keep their places), at the top
        await _deliver(app, pilot, cluster_snapshot(0))  # equal values, new objects
        assert (table.lines_refreshed, rank_map.lines_refreshed) == (0, 0)
        job = SNAPS[0].jobs[0]
        ranks = list(job.ranks)
        ranks[2] = dataclasses.replace(ranks[2], status="stale", tokens_per_s=0.0)
        changed = dataclasses.replace(SNAPS[0], jobs=(dataclasses.replace(job, ranks=tuple(ranks)),))
        await _deliver(app, pilot, changed)
        assert table.lines_refreshed == 1 and table.row_text(2)[-1] == "stale"
        assert rank_map.lines_refreshed == 0  # MFU map: rank 2's MFU did not change
        await pilot.press("m", "m", "m")  # status map
        await _deliver(app, pilot, SNAPS[0])
        assert rank_map.lines_refreshed == 1  # one ▀ line holds rank 2


@pytest.mark.asyncio
async def test_only_changed_lines_are_painted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot paints the lines that changed and no others: the table's and the map's titles,
    the same from one snapshot to the next, are not set again (setting one repaints every line of
    its widget: all 48 of the table's and 34 of the map's, each snapshot)."""
    painted = {"table": 0, "map": 0}
    table_line, map_line = RankTable.render_line, RankMap.render_line

    def table_counted(self: RankTable, y: int):
        painted["table"] += 1
        return table_line(self, y)

    def map_counted(self: RankMap, y: int):
        painted["map"] += 1
        return map_line(self, y)

    monkeypatch.setattr(RankTable, "render_line", table_counted)
    monkeypatch.setattr(RankMap, "render_line", map_counted)
    app = _app()
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        await pilot.press("g", "s", "home")  # flat, by rank (rows keep their places), at the top
        await pilot.pause()
        painted.update(table=0, map=0)
        await _deliver(app, pilot, cluster_snapshot(0))  # equal values, new objects
        assert painted == {"table": 0, "map": 0}
        job = SNAPS[0].jobs[0]
        ranks = list(job.ranks)
        ranks[2] = dataclasses.replace(ranks[2], status="stale", tokens_per_s=0.0)
        changed = dataclasses.replace(SNAPS[0], jobs=(dataclasses.replace(job, ranks=tuple(ranks)),))
        await _deliver(app, pilot, changed)
        assert painted == {"table": 1, "map": 0}  # rank 2's line; its MFU did not change


@pytest.mark.asyncio
async def test_line_keys_held_are_one_screens_while_the_cursor_moves() -> None:
    """No new snapshot (a replay at its end, a lost listener): the cursor goes down 120 rows of
    the flat 4,096. The line keys the table remembers are those of the screen it shows (at most
    one a line), not 37 more for every move (50 KB a move, never asked again: 200 MB down 4,096
    rows); the lines still show their rows."""
    app = _app()
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        await pilot.press("g", "s", "home")  # flat, by rank: row i is rank i
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        for _ in range(120):
            await pilot.press("down")
        await pilot.pause()
        assert table.cursor_row == 120 and table.selected is not None and table.selected.rank == 120
        height = table.scrollable_content_region.height
        assert 0 < len(table._keys) <= height
        top = round(table.scroll_y)
        assert table._line_key(1, table.scrollable_content_region.width, top).cells[0][0] == str(top)


@pytest.mark.asyncio
async def test_summary_line_gives_percentiles_across_ranks() -> None:
    app = _app()
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        text = app.screen.query_one(RankSummary).text.plain
        assert text == "p0/50/95/100 step 194/200/205/270ms MFU 0.0/45/46/46% wait 1.0/1.0/1.0/30%"


def _mixed_job_snaps(coords: bool, fp8: bool) -> list:
    """The 2-rank synthetic demo job, its ranks given coordinates (as if ranks 5 and 7 of a
    dp 2 × tp 2 × pp 2 job) and an fp8 + bf16 precision mix on rank 0 (bf16-eq MFU 80 %: fp8
    work read at the bf16 rate) beside a pure-bf16 rank 1 (bf16-eq = MFU)."""
    from flowtop.monitor.precision import DtypeMix
    from synthetic.replay import synthetic_stream

    def mix(shares: dict[str, float]) -> DtypeMix:
        return DtypeMix(model_flops={}, executed_flops={}, peaks={}, peak_flops=None, executed_peak_flops=None,
                        bf16_peak_flops=None, shares=shares)

    def change(snap):  # type: ignore[no-untyped-def]
        job = snap.jobs[0]
        ranks = []
        for r in job.ranks:
            f = r.flops
            if fp8 and r.rank == 0:
                f = dataclasses.replace(f, precision=mix({"fp8_e4m3": 0.8, "bf16": 0.2}), mfu_bf16=0.8)
            else:
                f = dataclasses.replace(f, precision=mix({"bf16": 1.0}), mfu_bf16=f.mfu)
            c = {"dp": (1, 2), "tp": (r.rank, 2), "pp": (1, 2)} if coords else {}
            ranks.append(dataclasses.replace(r, flops=f, coords=c))
        return dataclasses.replace(snap, jobs=(dataclasses.replace(job, ranks=tuple(ranks)),))

    return [change(s) for s in synthetic_stream()]


@pytest.mark.asyncio
async def test_coordinates_and_bf16_equivalent_columns_only_when_a_job_has_them() -> None:
    """A job whose ranks have coordinates gets a `coords` cell ("dp1 tp0 pp1": the rank in each
    role of size > 1), and one with a rank whose mix is not pure bf16 gets `bf16eq` (the
    bf16-equivalent MFU) — both after `state`, so an 80-column terminal keeps the fixed columns
    in view. A job without either keeps the 11 columns (and the goldens). The header of either
    sorts by it."""
    app = _app(_mixed_job_snaps(coords=True, fp8=True))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        assert [c.key for c in table.columns] == [c.key for c in COLUMNS] + ["mfu_bf16", "coords"]
        assert table.columns[-1].width == len("dp1 tp1 pp1")
        rows = {table.view.rows[i].rank.rank: table.row_text(i) for i in range(table.row_count)}
        assert rows[0][8:] == ["50.5%", "50", "live", "80.0%", "dp1 tp0 pp1"]
        assert rows[1][8:] == ["43.9%", "42", "live", "43.9%", "dp1 tp1 pp1"]
        header = "".join(s.text for s in table.render_line(0)._segments)
        assert header.rstrip().endswith("state   bf16eq coords")
        widths = table._widths(table._view.width)
        x = 1 + sum(w + 1 for w in widths[:-1])  # the coords header
        await pilot.click(RankTable, offset=(x + 2, 1))
        assert table.spec.sort == "coords" and "by coords ▲" in str(table.border_title)
        assert [table.view.rows[i].rank.rank for i in range(2)] == [0, 1]  # tp0 before tp1
        await pilot.click(RankTable, offset=(x + 2, 1))
        assert [table.view.rows[i].rank.rank for i in range(2)] == [1, 0]
        await _deliver(app, pilot, _mixed_job_snaps(coords=False, fp8=False)[0])  # pure bf16, no mesh
        assert table.columns == COLUMNS and len(table.row_text(0)) == 11
        assert "by coords" in str(table.border_title)  # the sort stays, named, until another is chosen
    app = _app(_mixed_job_snaps(coords=True, fp8=False))
    async with app.run_test(size=NARROW) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        assert [c.key for c in table.columns][-2:] == ["status", "coords"]  # all bf16: no bf16eq
        header = "".join(s.text for s in table.render_line(0)._segments)
        assert len(header) == 80 and header.rstrip().endswith("state")  # coords lie past the 80th column


@pytest.mark.asyncio
async def test_shrinking_the_terminal_from_the_wide_layout_to_80_columns() -> None:
    """A resize from 200×50 (or 165×40) to 80×24 ended the app within a second: the hints panel
    was laid out at width 0 once, before the narrow layout applied, and Rich raised wrapping its
    lines (a new user's trial in tmux: resizing a pane over SSH is routine)."""
    for start in ((200, 50), (165, 40)):
        app = FlowtopApp(ReplaySource(SNAPS, advance=False), refresh_s=0)
        async with app.run_test(size=start) as pilot:
            await pilot.pause()
            assert "-wide" in app.screen.classes
            await pilot.resize_terminal(80, 24)
            await pilot.pause(0.3)
            app.screen.show(cluster_snapshot(5))
            await pilot.pause(0.3)
            assert "-narrow" in app.screen.classes and app.screen.query_one("#hints").size.width == 78
        assert app.return_code in (None, 0)


@pytest.mark.asyncio
async def test_f_on_a_hint_shows_its_ranks_in_the_table() -> None:
    app = _app()
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        await pilot.press("g", "tab")  # flat list; the hints panel: the hung rank's hint first
        await pilot.press("f")
        assert table.has_focus and table.spec.filter.text == "rank:1234"
        assert [r.rank.rank for r in table.view.rows if isinstance(r, RankRow)] == [1234]
        assert app.screen.query_one("#rank-filter", Input).value == "rank:1234"  # `/` edits it
        await pilot.press("tab")
        panel = app.screen.query_one(HintsPanel)
        line = next(i for i, o in enumerate(panel._options) if str(o.id).startswith("group|straggler"))
        await pilot.press(*["down"] * line, "f")  # the eight stragglers' line
        assert table.spec.filter.text == "rank:296-303"
        assert sorted(r.rank.rank for r in table.view.rows if isinstance(r, RankRow)) == list(range(296, 304))
        await pilot.press("escape")
        assert not table.spec.filter.active and table.row_count == 4097
