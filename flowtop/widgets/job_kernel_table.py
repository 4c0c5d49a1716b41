"""JobKernelTable: kernels merged over ranks, the most divergent ones marked."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from flowtop.widgets._format import fmt_pct, fmt_us, styled
from flowtop.widgets._kernels import JobKernelRow
from flowtop.widgets.kernel_table import category_short, category_style

# (key, label, width); 64 + 16 padding = 80 at most, with the scrollbar on top.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("mark", "", 1),
    ("name", "kernel", 21),
    ("category", "cat", 6),
    ("mean", "mean", 7),
    ("min", "min", 7),
    ("max", "max", 7),
    ("spread", "spread", 6),
    ("slow", "slow", 4),
)

#: Spread (max − min) ÷ mean above which a kernel is marked: red, and yellow above half of it.
SPREAD_MARK = 0.20
#: The marks go to this many kernels at most (largest spread first, among the timed ones).
MARK_TOP = 5


def marked(rows: tuple[JobKernelRow, ...]) -> set[str]:
    """Names of the kernels whose time differs most between ranks."""
    candidates = sorted((r for r in rows if r.spread >= SPREAD_MARK / 2), key=lambda r: (-r.spread, r.name))
    return {r.name for r in candidates[:MARK_TOP]}


def job_kernel_cells(r: JobKernelRow, mark: bool) -> list[Text]:
    """One row in :data:`COLUMNS` order."""
    level = "bold red" if r.spread >= SPREAD_MARK else "yellow"
    return [
        Text("◆" if mark else " ", style=level if mark else ""),
        Text(r.short, no_wrap=True, overflow="ellipsis", style=level if mark else ""),
        Text(category_short(r.category), style=category_style(r.category)),
        styled(fmt_us(r.mean_us), "bold"),
        styled(fmt_us(r.min_us), ""),
        styled(fmt_us(r.max_us), ""),
        styled(fmt_pct(r.spread, 0), level if mark else "dim"),
        styled("" if r.slowest_rank is None else str(r.slowest_rank), level if mark else "dim"),
    ]


class JobKernelTable(DataTable):
    """Merged kernels; ``by_spread`` sorts by divergence instead of mean time."""

    by_spread: reactive[bool] = reactive(False)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._rows: tuple[JobKernelRow, ...] = ()
        self.order: list[JobKernelRow] = []

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            justify = "left" if key in ("name", "category", "mark") else "right"
            self.add_column(Text(label, justify=justify), key=key, width=width)

    def show(self, rows: tuple[JobKernelRow, ...]) -> None:
        """Render ``rows`` (unchanged rows do not touch the table)."""
        if rows == self._rows and self.row_count == len(rows):
            return
        self._rows = rows
        self._fill()

    def watch_by_spread(self) -> None:
        if self.is_mounted:
            self._fill()

    def _fill(self) -> None:
        marks = marked(self._rows)
        if self.by_spread:
            self.order = sorted(self._rows, key=lambda r: (-r.spread, -r.mean_us, r.name))
        else:
            self.order = sorted(self._rows, key=lambda r: (-r.mean_us, r.name))
        self.clear()
        for i, r in enumerate(self.order):
            self.add_row(*job_kernel_cells(r, r.name in marks), key=f"{i}:{r.name}")
