"""Adapter over ``TelemetryView`` key names (the probe decides them; renames cost one line here)."""

from __future__ import annotations

import math
from typing import Any

from flowtop.snapshot import TelemetryView

# Probe's device/host map keys, first match wins. Values given as percentages
# (0..100) are named *_pct; everything else named here is a fraction 0..1.
GPU_UTIL = ("gpu_util_pct", "gpu_util")
TENSOR = ("tensor_active", "tensor_active_pct", "gpm_tensor_active")
SM_ACTIVE = ("sm_active", "sm_active_pct", "gpm_sm_active")
DRAM = ("dram_active", "dram_active_pct", "gpm_dram_bw_util")
POWER_W = ("power_w",)
POWER_LIMIT_W = ("power_limit_w",)
SM_CLOCK = ("sm_clock_mhz",)
SM_CLOCK_MAX = ("sm_clock_max_mhz",)
TEMP_C = ("temp_c", "temperature_c")
MEM_USED = ("mem_used_bytes", "mem_used")
MEM_TOTAL = ("mem_total_bytes", "mem_total")
THROTTLE = ("throttle_reasons", "throttle")

#: Keys that hold percentages although their names do not end in _pct (NVML's own unit).
_PERCENT_KEYS = {"gpu_util"}


def raw(tel: TelemetryView | None, names: tuple[str, ...], where: str = "device") -> tuple[str | None, Any]:
    """(key found, value) for the first of ``names`` present, else (None, None)."""
    if tel is None:
        return None, None
    table = tel.device if where == "device" else tel.host
    for name in names:
        if name in table:
            return name, table[name]
    return None, None


def number(tel: TelemetryView | None, names: tuple[str, ...], where: str = "device") -> float | None:
    """A numeric telemetry value, or None (missing, null, non-finite)."""
    _, value = raw(tel, names, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def fraction(tel: TelemetryView | None, names: tuple[str, ...]) -> float | None:
    """An activity share as a fraction 0..1 (``*_pct`` keys are divided by 100)."""
    key, _ = raw(tel, names)
    value = number(tel, names)
    if key is None or value is None:
        return None
    if key.endswith("_pct") or key in _PERCENT_KEYS:
        return value / 100.0
    return value


def reason(tel: TelemetryView | None, names: tuple[str, ...]) -> str:
    """Why a value is missing, from ``TelemetryView.reasons`` ('' when none given)."""
    if tel is None:
        return "no telemetry yet"
    for name in names:
        if name in tel.reasons and tel.reasons[name]:
            return str(tel.reasons[name])
    return ""


def throttle_reasons(tel: TelemetryView | None) -> list[str]:
    """Active clock-throttle reasons reported by the device ([] when none or unknown)."""
    _, value = raw(tel, THROTTLE)
    if isinstance(value, list):
        return [str(v) for v in value if v]
    if isinstance(value, str) and value and value.lower() not in ("none", "idle"):
        return [value]
    return []
