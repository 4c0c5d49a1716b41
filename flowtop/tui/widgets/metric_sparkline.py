"""MetricSparkline: one labelled series of a rank's history on one line."""

from __future__ import annotations

import math

from typing import Any, Callable, Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Sparkline

from flowtop.tui.widgets._format import NA


class MetricSparkline(Horizontal):
    """``label  latest (min–max)  ▂▃▅▇`` for one History series.

    Args:
        label: What the series is (e.g. "step time").
        fmt: Formats one value of the series.
        higher_is_better: Colours the tallest bars green (else the lowest ones).
    """

    def __init__(self, label: str, fmt: Callable[[float | None], str], *, higher_is_better: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.label = label
        self.fmt = fmt
        self.higher_is_better = higher_is_better

    def compose(self) -> ComposeResult:
        yield Label(self.label, classes="spark-label")
        yield Label(NA, classes="spark-value")
        spark = Sparkline([], summary_function=max)
        spark.add_class("good-high" if self.higher_is_better else "good-low")
        yield spark

    def show(self, series: Sequence[float], empty: str = "n/a (no samples yet)") -> None:
        """Render ``series`` (oldest first); an empty series shows ``empty`` (why there is none)."""
        # Textual's Sparkline cannot draw NaN or inf: such points are left out.
        values = [float(v) for v in series if v is not None and math.isfinite(float(v))]
        value = self.query_one(".spark-value", Label)
        if values:
            lo, hi = min(values), max(values)
            value.update(f"{self.fmt(values[-1])} ({self.fmt(lo)}–{self.fmt(hi)})")
        else:
            value.update(empty)
        spark = self.query_one(Sparkline)
        spark.data = values
        # An empty Sparkline still draws a flat row of bars, which reads as "zero".
        spark.display = bool(values)
