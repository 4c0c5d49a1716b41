"""JobKernelTable: kernels merged over ranks, the most divergent ones marked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from flowtop.tui.widgets._format import fmt_pct, fmt_us, styled
from flowtop.monitor.kernels.merge import RankSpread
from flowtop.tui.widgets._kernels import display_name
from flowtop.tui.widgets.kernel_table import category_short, category_style

if TYPE_CHECKING:
    from rich.console import JustifyMethod

# (key, label, width); 63 + 16 padding = 79, plus a 1-cell scrollbar.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("mark", "", 1),
    ("name", "kernel", 27),
    ("category", "cat", 4),
    ("mean", "mean", 7),
    ("min", "min", 7),
    ("max", "max", 7),
    ("spread", "spread", 6),
    ("slow", "max@", 4),
)

def job_kernel_cells(r: RankSpread) -> list[Text]:
    """One row in :data:`COLUMNS` order; kernels the aggregate flags as uneven in red."""
    level = "bold red" if r.flagged else ""
    return [
        Text("◆" if r.flagged else " ", style=level),
        Text(display_name(r.short), no_wrap=True, overflow="ellipsis", style=level),
        Text(category_short(r.category), style=category_style(r.category)),
        styled(fmt_us(r.mean_us), "bold"),
        styled(fmt_us(r.min_us), ""),
        styled(fmt_us(r.max_us), ""),
        styled(fmt_pct(r.spread, 0), level or "dim"),
        # With no difference between ranks there is no slowest one to name.
        styled("" if r.max_us == r.min_us else str(r.max_rank), level or "dim"),
    ]


class JobKernelTable(DataTable):
    """Merged kernels, most uneven (max − min) first; ``by_mean`` sorts by mean time instead."""

    by_mean: reactive[bool] = reactive(False)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._rows: tuple[RankSpread, ...] = ()
        self.order: list[RankSpread] = []

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            justify: JustifyMethod = "left" if key in ("name", "category", "mark") else "right"
            self.add_column(Text(label, justify=justify), key=key, width=width)

    def show(self, rows: tuple[RankSpread, ...]) -> None:
        """Render ``rows`` (unchanged rows do not touch the table)."""
        if rows == self._rows and self.row_count == len(rows):
            return
        self._rows = rows
        self._fill()

    def watch_by_mean(self) -> None:
        if self.is_mounted:
            self._fill()

    def _fill(self) -> None:
        if self.by_mean:
            self.order = sorted(self._rows, key=lambda r: (-r.mean_us, r.name))
        else:
            self.order = sorted(self._rows, key=lambda r: (-(r.max_us - r.min_us), -r.mean_us, r.name))
        self.clear()
        for i, r in enumerate(self.order):
            self.add_row(*job_kernel_cells(r), key=f"{i}:{r.name}")
