"""FLOP/s columns whose unit follows the magnitude (issue 14 part 6): a CPU window reads GF/s, not
0.0 TF/s in every row; a GPU window keeps TF/s (goldens unchanged)."""

from __future__ import annotations

from typing import Any

import pytest

from flowtop.monitor.format import rate_prefix
from flowtop.monitor.kernels.rows import KernelRow
from flowtop.tui.widgets.kernel_table import KernelTable, kernel_cells, rate_scale


def row(name: str, tflops: float | None) -> KernelRow:
    return KernelRow(name, name, "gemm", 1, 100.0, 100.0, 0.1, tflops)


def test_rate_prefix_by_the_column_maximum() -> None:
    assert rate_prefix([429e12, 3e12]) == (1e12, "T")
    assert rate_prefix([82e9, 34e9, 0.5e9]) == (1e9, "G")  # a CPU: 82 GF/s
    assert rate_prefix([999.6e9]) == (1e12, "T")  # would print 1000 G: promoted
    assert rate_prefix([12e6]) == (1e6, "M")
    assert rate_prefix([]) == (1e12, "T")  # nothing to scale: the GPU default


def test_cpu_rows_read_gflops() -> None:
    rows = (row("aten::mm", 0.082), row("aten::addmm", 0.096), row("aten::_to_copy", None))
    scale, label = rate_scale(rows)
    assert (scale, label) == (1e9, "GF/s")
    assert [kernel_cells(r, scale)[6].plain for r in rows] == ["82", "96", "–"]
    assert kernel_cells(row("x", 0.0034), scale)[6].plain == "3.4"
    gpu = (row("nvjet", 429.0), row("flash", 2.5))
    assert rate_scale(gpu) == (1e12, "TF/s")
    assert [kernel_cells(r, 1e12)[6].plain for r in gpu] == ["429", "2.5"]


def _one_table() -> Any:
    """An app holding one KernelTable."""
    from textual.app import App, ComposeResult

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield KernelTable(id="t")

    return One()


@pytest.mark.asyncio
async def test_the_table_header_follows_its_rows() -> None:
    app = _one_table()
    async with app.run_test(size=(80, 12)) as pilot:
        table = app.query_one(KernelTable)
        table.show((row("aten::mm", 0.082),))
        await pilot.pause()
        assert table.columns["tflops"].label.plain.startswith("GF/s")  # type: ignore[index]
        assert table.get_row_at(0)[6].plain == "82"
        table.show((row("nvjet", 429.0),))
        await pilot.pause()
        assert table.columns["tflops"].label.plain.startswith("TF/s")  # type: ignore[index]
        assert table.get_row_at(0)[6].plain == "429"


@pytest.mark.asyncio
async def test_the_sorted_column_shows_its_arrow_within_its_width() -> None:
    """A trial: `2` (sort by calls) and `4` (by FLOP/s) left the header without an arrow: "calls▼"
    and "GF/s▼" overflow their 5 and 4 cells and the arrow was cut. They read "call▼" and "GF▼";
    "time▼" (the default) as before."""
    app = _one_table()
    async with app.run_test(size=(80, 12)) as pilot:
        table = app.query_one(KernelTable)
        table.show((row("aten::mm", 0.082),))
        await pilot.pause()
        heads = {}
        for index in (0, 1, 3):
            table.sort_index = index
            await pilot.pause()
            heads[index] = table.render_line(0).text.split()
        table.reverse = True
        await pilot.pause()
        reversed_calls = table.render_line(0).text.split()
    assert heads[0] == ["kernel", "cat", "calls", "time▼", "mean", "win%", "GF/s", "cum."]
    assert heads[1] == ["kernel", "cat", "call▼", "time", "mean", "win%", "GF/s", "cum."]
    assert heads[3] == ["kernel", "cat", "calls", "time", "mean", "win%", "GF▼", "cum."]
    assert reversed_calls[6] == "GF▲"
