"""RankSummary: one line of percentiles across the job's ranks (p0/p50/p95/p100)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from flowtop.monitor.rankstats import PERCENTILES, JobPercentiles, job_percentiles
from flowtop.monitor.snapshot import JobSnapshot
from flowtop.tui.widgets._format import NA


def _digits(v: float) -> int:
    """Decimals for three significant digits (a percentile row reads best aligned that way)."""
    a = abs(v)
    return 2 if a < 9.995 else 1 if a < 99.95 else 0


def fmt_times(values: tuple[float, ...]) -> str:
    """Durations in one unit chosen by the largest: '194/200/205/270ms'."""
    top = max(values)
    scale, unit = (1.0, "s") if top >= 0.9995 else (1e3, "ms") if top >= 0.9995e-3 else (1e6, "µs")
    return "/".join(f"{v * scale:.{_digits(v * scale)}f}" for v in values) + unit


def fmt_fracs(values: tuple[float, ...]) -> str:
    """Fractions as percentages: whole percents, one decimal under 10 %: '1.0/1.2/3.4/30%'."""
    return "/".join(f"{v * 100:.{1 if v < 0.0995 else 0}f}" for v in values) + "%"


def summary_text(p: JobPercentiles) -> Text:
    """'p0/50/95/100 step 194/200/205/270ms MFU 0.0/45/46/46% wait 1.0/1.0/1.0/30%' (single
    spaces: the four figures of three measures fit 78 columns)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("p" + "/".join(f"{q:g}" for q in PERCENTILES), style="dim")
    for label, values, fmt in (
        ("step", p.step_time_s, fmt_times),
        ("MFU", p.mfu, fmt_fracs),
        ("wait", p.input_wait_frac, fmt_fracs),
    ):
        text.append(f" {label} ", style="dim")
        text.append(fmt(values) if values else NA, style="bold" if values else "dim")
    return text


class RankSummary(Widget):
    """Percentiles of step time, MFU and input wait over the running ranks of one job.

    One line, always (its height is fixed): a new text repaints the line, never the layout."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.text = Text("")

    def show(self, job: JobSnapshot | None) -> None:
        text = summary_text(job_percentiles(job)) if job is not None else Text("")
        if text != self.text:
            self.text = text
            self.refresh()

    def render(self) -> Text:
        return self.text
