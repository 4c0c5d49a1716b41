"""Number formatting and colour rules shared by the widgets (no Textual imports).

Every figure on screen goes through these helpers so that units, rounding and the
"higher MFU is better" colouring are the same everywhere.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from rich.text import Text

#: Shown for a value the monitor does not have.
NA = "–"

# MFU colour bands. Dense-peak MFU of well-tuned LLM training sits around 35-55 %;
# under 20 % usually means a host, input or communication bottleneck. Above 100 %
# is impossible and signals an accounting error (sparse peak, FP8 work against a
# bf16 peak, recompute counted as model FLOPs).
MFU_GOOD = 0.40
MFU_FAIR = 0.20


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def fmt_time(seconds: float | None) -> str:
    """Duration with a unit chosen for 3-4 significant characters: 830µs, 12.3ms, 1.20s."""
    if not _finite(seconds):
        return NA
    s = float(seconds)  # type: ignore[arg-type]
    if s < 1e-3:
        return f"{s * 1e6:.0f}µs"
    if s < 1e-2:
        return f"{s * 1e3:.2f}ms"
    if s < 1.0:
        return f"{s * 1e3:.1f}ms"
    if s < 100.0:
        return f"{s:.2f}s"
    return f"{s:.0f}s"


def fmt_us(us: float | None) -> str:
    """Duration given in microseconds."""
    return fmt_time(None if not _finite(us) else float(us) * 1e-6)  # type: ignore[arg-type]


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_si(x: float | None, unit: str = "", digits: int = 1) -> str:
    """Decimal SI prefix: 4.12e14 -> '412.0T' (+unit)."""
    if not _finite(x):
        return NA
    v = float(x)  # type: ignore[arg-type]
    for scale, prefix in _SI:
        if abs(v) >= scale:
            return f"{v / scale:.{digits}f}{prefix}{unit}"
    return f"{v:.{digits}f}{unit}" if v != int(v) else f"{int(v)}{unit}"


def fmt_pct(frac: float | None, digits: int = 1) -> str:
    """A fraction 0..1 as a percentage."""
    if not _finite(frac):
        return NA
    return f"{float(frac) * 100:.{digits}f}%"  # type: ignore[arg-type]


def fmt_int(n: int | None) -> str:
    """Integer with thousands separators."""
    return NA if n is None else f"{n:,}"


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
    "done": "dim",
}

SEVERITY_ORDER: Mapping[str, int] = {"critical": 0, "warning": 1, "info": 2}
SEVERITY_STYLE: Mapping[str, str] = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITY_TAG: Mapping[str, str] = {"critical": "CRIT", "warning": "WARN", "info": "INFO"}


def status_text(status: str) -> Text:
    """A rank/job status word in its colour."""
    return Text(status, style=STATUS_STYLE.get(status, "yellow"))


def styled(value: str, style: str, justify: str = "right") -> Text:
    """A table cell: text with a style, right-justified for numbers."""
    return Text(value, style=style, justify=justify)  # type: ignore[arg-type]


def fmt_value(value: Any) -> str:
    """A telemetry or evidence value of unknown type, compact."""
    if value is None:
        return NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return NA
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(v) for v in value) or "none"
    return str(value)


def evidence_text(evidence: Mapping[str, Any]) -> str:
    """Hint evidence as 'key=value, key=value' in the order the hint gave."""
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in evidence.items())
