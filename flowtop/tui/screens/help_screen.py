"""HelpScreen: the keys of every screen and what the figures mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from flowtop.monitor.snapshot import EXECUTED_FLOPS_NOTE, MODEL_FLOPS_NOTE

KEYS: tuple[tuple[str, str, str], ...] = (
    ("any", "q", "quit"),
    ("any", "?", "this help (again or Esc closes it)"),
    ("any", "p", "save an SVG screenshot of the screen ($FLOWTOP_SCREENSHOT_DIR, else .)"),
    ("main", "↑ ↓", "select a rank or node (or a hint after Tab)"),
    ("main", "Enter", "kernel screen of the rank / open a node / expand the hint"),
    ("main", "→ ← space", "open / close the node (← from one of its ranks too)"),
    ("main", "+ / -", "open / close every node"),
    ("main", "g", "group by node / one flat list"),
    ("main", "s / S", "sort by the next / previous column (worst values first)"),
    ("main", "r / w", "reverse the order / back to worst first"),
    ("main", "click", "a column header sorts by it (again: reversed)"),
    ("main", "/", "filter: node01* 128-255 stalled input_wait (Enter keeps it)"),
    ("main", "Esc", "clear the filter"),
    ("hints", "f", "show the ranks of the highlighted hint in the table (Esc clears)"),
    ("main", "m / M", "rank map: next metric (MFU, step, wait, status) / hide"),
    ("map", "arrows", "move the cursor: selects that rank (its node row if closed)"),
    ("map", "Enter", "show the rank in the table (click a cell: the same)"),
    ("main", "k", "ask the selected rank for a kernel window now"),
    ("main", "d", "rank detail: sparklines, telemetry, FLOPs"),
    ("main", "j", "job kernel view: ranks merged, divergence"),
    ("main", "n", "next job (several jobs)"),
    ("main", "Tab", "move between ranks, hints and the rank map"),
    ("kernels", "1-6", "sort by time, calls, mean, FLOP/s, cumulative, name"),
    ("kernels", "s / r", "cycle sort column / reverse order"),
    ("kernels", "click", "a column header sorts by it (again: reversed)"),
    ("kernels", "↑ ↓", "full name of the kernel under the cursor (bottom line)"),
    ("kernels", "k", "capture a new window"),
    ("job", "s", "cycle the sort column (job kernel view)"),
    ("detail", "k", "ask this rank for a kernel window now"),
    ("sub", "Esc", "back"),
)


def help_text() -> Table:
    """The key table plus the FLOP conventions."""
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim")
    table.add_column(style="bold cyan")
    table.add_column()
    for screen, key, what in KEYS:
        table.add_row(screen, key, what)
    table.add_row("", "", "")
    table.add_row("MFU", "", Text(MODEL_FLOPS_NOTE + ", ÷ dense peak"))
    table.add_row("HFU", "", Text(EXECUTED_FLOPS_NOTE + ", ÷ dense peak"))
    table.add_row("TC%", "", "tensor-core activity (NVML GPM); GPU% is busy-any-kernel")
    return table


class HelpScreen(ModalScreen[None]):
    """Key help over the current screen."""

    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_text(), id="help-keys")

    def on_mount(self) -> None:
        self.query_one("#help").border_title = "flowtop keys"
