"""Number formatting shared by the text report and the TUI (no Textual)."""

from __future__ import annotations

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float | None, unit: str = "", digits: int = 3) -> str:
    """``12.3k``-style value with an SI prefix; ``-`` when unknown."""
    if value is None:
        return "-"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g}{prefix}{unit}"
    return f"{value:.{digits}g}{unit}"


def flops_rate(value: float | None) -> str:
    """FLOP/s with prefix, e.g. ``412TFLOP/s``."""
    return "-" if value is None else si(value, "FLOP/s")


def pct(frac: float | None, digits: int = 1) -> str:
    """A fraction as a percentage; ``-`` when unknown."""
    return "-" if frac is None else f"{100 * frac:.{digits}f}%"


def seconds(value: float | None) -> str:
    """A duration in s/ms/µs."""
    if value is None:
        return "-"
    if value >= 1:
        return f"{value:.2f}s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f}ms"
    return f"{value * 1e6:.0f}µs"
