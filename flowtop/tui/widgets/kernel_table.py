"""KernelTable: a window's kernels beside their cumulative time, sortable (py-spy top style)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from flowtop.monitor.format import rate_prefix
from flowtop.monitor.kernels.rows import KernelRow
from flowtop.tui.widgets._format import NA, fmt_pct, fmt_us, styled
from flowtop.tui.widgets._kernels import display_name

if TYPE_CHECKING:
    from rich.console import JustifyMethod

# (key, label, width); widths sum to 63: with padding 79 columns (+ a 1-cell scrollbar).
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("name", "kernel", 28),
    ("category", "cat", 4),
    ("calls", "calls", 5),
    ("time", "time", 6),
    ("mean", "mean", 6),
    ("share", "win%", 4),
    ("tflops", "TF/s", 4),  # the prefix follows the window's magnitude (GF/s on a CPU): rate_label
    ("cum", "cum.", 6),
)

WIDTHS: dict[str, int] = {key: width for key, _, width in COLUMNS}
#: A label behind the sort arrow where both overflow the column (a trial: sorted by calls or by
#: FLOP/s, the header read "calls" and "GF/s", the arrow cut to the column's width).
SHORT: dict[str, str] = {"calls": "call", "TF/s": "TF", "GF/s": "GF", "MF/s": "MF"}

# Sort orders the keys 1-6 select; numbers sort largest first, the name A to Z.
SORTS: tuple[tuple[str, str, Callable[[KernelRow], object]], ...] = (
    ("time", "time", lambda r: -r.total_us),
    ("calls", "calls", lambda r: -r.calls),
    ("mean", "mean", lambda r: -r.mean_us),
    ("tflops", "FLOP/s", lambda r: -(r.tflops if r.tflops is not None else -1.0)),
    ("cum", "cumulative", lambda r: -(r.cum_us if r.cum_us is not None else -1.0)),
    ("name", "name", lambda r: r.short.lower()),
)

CATEGORY_STYLE: dict[str, str] = {
    "gemm": "green",
    "attention": "cyan",
    "comm": "magenta",
    "communication": "magenta",
    "memory": "yellow",
    "optimizer": "blue",
    "elementwise": "default",  # the theme's text colour: "white" vanishes on a light background
    "norm_softmax": "bright_blue",
    "reduction": "bright_cyan",
    "other": "dim",
}


CATEGORY_ABBREV: dict[str, str] = {
    "attention": "attn",
    "communication": "comm",
    "elementwise": "elem",
    "optimizer": "opt",
    "memory": "mem",
    "reduction": "red",
    "norm_softmax": "norm",
    "other": "oth",
}


def category_short(category: str) -> str:
    """A category in at most 4 characters (the table column)."""
    return CATEGORY_ABBREV.get(category.lower(), category)[:4]


def category_style(category: str) -> str:
    """The colour of a kernel category, the same in the table and the bar."""
    return CATEGORY_STYLE.get(category.lower(), "bright_black")


def sorted_rows(rows: tuple[KernelRow, ...], sort: int, reverse: bool) -> list[KernelRow]:
    """Rows in the order of sort ``sort`` (index into :data:`SORTS`), ties by name."""
    key = SORTS[sort][2]
    out = sorted(rows, key=lambda r: (key(r), r.short, r.name))
    return out[::-1] if reverse else out


def rate_scale(rows: tuple[KernelRow, ...] | list[KernelRow]) -> tuple[float, str]:
    """(FLOP/s per displayed unit, column label) of the achieved-rate column for these rows."""
    scale, prefix = rate_prefix(r.tflops * 1e12 for r in rows if r.tflops is not None)
    return scale, f"{prefix}F/s"


def _rate(tflops: float | None, scale: float) -> str:
    if tflops is None:
        return NA
    v = tflops * 1e12 / scale
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def kernel_cells(r: KernelRow, scale: float = 1e12) -> list[Text]:
    """One row in :data:`COLUMNS` order; achieved FLOP/s in units of ``scale`` (see rate_scale)."""
    return [
        Text(display_name(r.short), no_wrap=True, overflow="ellipsis"),
        Text(category_short(r.category), style=category_style(r.category)),
        styled(f"{r.calls:,}", ""),
        styled(fmt_us(r.total_us), "bold"),
        styled(fmt_us(r.mean_us), ""),
        styled(fmt_pct(r.share, 1 if (r.share or 0) < 0.095 else 0), ""),
        styled(_rate(r.tflops, scale), ""),
        styled(fmt_us(r.cum_us), "dim"),
    ]


class KernelTable(DataTable):
    """Kernels of one window; ``sort_index`` picks the column, ``reverse`` flips it."""

    sort_index: reactive[int] = reactive(0)
    reverse: reactive[bool] = reactive(False)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._rows: tuple[KernelRow, ...] = ()
        self.order: list[KernelRow] = []
        self._scale, self._rate_label = 1e12, "TF/s"

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            justify: JustifyMethod = "left" if key in ("name", "category") else "right"
            self.add_column(Text(label, justify=justify), key=key, width=width)
        self._label_sort()

    @property
    def selected(self) -> KernelRow | None:
        """The kernel under the cursor."""
        if 0 <= self.cursor_row < len(self.order):
            return self.order[self.cursor_row]
        return None

    def show(self, rows: tuple[KernelRow, ...]) -> None:
        """Render ``rows`` (unchanged rows do not touch the table)."""
        if rows == self._rows and self.row_count == len(rows):
            return
        self._rows = rows
        scale, label = rate_scale(rows)
        if label != self._rate_label:
            self._scale, self._rate_label = scale, label
            if self.is_mounted:
                self._label_sort()
        self._fill()

    def _fill(self) -> None:
        selected = self.order[self.cursor_row].name if 0 <= self.cursor_row < len(self.order) else None
        self.order = sorted_rows(self._rows, self.sort_index, self.reverse)
        self.clear()
        for i, r in enumerate(self.order):
            self.add_row(*kernel_cells(r, self._scale), key=f"{i}:{r.name}")
        names = [r.name for r in self.order]
        if selected in names:
            self.move_cursor(row=names.index(selected), animate=False)

    def _label_sort(self) -> None:
        """Mark the sorted column's label with an arrow."""
        sort_key = SORTS[self.sort_index][0]
        for key, label, _ in COLUMNS:
            column = self.columns.get(key)  # type: ignore[call-overload]
            if column is None:
                continue
            label = self._rate_label if key == "tflops" else label
            arrow = ("▲" if self.reverse else "▼") if key == sort_key else ""
            if len(label + arrow) > WIDTHS[key]:  # a fixed width: the arrow was cut off ("calls", "GF/s")
                label = SHORT.get(label, label[: WIDTHS[key] - len(arrow)])
            justify: JustifyMethod = "left" if key in ("name", "category") else "right"
            column.label = Text(label + arrow, justify=justify, style="bold" if arrow else "")
        self.refresh()

    def watch_sort_index(self) -> None:
        self._resort()

    def watch_reverse(self) -> None:
        self._resort()

    def _resort(self) -> None:
        if not self.is_mounted:
            return
        self._label_sort()
        self._fill()
