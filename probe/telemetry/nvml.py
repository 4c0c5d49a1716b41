"""Device telemetry from NVML (and GPM on Hopper and newer) for one training rank.

Runs on the probe's sender thread at most once a second. ``DeviceTelemetry.sample()`` never raises:
every field that cannot be read is ``None`` and ``reasons[field]`` says why.

Why these choices (docs/design.md, "Hardware cross-checks"):
- NVML's GPU-Util reads 100 % whenever any kernel runs, so the GPM metrics (SM activity, tensor-pipe
  activity, DRAM bandwidth; probe/telemetry/gpm.py) are the honest cross-check.
- The rank's GPU is the CUDA device it uses, mapped through ``CUDA_VISIBLE_DEVICES`` (indices or
  ``GPU-``/``MIG-`` UUIDs) to an NVML handle; UUIDs are looked up by UUID because NVML's index order
  need not match CUDA's.
- A MIG instance has no device-level utilisation and shares power with the other instances, so those
  fields are ``None``; clocks, temperature and throttle reasons come from the parent GPU (they apply
  to the instance's SMs) and GPM uses ``nvmlGpmMigSampleGet``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from probe._log import warn_once
from probe.telemetry.gpm import (FUNCTION_NOT_FOUND, GPM_FIELDS, NOT_SUPPORTED, GpmReader, nvml_error_code,
                       nvml_int)

DEVICE_FIELDS: tuple[str, ...] = (
    "gpu_util", "mem_used", "mem_total", "power_w", "power_limit_w",
    "sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "throttle",
)
ALL_FIELDS: tuple[str, ...] = DEVICE_FIELDS + GPM_FIELDS

# NVML return codes we branch on (ABI-stable values from nvml.h).
_INVALID_ARGUMENT = 2
_NOT_FOUND = 6
_LIBRARY_NOT_FOUND = 12
_DRIVER_NOT_LOADED = 9

_CLOCK_SM = 1  # NVML_CLOCK_SM
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU

# Clock-event ("throttle") reason bits, nvml.h. gpu_idle (0x1) and applications-clocks (0x2) are
# not slowdowns of a busy GPU, so they are never reported.
_IGNORED_REASON_BITS = 0x1 | 0x2
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clock"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)

_MIG_NA = "MIG instance: device-level metrics unavailable"


def decode_clock_reasons(mask: int) -> list[str]:
    """Names of the active clock-event reasons in ``mask``, without gpu_idle/applications clocks."""
    names: list[str] = []
    known = _IGNORED_REASON_BITS
    for bit, name in CLOCK_EVENT_REASONS:
        known |= bit
        if mask & bit:
            names.append(name)
    unknown = mask & ~known
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def visible_device(cuda_visible_devices: str | None, cuda_index: int) -> int | str:
    """Map a CUDA device index through ``CUDA_VISIBLE_DEVICES`` to an NVML index or UUID.

    Follows CUDA's parsing: entries are comma-separated, the list ends at the first invalid entry,
    and an empty variable hides every GPU. Raises ``LookupError`` with a readable reason.
    """
    if cuda_index < 0:
        raise LookupError(f"invalid CUDA device index {cuda_index}")
    if cuda_visible_devices is None:
        return cuda_index
    entries: list[int | str] = []
    for raw in cuda_visible_devices.split(","):
        item = raw.strip()
        if item.isdigit():
            entries.append(int(item))
        elif item[:4].upper() in ("GPU-", "MIG-"):
            entries.append(item)
        else:
            break  # CUDA ignores this entry and everything after it
    if not entries:
        raise LookupError(f"no GPU visible (CUDA_VISIBLE_DEVICES={cuda_visible_devices!r})")
    if cuda_index >= len(entries):
        raise LookupError(
            f"CUDA device {cuda_index} not in CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}")
    return entries[cuda_index]


def _current_cuda_index() -> int | None:
    """The current CUDA device if torch has initialised CUDA in this process (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:
        return None
    return None


class DeviceTelemetry:
    """NVML + GPM readings for the GPU of one rank.

    Construct it on the training thread (CUDA's current device is per thread: the sender thread
    would see device 0), then call ``sample()`` from any one thread at most once a second."""

    def __init__(self, nvml: Any | None = None, local_rank: int | None = None,
                 cuda_device_index: int | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        """``nvml``: an object with pynvml's functions (default: import ``pynvml`` lazily).
        Device choice: ``cuda_device_index`` if given, else torch's current CUDA device when torch
        has initialised CUDA (read here, on the constructing thread), else ``local_rank``
        (default ``$LOCAL_RANK``, else 0); ``env`` stands in for ``os.environ``."""
        self._nvml: Any = nvml
        self._env: Mapping[str, str] = os.environ if env is None else env
        self._local_rank = local_rank
        # Read now: the current device is thread-local and sample() runs on the sender thread.
        self._cuda_index = cuda_device_index if cuda_device_index is not None else (
            _current_cuda_index())
        self._ready = False
        self._inited = False  # nvmlInit succeeded: close() owes an nvmlShutdown
        self._fatal: str | None = None  # set once: every field is n/a for this reason
        self._handle: Any = None
        self._parent: Any = None  # MIG: the physical GPU
        self._gi_id: int | None = None
        self._unsupported: dict[str, str] = {}  # field -> reason, never asked again
        self._static: dict[str, Any] = {}
        self._gpm: GpmReader | None = None
        self.name: str | None = None
        self.uuid: str | None = None

    # ----------------------------------------------------------------- setup
    def _init(self) -> None:
        """Load NVML and resolve this rank's device once; failures become ``self._fatal``."""
        self._ready = True
        if self._nvml is None:
            try:
                import pynvml  # nvidia-ml-py
            except Exception as exc:  # ImportError, or a broken install
                self._fatal = f"no NVML library (nvidia-ml-py not importable: {exc})"
                return
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
            self._inited = True
        except Exception as exc:
            code = nvml_error_code(exc)
            if code == _LIBRARY_NOT_FOUND:
                self._fatal = "no NVML library (libnvidia-ml not found: no NVIDIA driver)"
            elif code == _DRIVER_NOT_LOADED:
                self._fatal = "no GPU (NVIDIA driver not loaded)"
            else:
                self._fatal = f"NVML init failed: {exc}"
            return
        try:
            self._resolve_device()
        except LookupError as exc:
            self._fatal = str(exc)
        except Exception as exc:
            self._fatal = f"NVML device lookup failed: {exc}"

    def _resolve_device(self) -> None:
        nv = self._nvml
        if nvml_int(nv.nvmlDeviceGetCount()) == 0:
            raise LookupError("no GPU (NVML sees 0 devices)")
        index = self._cuda_index
        if index is None:
            rank = self._local_rank
            if rank is None:
                try:
                    rank = int(self._env.get("LOCAL_RANK", "0"))
                except ValueError:
                    rank = 0
            index = rank
        target = visible_device(self._env.get("CUDA_VISIBLE_DEVICES"), index)
        if isinstance(target, int):
            self._handle = nv.nvmlDeviceGetHandleByIndex(target)
        else:
            self._handle = self._handle_by_uuid(target)
        try:
            is_mig = nvml_int(nv.nvmlDeviceIsMigDeviceHandle(self._handle)) != 0
        except Exception:
            is_mig = False  # old drivers lack the call; they also lack MIG
        if is_mig:
            self._parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self._handle)
            self._gi_id = nvml_int(nv.nvmlDeviceGetGpuInstanceId(self._handle))
        for attr, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID")):
            try:
                value = getattr(nv, fn)(self._handle)
                setattr(self, attr, value.decode() if isinstance(value, bytes) else str(value))
            except Exception:
                pass

    def _handle_by_uuid(self, uuid: str) -> Any:
        nv = self._nvml
        try:
            return nv.nvmlDeviceGetHandleByUUID(uuid)
        except Exception as exc:
            # NVML answers a partial UUID with NOT_FOUND or INVALID_ARGUMENT (drivers differ)
            if nvml_error_code(exc) not in (_NOT_FOUND, _INVALID_ARGUMENT) or not uuid.upper().startswith("GPU-"):
                raise
        # CUDA accepts a unique UUID prefix; NVML wants the whole UUID.
        for i in range(nvml_int(nv.nvmlDeviceGetCount())):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            full = nv.nvmlDeviceGetUUID(handle)
            full = full.decode() if isinstance(full, bytes) else str(full)
            if full.lower().startswith(uuid.lower()):
                return handle
        raise LookupError(f"no GPU with UUID {uuid} (from CUDA_VISIBLE_DEVICES)")

    # ---------------------------------------------------------------- sample
    def sample(self) -> dict[str, Any]:
        """One reading: every field of ``ALL_FIELDS`` (``None`` when n/a), ``reasons`` for each n/a,
        plus ``name`` and ``uuid`` of the device. Never raises."""
        out: dict[str, Any] = {key: None for key in ALL_FIELDS}
        reasons: dict[str, str] = {}
        try:
            if not self._ready:
                self._init()
            if self._fatal is None:
                self._sample_device(out, reasons)
                if self._gpm is None:
                    self._gpm = GpmReader(self._nvml, self._handle, self._parent, self._gi_id)
                self._gpm.read(out, reasons)
        except Exception as exc:  # last-resort guard: telemetry must never hurt training
            warn_once("nvml.sample", f"device telemetry failed: {exc!r}")
            self._fatal = self._fatal or f"telemetry error: {exc!r}"
        if self._fatal is not None:
            for key in ALL_FIELDS:
                if out[key] is None:
                    reasons.setdefault(key, self._fatal)
        out["name"] = self.name
        out["uuid"] = self.uuid
        out["reasons"] = reasons
        return out

    def _read(self, field: str, reasons: dict[str, str], fn_name: str, *args: Any) -> Any:
        """Call one NVML function for ``field``; ``None`` plus a reason on any failure."""
        if field in self._unsupported:
            reasons[field] = self._unsupported[field]
            return None
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            self._unsupported[field] = f"{fn_name} missing from this NVML binding"
            reasons[field] = self._unsupported[field]
            return None
        try:
            return fn(*args)
        except Exception as exc:
            code = nvml_error_code(exc)
            if code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                # Permanent for this device/driver: stop asking (each call costs µs).
                self._unsupported[field] = "not supported on this device"
                reasons[field] = self._unsupported[field]
            else:
                reasons[field] = f"NVML error: {exc}"
                warn_once(f"nvml.{field}", f"NVML {fn_name} failed: {exc}")
            return None

    def _sample_device(self, out: dict[str, Any], reasons: dict[str, str]) -> None:
        h = self._handle
        mig = self._parent is not None
        phys = self._parent if mig else h  # clocks/temp/throttle belong to the physical GPU

        mem = self._read("mem_used", reasons, "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            out["mem_used"] = int(mem.used)
            out["mem_total"] = int(mem.total)
        else:
            reasons["mem_total"] = reasons["mem_used"]

        if mig:
            for key in ("gpu_util", "power_w", "power_limit_w"):
                reasons[key] = _MIG_NA
        else:
            util = self._read("gpu_util", reasons, "nvmlDeviceGetUtilizationRates", h)
            if util is not None:
                out["gpu_util"] = float(util.gpu)
            power = self._read("power_w", reasons, "nvmlDeviceGetPowerUsage", h)
            if power is not None:
                out["power_w"] = nvml_int(power) / 1000.0  # mW
            limit = self._read("power_limit_w", reasons, "nvmlDeviceGetEnforcedPowerLimit", h)
            if limit is not None:
                out["power_limit_w"] = nvml_int(limit) / 1000.0

        clock = self._read("sm_clock_mhz", reasons, "nvmlDeviceGetClockInfo", phys, _CLOCK_SM)
        if clock is not None:
            out["sm_clock_mhz"] = nvml_int(clock)
        if "sm_clock_max_mhz" not in self._static:  # fixed per device: read once
            cmax = self._read("sm_clock_max_mhz", reasons, "nvmlDeviceGetMaxClockInfo", phys,
                              _CLOCK_SM)
            if cmax is not None:
                self._static["sm_clock_max_mhz"] = nvml_int(cmax)
        out["sm_clock_max_mhz"] = self._static.get("sm_clock_max_mhz")

        temp = self._read("temp_c", reasons, "nvmlDeviceGetTemperature", phys, _TEMPERATURE_GPU)
        if temp is not None:
            out["temp_c"] = nvml_int(temp)

        # Newer bindings name it "clocks event reasons"; older ones "throttle reasons".
        fn = ("nvmlDeviceGetCurrentClocksEventReasons"
              if hasattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons")
              else "nvmlDeviceGetCurrentClocksThrottleReasons")
        mask = self._read("throttle", reasons, fn, phys)
        if mask is not None:
            out["throttle"] = decode_clock_reasons(nvml_int(mask))

    # ---------------------------------------------------------------- close
    def close(self) -> None:
        """Free GPM samples and release NVML; later ``sample()`` calls report n/a. Never raises."""
        try:
            if self._gpm is not None:
                self._gpm.close()
            if self._inited:
                self._inited = False
                self._nvml.nvmlShutdown()
        except Exception:
            pass
        self._ready = True
        self._fatal = "telemetry closed"
