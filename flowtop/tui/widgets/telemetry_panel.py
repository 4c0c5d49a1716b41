"""TelemetryPanel: a rank's device and host telemetry, 'n/a (reason)' where missing."""

from __future__ import annotations

from typing import Any, Mapping

from rich.text import Text
from textual.widgets import Static

from flowtop.monitor import telemetry as tm
from flowtop.monitor.snapshot import TelemetryView
from flowtop.tui.widgets._format import fmt_si, fmt_time, fmt_value


def _value(key: str, value: Any) -> str:
    """A value with the unit its key implies (see the telemetry adapter)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if key.endswith("_bytes_s"):
            return fmt_si(float(value), "B/s")
        if tm.is_bytes(key):
            return fmt_si(float(value), "B")
    text = tm.value_text(key, value)
    return fmt_value(value) if text is None else text


def _section(out: Text, title: str, table: Mapping[str, Any], reasons: Mapping[str, Any]) -> None:
    out.append(f"{title}\n", style="bold")
    keys = [k for k in table if k not in tm.IDENTITY_KEYS and k != "reasons"]
    keys += [k for k in reasons if k not in table]
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


def telemetry_text(tel: TelemetryView | None, now: float) -> Text:
    """Device and host maps, each value with its unit or 'n/a (reason)'; its age at ``now``
    (the snapshot's ``taken_at``)."""
    out = Text()
    if tel is None:
        out.append("no telemetry yet", style="dim")
        return out
    # One reasons map covers both sides: a reason belongs where its key is (device by default).
    # The probe files host reasons under "host.<key>".
    host_reasons = {k.removeprefix("host."): v for k, v in tel.reasons.items()
                    if k.startswith("host.") or k in tel.host}
    device_reasons = {k: v for k, v in tel.reasons.items() if not k.startswith("host.") and k not in tel.host}
    name = tm.device_name(tel)
    _section(out, f"device {name}".strip(), tel.device, device_reasons)
    _section(out, "process and host", tel.host, host_reasons)
    out.append(f"age {fmt_time(tel.age_s(now))}", style="dim")
    return out


class TelemetryPanel(Static):
    """Device and host telemetry of one rank."""

    def show(self, tel: TelemetryView | None, now: float = 0.0) -> None:
        """Render ``tel`` (None: nothing received yet) as of monitor time ``now``."""
        self.update(telemetry_text(tel, now))
