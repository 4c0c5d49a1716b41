"""Adapter over ``TelemetryView`` key names and units (the probe decides them; see probe/telemetry/nvml.py
and probe/telemetry/hostinfo.py). A rename or unit change costs one line here.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from flowtop.monitor.snapshot import TelemetryView

# Device map keys. NVML reports utilisation and GPM activity in percent (0..100).
GPU_UTIL = "gpu_util"
TENSOR = "tensor_active"
SM_ACTIVE = "sm_active"
DRAM = "dram_bw_util"
POWER_W = "power_w"
POWER_LIMIT_W = "power_limit_w"
SM_CLOCK = "sm_clock_mhz"
SM_CLOCK_MAX = "sm_clock_max_mhz"
TEMP_C = "temp_c"
THROTTLE = "throttle"

#: Keys whose values are percentages although their names do not end in ``_pct``.
PERCENT_KEYS = frozenset({GPU_UTIL, TENSOR, SM_ACTIVE, DRAM, "sm_occupancy", "tensor_hmma"})
#: Keys holding byte counts although their names do not end in ``_bytes``.
BYTE_KEYS = frozenset({"mem_used", "mem_total", "host_mem_used", "host_mem_total"})
#: Identity strings, not measurements (shown in the title, not the table).
IDENTITY_KEYS = frozenset({"name", "uuid"})


def is_percent(key: str) -> bool:
    """Whether ``key``'s value is in percent."""
    return key in PERCENT_KEYS or key.endswith("_pct")


def is_bytes(key: str) -> bool:
    """Whether ``key``'s value is a byte count."""
    return key in BYTE_KEYS or key.endswith("_bytes")


def number(tel: TelemetryView | None, key: str, where: str = "device") -> float | None:
    """A numeric telemetry value, or None (missing, null, non-finite)."""
    if tel is None:
        return None
    value = (tel.device if where == "device" else tel.host).get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def fraction(tel: TelemetryView | None, key: str) -> float | None:
    """An activity share as a fraction 0..1 (percent keys are divided by 100)."""
    value = number(tel, key)
    if value is None:
        return None
    return value / 100.0 if is_percent(key) else value


def series_fraction(key: str, values: Sequence[float]) -> Sequence[float]:
    """A History series of ``key`` as fractions (History keeps the probe's unit)."""
    return tuple(v / 100.0 for v in values) if is_percent(key) else values


def reason(tel: TelemetryView | None, key: str) -> str:
    """Why a value is missing, from ``TelemetryView.reasons`` ('' when none given)."""
    if tel is None:
        return "no telemetry yet"
    return str(tel.reasons.get(key) or "")


def throttle_reasons(tel: TelemetryView | None) -> list[str]:
    """Active clock-throttle reasons reported by the device ([] when none or unknown)."""
    value = None if tel is None else tel.device.get(THROTTLE)
    if isinstance(value, list):
        return [str(v) for v in value if v]
    if isinstance(value, str) and value and value.lower() not in ("none", "idle"):
        return [value]
    return []


def device_name(tel: TelemetryView | None) -> str:
    """The GPU's NVML name ('' when unknown)."""
    value = None if tel is None else tel.device.get("name")
    return value if isinstance(value, str) else ""


def value_text(key: str, value: Any) -> str | None:
    """``value`` with the unit its key implies; None when the key has no special unit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if is_percent(key):
        return f"{value:.0f}%" if value >= 10 else f"{value:.1f}%"
    for suffix, unit in (("_w", "W"), ("_mhz", "MHz"), ("_c", "°C")):
        if key.endswith(suffix):
            return f"{value:.0f}{unit}"
    return None
