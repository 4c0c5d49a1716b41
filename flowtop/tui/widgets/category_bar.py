"""CategoryBar: where the step's wall time went, one stacked bar plus a legend."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from flowtop.tui.widgets._format import fmt_pct
from flowtop.tui.widgets._kernels import WindowView
from flowtop.tui.widgets.kernel_table import category_short, category_style


def bar_segments(categories: tuple[tuple[str, float], ...], step_us: float, width: int) -> list[tuple[str, int]]:
    """Cells per category for a bar ``width`` cells wide; the rest of the step is 'idle'.

    Largest-remainder rounding, so the cells always add up to ``width`` and a
    category's cells differ from its exact share by less than one.
    """
    if width <= 0 or step_us <= 0:
        return []
    parts = [(name, max(0.0, us)) for name, us in categories]
    busy = sum(us for _, us in parts)
    # Concurrent streams can add up past the step; scale down rather than overflow.
    scale = step_us if busy <= step_us else busy
    parts.append(("idle", max(0.0, scale - busy)))
    exact = [(name, us / scale * width) for name, us in parts]
    cells = [(name, int(x)) for name, x in exact]
    left = width - sum(n for _, n in cells)
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i][1] - cells[i][1]), i))
    for i in by_remainder[:left]:
        cells[i] = (cells[i][0], cells[i][1] + 1)
    return [(name, n) for name, n in cells if n > 0]


def bar_text(view: WindowView | None, width: int) -> Text:
    """The bar line and the legend line."""
    if view is None:
        return Text("no kernel window yet (k asks the rank for one)", style="dim")
    out = Text(no_wrap=True, overflow="ellipsis")
    for name, n in bar_segments(view.categories, view.step_us, width):
        style = "bright_black" if name == "idle" else category_style(name)
        out.append(("░" if name == "idle" else "█") * n, style=style)
    out.append("\n")
    total = view.step_us or 1.0
    # Idle first: on a narrow terminal the smallest categories are the ones cut off.
    out.append("░ ", style="bright_black")
    out.append(f"idle {fmt_pct(view.idle_us / total, 0)}")
    for name, us in view.categories:
        out.append("  ■ ", style=category_style(name))
        out.append(f"{category_short(name)} {fmt_pct(us / total, 0)}")
    return out


class CategoryBar(Widget):
    """Kernel time of the step by category, idle time in grey."""

    DEFAULT_CSS = "CategoryBar { height: 2; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.view: WindowView | None = None

    def show(self, view: WindowView | None) -> None:
        """Render ``view``'s categories."""
        self.view = view
        self.refresh()

    def render(self) -> Text:
        return bar_text(self.view, self.content_size.width)
