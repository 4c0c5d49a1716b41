"""TelemetryPanel: a rank's device and host telemetry, 'n/a (reason)' where missing."""

from __future__ import annotations

from typing import Any, Mapping

from rich.text import Text
from textual.widgets import Static

from flowtop.snapshot import TelemetryView
from flowtop.widgets import _telemetry as tm
from flowtop.widgets._format import fmt_si, fmt_time, fmt_value


def _value(key: str, value: Any) -> str:
    """Units from the key's suffix (the probe names them so)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if key.endswith("_bytes"):
            return fmt_si(float(value), "B", 1)
        if key.endswith("_bytes_s"):
            return fmt_si(float(value), "B/s", 1)
        if key.endswith("_pct") or key in ("gpu_util", "mem_util"):
            return f"{value:.0f}%"
        if key in ("tensor_active", "sm_active", "dram_active"):
            return f"{value * 100:.1f}%"
        for suffix, unit in (("_w", "W"), ("_mhz", "MHz"), ("_c", "°C")):
            if key.endswith(suffix):
                return f"{value:.0f}{unit}"
    return fmt_value(value)


def _section(out: Text, title: str, table: Mapping[str, Any], reasons: Mapping[str, Any]) -> None:
    out.append(f"{title}\n", style="bold")
    keys = list(table) + [k for k in reasons if k not in table]
    if not keys:
        out.append("  nothing reported\n", style="dim")
    for key in keys:
        value = table.get(key)
        out.append(f"  {key:<18}", style="dim")
        if value is None:
            why = reasons.get(key) or "not reported"
            out.append(f"n/a ({why})\n", style="yellow")
        else:
            out.append(f"{_value(key, value)}\n")


def telemetry_text(tel: TelemetryView | None) -> Text:
    """Device and host maps, throttling flagged first."""
    out = Text()
    if tel is None:
        out.append("no telemetry yet", style="dim")
        return out
    throttled = tm.throttle_reasons(tel)
    if throttled:
        out.append("THROTTLED: " + ", ".join(throttled) + "\n", style="bold red")
    clock = tm.number(tel, tm.SM_CLOCK)
    clock_max = tm.number(tel, tm.SM_CLOCK_MAX)
    if clock and clock_max and clock < 0.9 * clock_max:
        out.append(f"SM clock {clock:.0f} of {clock_max:.0f} MHz\n", style="bold red")
    device_reasons = {k: v for k, v in tel.reasons.items() if not str(k).startswith("host.")}
    host_reasons = {str(k)[5:]: v for k, v in tel.reasons.items() if str(k).startswith("host.")}
    _section(out, "device", tel.device, device_reasons)
    _section(out, "host", tel.host, host_reasons)
    out.append(f"age {fmt_time(tel.age_s)}", style="dim")
    return out


class TelemetryPanel(Static):
    """Device and host telemetry of one rank."""

    BORDER_TITLE = "telemetry"

    def show(self, tel: TelemetryView | None) -> None:
        """Render ``tel`` (None: nothing received yet)."""
        self.update(telemetry_text(tel))
