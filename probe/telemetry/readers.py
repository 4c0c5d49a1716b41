"""Telemetry for the probe's sender thread: device (NVML + GPM) and host (psutil) readers.

The implementations live in ``probe.telemetry.nvml`` (with ``probe.telemetry.gpm``) and ``probe.telemetry.hostinfo``;
this module is the import point the runtime uses. Both readers are cheap to construct, read nothing until
``sample()``, are meant to be sampled at most once a second, and never raise.
"""

from __future__ import annotations

from probe.telemetry.gpm import GPM_FIELDS
from probe.telemetry.hostinfo import HOST_FIELDS, HostTelemetry
from probe.telemetry.nvml import ALL_FIELDS as DEVICE_FIELDS
from probe.telemetry.nvml import DeviceTelemetry, decode_clock_reasons, visible_device

__all__ = [
    "DEVICE_FIELDS", "GPM_FIELDS", "HOST_FIELDS", "DeviceTelemetry", "HostTelemetry",
    "decode_clock_reasons", "visible_device",
]
