"""Telemetry entry point for the probe's sender thread: device (NVML/GPM) and host (psutil).

``Telemetry.maybe_sample()`` rate-limits both readers so the sender loop can call it every time it
wakes; it returns ``None`` until ``interval_s`` has passed since the last reading. Never raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from probe._log import warn_once
from probe.hostinfo import HOST_FIELDS, HostTelemetry
from probe.nvml import ALL_FIELDS as DEVICE_ALL_FIELDS
from probe.nvml import DeviceTelemetry, decode_clock_reasons, visible_device

__all__ = [
    "DEVICE_ALL_FIELDS", "HOST_FIELDS", "DeviceTelemetry", "HostTelemetry", "Telemetry",
    "decode_clock_reasons", "visible_device",
]


class Telemetry:
    """Both readers behind one rate limit (default 1 Hz, the ceiling design.md §6 allows)."""

    def __init__(self, device: DeviceTelemetry | None = None, host: HostTelemetry | None = None,
                 interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Readers default to this process and its rank's GPU; ``clock`` is injectable for tests."""
        self.device = device if device is not None else DeviceTelemetry()
        self.host = host if host is not None else HostTelemetry()
        self.interval_s = max(1.0, float(interval_s))
        self._clock = clock
        self._last: float | None = None

    def maybe_sample(self) -> dict[str, Any] | None:
        """``{"device": {...}, "host": {...}}`` when a reading is due, else ``None``."""
        try:
            now = self._clock()
            if self._last is not None and now - self._last < self.interval_s:
                return None
            self._last = now
            return {"device": self.device.sample(), "host": self.host.sample()}
        except Exception as exc:  # both samplers already guard themselves; belt and braces
            warn_once("telemetry.sample", f"telemetry failed: {exc!r}")
            return None

    def close(self) -> None:
        """Release NVML. Never raises."""
        self.device.close()
