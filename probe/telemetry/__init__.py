"""Telemetry read on the sender thread: device (NVML, GPM) and host (psutil)."""
