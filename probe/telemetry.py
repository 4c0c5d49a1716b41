"""Telemetry for the probe's sender thread: device (NVML + GPM) and host (psutil) readers.

The implementations live in ``probe.nvml`` (with ``probe.gpm``) and ``probe.hostinfo``; this module
is the import point the runtime uses. Both readers are cheap to construct, read nothing until
``sample()``, are meant to be sampled at most once a second, and never raise.
"""

from __future__ import annotations

from probe.gpm import GPM_FIELDS
from probe.hostinfo import HOST_FIELDS, HostTelemetry
from probe.nvml import ALL_FIELDS as DEVICE_FIELDS
from probe.nvml import DeviceTelemetry, decode_clock_reasons, visible_device

__all__ = [
    "DEVICE_FIELDS", "GPM_FIELDS", "HOST_FIELDS", "DeviceTelemetry", "HostTelemetry",
    "decode_clock_reasons", "visible_device",
]
