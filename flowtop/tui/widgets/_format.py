"""Colour rules shared by the widgets; number formats come from :mod:`flowtop.monitor.format`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from rich.text import Text

from flowtop.monitor.format import NA, _finite, evidence_text, fmt_int, fmt_pct, fmt_si, fmt_time, fmt_us, fmt_value
from flowtop.monitor.snapshot import SEVERITIES

if TYPE_CHECKING:
    from rich.console import JustifyMethod

__all__ = [
    "NA", "fmt_int", "fmt_pct", "fmt_si", "fmt_time", "fmt_us", "fmt_value", "evidence_text",
    "mfu_style", "activity_style", "status_text", "styled", "STATUS_STYLE", "SEVERITY_ORDER",
    "SEVERITY_STYLE", "SEVERITY_TAG", "MFU_GOOD", "MFU_FAIR",
]  # fmt: skip

# MFU colour bands. Dense-peak MFU of well-tuned LLM training sits around 35-55 %;
# under 20 % usually means a host, input or communication bottleneck. Above 100 %
# is impossible and signals an accounting error (sparse peak, FP8 work against a
# bf16 peak, recompute counted as model FLOPs).
MFU_GOOD = 0.40
MFU_FAIR = 0.20


def mfu_style(frac: float | None) -> str:
    """Colour for an MFU/HFU value: green good, yellow fair, red poor or impossible."""
    if not _finite(frac):
        return "dim"
    f = float(frac)  # type: ignore[arg-type]
    if f > 1.0:
        return "bold red"  # above peak: an accounting error, not a great run
    if f >= MFU_GOOD:
        return "green"
    if f >= MFU_FAIR:
        return "yellow"
    return "red"


def activity_style(frac: float | None) -> str:
    """Colour for a busy/activity share where more is better (tensor activity, busy)."""
    if not _finite(frac):
        return "dim"
    f = float(frac)  # type: ignore[arg-type]
    return "green" if f >= 0.5 else "yellow" if f >= 0.2 else "red"


STATUS_STYLE: Mapping[str, str] = {
    "live": "green",
    "running": "green",
    "stale": "bold red",
    "stalled": "bold yellow",
    "done": "dim",
    "failed": "bold white on red",  # ended of an uncaught exception: what a job's failure starts from
    "stopped": "bold #fb8c00",  # a signal ended it mid-run (scancel, preemption): not finished
}

SEVERITY_ORDER: Mapping[str, int] = {s: i for i, s in enumerate(SEVERITIES)}  # most severe first
SEVERITY_STYLE: Mapping[str, str] = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITY_TAG: Mapping[str, str] = {"critical": "CRIT", "warning": "WARN", "info": "INFO"}


def status_text(status: str) -> Text:
    """A rank/job status word in its colour."""
    return Text(status, style=STATUS_STYLE.get(status, "yellow"))


def styled(value: str, style: str, justify: JustifyMethod = "right") -> Text:
    """A table cell: text with a style, right-justified for numbers."""
    return Text(value, style=style, justify=justify)
