"""Number formatting shared by the text report, calibrate and the TUI (no Textual, no Rich).

Every figure goes through these helpers so units and rounding are the same everywhere.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

from probe.wire.flops import NO_ATTENTION_FOUND

if TYPE_CHECKING:
    from flowtop.monitor.snapshot import FlopsView

#: Shown for a value the monitor does not have.
NA = "–"

def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def fmt_time(seconds: float | None) -> str:
    """Duration in at most 6 characters, 3 significant digits: 830µs, 4.20ms, 12.3ms, 236ms, 1.20s."""
    if not _finite(seconds):
        return NA
    s = float(seconds)  # type: ignore[arg-type]
    if s < 0.9995e-3:
        return f"{s * 1e6:.0f}µs"
    if s < 0.9995e-2:
        return f"{s * 1e3:.2f}ms"
    if s < 0.9995e-1:
        return f"{s * 1e3:.1f}ms"
    if s < 0.9995:
        return f"{s * 1e3:.0f}ms"
    if s < 99.95:
        return f"{s:.2f}s" if s < 9.995 else f"{s:.1f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def fmt_us(us: float | None) -> str:
    """Duration given in microseconds."""
    return fmt_time(None if not _finite(us) else float(us) * 1e-6)  # type: ignore[arg-type]


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _sig3(m: float) -> int:
    """Decimals that give ``m`` three significant digits (at most 5 characters)."""
    a = abs(m)
    return 0 if a >= 99.95 else 1 if a >= 9.995 else 2


def fmt_si(x: float | None, unit: str = "", digits: int | None = None) -> str:
    """Decimal SI prefix, three significant digits unless ``digits`` is given:
    4.12e14 -> '412T', 1.02e6 -> '1.02M', 989.4e12 with digits=1 -> '989.4T' (+unit)."""
    if not _finite(x):
        return NA
    v = float(x)  # type: ignore[arg-type]
    for scale, prefix in _SI:
        # Promote when rounding would print 1000 of the smaller prefix ('1000k' -> '1.00M').
        if abs(v) >= scale * (0.9995 if digits is None else 1.0):
            m = v / scale
            return f"{m:.{_sig3(m) if digits is None else digits}f}{prefix}{unit}"
    if v == int(v):
        return f"{int(v)}{unit}"
    return f"{v:.{_sig3(v) if digits is None else digits}f}{unit}"


def rate_prefix(values: Any) -> tuple[float, str]:
    """(scale, prefix) for one column of FLOP/s figures: the largest prefix under which the column's
    largest value is at least 1 (T on a GPU, G or M on a CPU), so no column reads 0.0 throughout;
    "T" when the column has no value. Every cell of the column is then divided by the same scale."""
    top = max((abs(float(v)) for v in values if _finite(v)), default=None)
    if top is None:
        return 1e12, "T"
    for scale, prefix in _SI:
        if top >= scale * 0.9995:
            return scale, prefix
    return 1.0, ""


def fmt_pct(frac: float | None, digits: int = 1) -> str:
    """A fraction 0..1 as a percentage."""
    if not _finite(frac):
        return NA
    return f"{float(frac) * 100:.{digits}f}%"  # type: ignore[arg-type]


def fmt_int(n: int | None) -> str:
    """Integer with thousands separators."""
    return NA if n is None else f"{n:,}"


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


def fmt_sig(x: float | None, sig: int = 5, unit: str = "", na: str = NA) -> str:
    """SI prefix with ``sig`` significant digits, trailing zeros dropped: 274.88G, 7M."""
    if not _finite(x):
        return na
    v = float(x)  # type: ignore[arg-type]
    for scale, prefix in _SI:
        if abs(v) >= scale:
            return f"{v / scale:.{sig}g}{prefix}{unit}"
    return f"{v:.{sig}g}{unit}"


def ended_note(first_step: int | None, last_step: int | None) -> str:
    """"(ended, steps 7–16)": a hint whose rank or job finished while it was shown."""
    if first_step is None or last_step is None:
        return "(ended)"
    steps = f"step {last_step}" if first_step >= last_step else f"steps {first_step}–{last_step}"
    return f"(ended, {steps})"


#: Parallel roles in the order a coordinates label lists them (probe.steps.parallel.ROLES).
COORD_ROLES = ("dp", "tp", "pp", "cp", "ep")


def fmt_coords(coords: Mapping[str, tuple[int, int]]) -> str:
    """A rank's parallel coordinates, compact: "dp1 tp0 pp1" (the rank in each role of size > 1;
    "dp0" for a job of one replica and nothing else; "" when unknown)."""
    if not coords:
        return ""
    parts = [f"{role}{coords[role][0]}" for role in COORD_ROLES if role in coords and coords[role][1] > 1]
    return " ".join(parts) or "dp0"


def fmt_ranks(ranks: tuple[int, ...] | list[int], width: int = 40) -> str:
    """Rank numbers with runs joined, "0-3,8-11", cut to ``width`` characters with "…"."""
    runs: list[str] = []
    xs = sorted(set(ranks))
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        runs.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    text = ",".join(runs)
    return text if len(text) <= width else text[: width - 1] + "…"


#: The attention convention shown for a model with no attention block (none ran): no convention applies.
NO_ATTENTION = "none found"


def no_attention(f: "FlopsView") -> bool:
    """Whether the probe found no attention in the model (its estimate says so) and read no masking."""
    return f.attention_masking is None and NO_ATTENTION_FOUND in (f.estimate_source or "")


def attention_shown(f: "FlopsView") -> str:
    """The attention convention as the TUI and the text report state it: ``none found`` where the
    model has no attention (a convention's square of nothing read as if it had: a trial)."""
    return NO_ATTENTION if no_attention(f) else f.attention_convention
