"""NVML GPU Performance Monitoring (GPM, Hopper and newer): SM, tensor-pipe and DRAM activity.

GPM metrics are rates between two samples taken by ``nvmlGpmSampleGet``: the reader keeps two
sample buffers, takes one sample per call and computes the metrics against the previous call's
sample, so the first reading has no values. On a MIG instance the samples come from
``nvmlGpmMigSampleGet`` on the parent GPU with the instance's GPU-instance id. Used by
``probe.telemetry.nvml.DeviceTelemetry``; never raises.
"""

from __future__ import annotations

from typing import Any

from probe._log import warn_once

GPM_FIELDS: tuple[str, ...] = (
    "sm_active", "sm_occupancy", "tensor_active", "tensor_hmma", "dram_bw_util",
    "nvlink_tx_bytes_s", "nvlink_rx_bytes_s",
)
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND
_MIB = 1024 * 1024  # GPM NVLink rates are MiB/s

# field -> pynvml metric constant, and the factor to the field's unit (%, or bytes/s).
_METRICS: tuple[tuple[str, str, float], ...] = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL", 1.0),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY", 1.0),
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 1.0),
    ("tensor_hmma", "NVML_GPM_METRIC_HMMA_TENSOR_UTIL", 1.0),
    ("dram_bw_util", "NVML_GPM_METRIC_DRAM_BW_UTIL", 1.0),
    ("nvlink_tx_bytes_s", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", float(_MIB)),
    ("nvlink_rx_bytes_s", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", float(_MIB)),
)


def nvml_error_code(exc: BaseException) -> int | None:
    """The NVML return code of a pynvml ``NVMLError`` (its ``.value``), else ``None``."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def nvml_int(value: Any) -> int:
    """NVML wrappers return plain ints or ctypes values (``.value``); accept both."""
    return int(getattr(value, "value", value))


class GpmReader:
    """Two-sample GPM metrics for one device (or MIG instance)."""

    def __init__(self, nvml: Any, handle: Any, parent: Any = None, gi_id: int | None = None) -> None:
        """``parent``/``gi_id`` are set for a MIG instance (``handle`` is then the MIG handle)."""
        self._nv = nvml
        self._handle = handle
        self._parent = parent
        self._gi_id = gi_id
        self._state = "new"  # new | ok | off
        self._reason = ""
        self._samples: list[Any] = []  # [previous, current] buffers, swapped after each reading
        self._have_prev = False

    def _off(self, reason: str) -> None:
        self._state = "off"
        self._reason = reason
        self.close()

    def _setup(self) -> None:
        nv = self._nv
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            self._off("GPM unsupported by this NVML binding (nvidia-ml-py too old)")
            return
        try:
            support = nv.nvmlGpmQueryDeviceSupport(
                self._parent if self._parent is not None else self._handle)
        except Exception as exc:
            if nvml_error_code(exc) in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                self._off("GPM unsupported on this device (or driver)")
            else:
                self._off(f"GPM support query failed: {exc}")
            return
        if not nvml_int(getattr(support, "isSupportedDevice", 0)):
            self._off("GPM unsupported on this device (needs Hopper or newer)")
            return
        try:
            self._samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        except Exception as exc:
            self._off(f"GPM sample allocation failed: {exc}")
            return
        self._state = "ok"

    def _take(self, sample: Any) -> None:
        if self._parent is not None:
            self._nv.nvmlGpmMigSampleGet(self._parent, self._gi_id, sample)
        else:
            self._nv.nvmlGpmSampleGet(self._handle, sample)

    def read(self, out: dict[str, Any], reasons: dict[str, str]) -> None:
        """Fill ``out[GPM_FIELDS]`` from the interval since the previous call, or explain why not."""
        try:
            self._read(out, reasons)
        except Exception as exc:  # last-resort guard
            warn_once("gpm.read", f"GPM reading failed: {exc!r}")
            self._off(f"GPM reading failed: {exc!r}")
            for key in GPM_FIELDS:
                out[key] = None
                reasons[key] = self._reason

    def _read(self, out: dict[str, Any], reasons: dict[str, str]) -> None:
        if self._state == "new":
            self._setup()
        if self._state != "ok":
            for key in GPM_FIELDS:
                reasons[key] = self._reason
            return
        nv = self._nv
        prev, cur = self._samples
        try:
            self._take(cur)
        except Exception as exc:
            self._have_prev = False
            warn_once("gpm.sample", f"GPM sample failed: {exc}")
            for key in GPM_FIELDS:
                reasons[key] = f"GPM sample failed: {exc}"
            return
        self._samples = [cur, prev]  # this sample is the next call's "previous"
        if not self._have_prev:
            self._have_prev = True
            for key in GPM_FIELDS:
                reasons[key] = "GPM needs two samples: values start with the next reading"
            return
        request: list[tuple[str, int, float]] = []
        for key, const, scale in _METRICS:
            metric_id = getattr(nv, const, None)
            if metric_id is None:
                reasons[key] = "GPM metric unknown to this NVML binding"
            else:
                request.append((key, metric_id, scale))
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(request)
            mg.sample1 = prev
            mg.sample2 = cur
            for i, (_, metric_id, _) in enumerate(request):
                mg.metrics[i].metricId = metric_id
            nv.nvmlGpmMetricsGet(mg)
        except Exception as exc:
            warn_once("gpm.get", f"GPM metrics query failed: {exc}")
            for key, _, _ in request:
                reasons[key] = f"GPM metrics query failed: {exc}"
            return
        for i, (key, _, scale) in enumerate(request):
            metric = mg.metrics[i]
            code = nvml_int(getattr(metric, "nvmlReturn", 0))
            if code == 0:
                out[key] = float(metric.value) * scale
            elif code == NOT_SUPPORTED:
                reasons[key] = "GPM metric not supported on this device"
            else:
                reasons[key] = f"GPM metric error code {code}"

    def close(self) -> None:
        """Free the sample buffers; later reads report the reason. Never raises."""
        for sample in self._samples:
            try:
                self._nv.nvmlGpmSampleFree(sample)
            except Exception:
                pass
        self._samples = []
        self._have_prev = False
        if self._state != "off":
            self._state, self._reason = "off", "telemetry closed"
