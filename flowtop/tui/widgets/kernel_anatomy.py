"""KernelAnatomy: busy/idle, communication overlap, launches, short kernels, idle gaps."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from flowtop.tui.widgets._format import NA, activity_style, fmt_pct, fmt_us
from flowtop.tui.widgets._kernels import WindowView


def anatomy_text(view: WindowView | None) -> Text:
    """Three lines summarising the window (see the module docstring)."""
    out = Text(no_wrap=True, overflow="ellipsis")
    if view is None:
        return out
    step = view.step_us or 1.0
    busy = view.busy_us / step
    out.append("busy ", style="dim")
    out.append(f"{fmt_us(view.busy_us)} {fmt_pct(busy, 0)}", style=activity_style(busy))
    out.append("  idle ", style="dim")
    out.append(f"{fmt_us(view.idle_us)} {fmt_pct(view.idle_us / step, 0)}")
    out.append("  comm ", style="dim")
    if view.comm_us > 0:
        overlap = view.comm_overlap_us / view.comm_us
        out.append(f"{fmt_us(view.comm_us)} {fmt_pct(view.comm_us / step, 0)}")
        out.append(", overlapped ", style="dim")
        out.append(fmt_pct(overlap, 0), style=activity_style(overlap))
    else:
        out.append("none")
    out.append("\n")
    out.append("launches ", style="dim")
    out.append(NA if view.launches is None else f"{view.launches:,}")
    out.append("  short kernels ", style="dim")
    if view.short_kernels is None:
        out.append(NA)
    else:
        share = view.short_kernels / view.launches if view.launches else None
        style = "yellow" if share is not None and share > 0.5 else ""
        out.append(f"{view.short_kernels:,}", style=style)
        if share is not None:
            out.append(f" ({fmt_pct(share, 0)})", style=style)
    if view.short_note:
        out.append(f": {view.short_note}", style="dim")
    out.append("\n")
    out.append("largest idle gaps ", style="dim")
    if view.idle_gaps:
        gaps = []
        for start, length, host_ops in view.idle_gaps[:3]:
            # What the host was doing meanwhile is the lead to follow.
            during = f" {host_ops[0]}" if host_ops else ""
            gaps.append(f"{fmt_us(length)} @{fmt_us(start)}{during}")
        out.append(", ".join(gaps))
    else:
        out.append("none")
    return out


class KernelAnatomy(Static):
    """Anatomy of one kernel window (``show`` it a :class:`WindowView`)."""

    def show(self, view: WindowView | None) -> None:
        """Render ``view``."""
        self.update(anatomy_text(view))
