"""DeviceTelemetry (probe/telemetry/nvml.py) against a fake NVML.

The fake stands in for the library only because this machine has no GPU; it mimics pynvml's
function names, constants, error objects (``.value`` = NVML return code) and GPM structures.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

import probe._log
from probe.telemetry.nvml import ALL_FIELDS, GPM_FIELDS, DeviceTelemetry, decode_clock_reasons, visible_device

NOT_SUPPORTED, NOT_FOUND, UNKNOWN = 3, 6, 999


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"fake NVML error {value}")
        self.value = value


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H200"
    mem_used: int = 10 * 2**30
    mem_total: int = 141 * 2**30
    util: int = 100
    power_mw: int = 512_345
    limit_mw: int = 700_000
    clock: int = 1755
    clock_max: int = 1980
    temp: int = 61
    reasons_mask: int = 0x1
    gpm_supported: bool = True
    mig_parent: "FakeDevice | None" = None
    gi_id: int = 0


@dataclass
class Mem:
    used: int
    total: int


@dataclass
class Util:
    gpu: int
    memory: int = 0


@dataclass
class Metric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


@dataclass
class MetricsGet:
    version: int = 0
    numMetrics: int = 0
    sample1: Any = None
    sample2: Any = None
    metrics: list[Metric] = field(default_factory=lambda: [Metric() for _ in range(32)])


@dataclass
class Sample:
    tick: int = -1
    source: Any = None


@dataclass
class Support:
    isSupportedDevice: int


# Same metric ids as pynvml; the values the fake GPM reports for one interval.
GPM_VALUES = {2: 84.0, 3: 41.5, 5: 52.0, 7: 50.4, 10: 28.0, 60: 3.0, 61: 2.0}


class FakeNVML:
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVML_GPM_METRIC_HMMA_TENSOR_UTIL = 7
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
    c_nvmlGpmMetricsGet_t = MetricsGet

    def __init__(self, devices: list[FakeDevice], migs: list[FakeDevice] = (),
                 init_error: int | None = None, query_error: int | None = None) -> None:
        self.devices = list(devices)
        self.migs = list(migs)
        self.init_error = init_error
        self.query_error = query_error  # every device query raises this code
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.tick = 0

    def _log(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def _query(self, name: str, *args: Any) -> None:
        self._log(name, *args)
        if self.query_error is not None:
            raise FakeNVMLError(self.query_error)

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)

    def nvmlInit(self) -> None:
        self._log("nvmlInit")
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._log("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeDevice:
        self._log("nvmlDeviceGetHandleByIndex", i)
        return self.devices[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeDevice:
        self._log("nvmlDeviceGetHandleByUUID", uuid)
        for dev in self.devices + self.migs:
            if dev.uuid == uuid:
                return dev
        raise FakeNVMLError(getattr(self, "unknown_uuid_code", NOT_FOUND))

    def nvmlDeviceGetUUID(self, dev: FakeDevice) -> str:
        return dev.uuid

    def nvmlDeviceGetName(self, dev: FakeDevice) -> bytes:
        return dev.name.encode()  # older bindings return bytes

    def nvmlDeviceIsMigDeviceHandle(self, dev: FakeDevice) -> ctypes.c_uint:
        return ctypes.c_uint(1 if dev.mig_parent is not None else 0)  # pynvml returns a c_uint

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, dev: FakeDevice) -> FakeDevice:
        assert dev.mig_parent is not None
        return dev.mig_parent

    def nvmlDeviceGetGpuInstanceId(self, dev: FakeDevice) -> int:
        return dev.gi_id

    def nvmlDeviceGetMemoryInfo(self, dev: FakeDevice) -> Mem:
        self._query("nvmlDeviceGetMemoryInfo", dev)
        return Mem(dev.mem_used, dev.mem_total)

    def nvmlDeviceGetUtilizationRates(self, dev: FakeDevice) -> Util:
        self._query("nvmlDeviceGetUtilizationRates", dev)
        if dev.mig_parent is not None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return Util(dev.util)

    def nvmlDeviceGetPowerUsage(self, dev: FakeDevice) -> int:
        self._query("nvmlDeviceGetPowerUsage", dev)
        return dev.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, dev: FakeDevice) -> int:
        self._query("nvmlDeviceGetEnforcedPowerLimit", dev)
        return dev.limit_mw

    def nvmlDeviceGetClockInfo(self, dev: FakeDevice, kind: int) -> int:
        self._query("nvmlDeviceGetClockInfo", dev, kind)
        assert kind == 1  # NVML_CLOCK_SM
        return dev.clock

    def nvmlDeviceGetMaxClockInfo(self, dev: FakeDevice, kind: int) -> int:
        self._query("nvmlDeviceGetMaxClockInfo", dev, kind)
        assert kind == 1
        return dev.clock_max

    def nvmlDeviceGetTemperature(self, dev: FakeDevice, sensor: int) -> int:
        self._query("nvmlDeviceGetTemperature", dev, sensor)
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        return dev.temp

    def nvmlDeviceGetCurrentClocksEventReasons(self, dev: FakeDevice) -> int:
        self._query("nvmlDeviceGetCurrentClocksEventReasons", dev)
        return dev.reasons_mask

    def nvmlGpmQueryDeviceSupport(self, dev: FakeDevice) -> Support:
        self._query("nvmlGpmQueryDeviceSupport", dev)
        return Support(1 if dev.gpm_supported else 0)

    def nvmlGpmSampleAlloc(self) -> Sample:
        self._log("nvmlGpmSampleAlloc")
        return Sample()

    def nvmlGpmSampleFree(self, sample: Sample) -> None:
        self._log("nvmlGpmSampleFree", sample)

    def nvmlGpmSampleGet(self, dev: FakeDevice, sample: Sample) -> Sample:
        self._query("nvmlGpmSampleGet", dev, sample)
        self.tick += 1
        sample.tick, sample.source = self.tick, dev
        return sample

    def nvmlGpmMigSampleGet(self, dev: FakeDevice, gi_id: int, sample: Sample) -> Sample:
        self._query("nvmlGpmMigSampleGet", dev, gi_id, sample)
        self.tick += 1
        sample.tick, sample.source = self.tick, (dev, gi_id)
        return sample

    def nvmlGpmMetricsGet(self, mg: MetricsGet) -> MetricsGet:
        self._log("nvmlGpmMetricsGet", mg.sample1.tick, mg.sample2.tick)
        assert mg.version == 1
        # the two samples must be the previous and the latest one, in that order
        assert mg.sample2.tick == self.tick and mg.sample1.tick == self.tick - 1
        for metric in mg.metrics[: mg.numMetrics]:
            if metric.metricId in GPM_VALUES:
                metric.value = GPM_VALUES[metric.metricId] + 0.001 * mg.sample2.tick
            else:
                metric.nvmlReturn = NOT_SUPPORTED
        return mg


def h200(uuid: str = "GPU-aaaa-1111", **kw: Any) -> FakeDevice:
    return FakeDevice(uuid=uuid, **kw)


def assert_reasons_cover_nones(s: dict[str, Any]) -> None:
    for key in ALL_FIELDS:
        if s[key] is None:
            assert s["reasons"].get(key), f"{key} is None without a reason"


def test_normal_values_first_sample_has_no_gpm() -> None:
    nv = FakeNVML([h200(reasons_mask=0x1 | 0x4 | 0x40)])
    t = DeviceTelemetry(nvml=nv, env={})
    s = t.sample()
    assert s["gpu_util"] == 100.0
    assert s["mem_used"] == 10 * 2**30 and s["mem_total"] == 141 * 2**30
    assert s["power_w"] == 512.345 and s["power_limit_w"] == 700.0
    assert s["sm_clock_mhz"] == 1755 and s["sm_clock_max_mhz"] == 1980
    assert s["temp_c"] == 61
    assert s["throttle"] == ["sw_power_cap", "hw_thermal"]
    assert s["name"] == "NVIDIA H200" and s["uuid"] == "GPU-aaaa-1111"
    for key in GPM_FIELDS:
        assert s[key] is None
        assert "two samples" in s["reasons"][key]
    assert set(s["reasons"]) == set(GPM_FIELDS)


def test_missing_library_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes "import pynvml" raise ImportError
    s = DeviceTelemetry(env={}).sample()
    assert all(s[k] is None for k in ALL_FIELDS)
    for key in ALL_FIELDS:
        assert s["reasons"][key].startswith("no NVML library")


def test_init_errors_give_clear_reasons() -> None:
    s = DeviceTelemetry(nvml=FakeNVML([h200()], init_error=12), env={}).sample()
    assert s["reasons"]["gpu_util"] == "no NVML library (libnvidia-ml not found: no NVIDIA driver)"
    s = DeviceTelemetry(nvml=FakeNVML([h200()], init_error=9), env={}).sample()
    assert s["reasons"]["temp_c"] == "no GPU (NVIDIA driver not loaded)"
    s = DeviceTelemetry(nvml=FakeNVML([]), env={}).sample()
    assert s["reasons"]["mem_used"] == "no GPU (NVML sees 0 devices)"
    assert all(s[k] is None for k in ALL_FIELDS)


def test_every_call_raising_is_contained_and_warned_once(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe._log, "_seen", set())  # independent of earlier tests' warnings
    nv = FakeNVML([h200()], query_error=UNKNOWN)
    t = DeviceTelemetry(nvml=nv, env={})
    for _ in range(3):
        s = t.sample()
    assert all(s[k] is None for k in ALL_FIELDS)
    assert_reasons_cover_nones(s)
    assert s["reasons"]["gpu_util"] == "NVML error: fake NVML error 999"
    assert s["reasons"]["sm_active"].startswith("GPM support query failed")
    # transient errors are retried each reading ...
    assert nv.count("nvmlDeviceGetUtilizationRates") == 3
    # ... but reported once per field
    err = capsys.readouterr().err
    assert err.count("nvmlDeviceGetUtilizationRates failed") == 1
    assert err.count("nvmlDeviceGetPowerUsage failed") == 1


def test_not_supported_fields_are_not_asked_again() -> None:
    nv = FakeNVML([h200()], query_error=NOT_SUPPORTED)
    t = DeviceTelemetry(nvml=nv, env={})
    t.sample()
    s = t.sample()
    assert s["power_w"] is None
    assert s["reasons"]["power_w"] == "not supported on this device"
    assert s["reasons"]["mem_total"] == "not supported on this device"
    assert nv.count("nvmlDeviceGetPowerUsage") == 1
    assert nv.count("nvmlDeviceGetMaxClockInfo") == 1
    assert s["reasons"]["tensor_active"] == "GPM unsupported on this device (or driver)"


def test_cuda_visible_devices_indices_and_local_rank() -> None:
    devs = [h200(uuid=f"GPU-{i}") for i in range(4)]
    nv = FakeNVML(devs)
    s = DeviceTelemetry(nvml=nv, env={"CUDA_VISIBLE_DEVICES": "3,1", "LOCAL_RANK": "1"}).sample()
    assert s["uuid"] == "GPU-1"
    nv = FakeNVML(devs)
    s = DeviceTelemetry(nvml=nv, local_rank=0, env={"CUDA_VISIBLE_DEVICES": "3,1",
                                                    "LOCAL_RANK": "1"}).sample()
    assert s["uuid"] == "GPU-3"
    nv = FakeNVML(devs)
    s = DeviceTelemetry(nvml=nv, cuda_device_index=2, env={"LOCAL_RANK": "0"}).sample()
    assert s["uuid"] == "GPU-2"


def test_cuda_visible_devices_uuids_and_prefix() -> None:
    devs = [h200(uuid="GPU-aaaa-1111"), h200(uuid="GPU-bbbb-2222")]
    nv = FakeNVML(devs)
    s = DeviceTelemetry(nvml=nv, env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb-2222"}).sample()
    assert s["uuid"] == "GPU-bbbb-2222"
    assert ("nvmlDeviceGetHandleByUUID", ("GPU-bbbb-2222",)) in nv.calls
    assert nv.count("nvmlDeviceGetHandleByIndex") == 0  # looked up by UUID, not by index
    nv = FakeNVML(devs)
    s = DeviceTelemetry(nvml=nv, env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}).sample()
    assert s["uuid"] == "GPU-bbbb-2222"  # CUDA accepts a unique prefix
    nv = FakeNVML(devs)
    nv.unknown_uuid_code = 2  # some drivers call a partial UUID an INVALID_ARGUMENT
    s = DeviceTelemetry(nvml=nv, env={"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}).sample()
    assert s["uuid"] == "GPU-aaaa-1111"
    nv = FakeNVML(devs)
    s = DeviceTelemetry(nvml=nv, env={"CUDA_VISIBLE_DEVICES": "GPU-cccc"}).sample()
    assert s["gpu_util"] is None
    assert s["reasons"]["gpu_util"] == "no GPU with UUID GPU-cccc (from CUDA_VISIBLE_DEVICES)"


def test_rank_outside_visible_devices() -> None:
    nv = FakeNVML([h200()])
    t = DeviceTelemetry(nvml=nv, env={"CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "1"})
    s = t.sample()
    assert s["reasons"]["gpu_util"] == "CUDA device 1 not in CUDA_VISIBLE_DEVICES='0'"
    t.close()
    assert nv.count("nvmlShutdown") == 1  # NVML was initialised, so it is released
    s = DeviceTelemetry(nvml=FakeNVML([h200()]), env={"CUDA_VISIBLE_DEVICES": ""}).sample()
    assert s["reasons"]["gpu_util"] == "no GPU visible (CUDA_VISIBLE_DEVICES='')"


def test_visible_device_parsing() -> None:
    assert visible_device(None, 5) == 5
    assert visible_device("2,0", 0) == 2
    assert visible_device(" 2 , 0 ", 1) == 0
    assert visible_device("GPU-abc,MIG-def", 1) == "MIG-def"
    with pytest.raises(LookupError):
        visible_device("1,foo,2", 1)  # CUDA stops at the first invalid entry
    with pytest.raises(LookupError):
        visible_device("-1", 0)
    with pytest.raises(LookupError):
        visible_device("0", -1)


def test_throttle_reason_decoding() -> None:
    assert decode_clock_reasons(0) == []
    assert decode_clock_reasons(0x1 | 0x2) == []  # idle and application clocks are not slowdowns
    assert decode_clock_reasons(0x4) == ["sw_power_cap"]
    assert decode_clock_reasons(0x8 | 0x20 | 0x40 | 0x80) == [
        "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"]
    assert decode_clock_reasons(0x1 | 0x800) == ["unknown_0x800"]


def test_older_binding_uses_throttle_reason_call() -> None:
    class OldNames(FakeNVML):
        def __getattribute__(self, name: str) -> Any:
            if name == "nvmlDeviceGetCurrentClocksEventReasons":
                raise AttributeError(name)
            return super().__getattribute__(name)

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, dev: FakeDevice) -> int:
            return 0x4 | 0x10

    s = DeviceTelemetry(nvml=OldNames([h200()]), env={}).sample()
    assert s["throttle"] == ["sw_power_cap", "sync_boost"]


def _real_nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_real_nvml_loadable(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_gpu_is_all_none_with_reason() -> None:
    t = DeviceTelemetry()
    for _ in range(2):
        s = t.sample()
    assert all(s[k] is None for k in ALL_FIELDS)
    assert s["reasons"]["gpu_util"] == "no NVML library (libnvidia-ml not found: no NVIDIA driver)"
    assert set(s["reasons"]) == set(ALL_FIELDS)
    t.close()



def test_current_torch_device_is_read_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeCuda:
        device = 2

        @staticmethod
        def is_initialized() -> bool:
            return True

        @classmethod
        def current_device(cls) -> int:
            return cls.device

    class FakeTorch:
        cuda = FakeCuda

    monkeypatch.setitem(sys.modules, "torch", FakeTorch)
    devs = [h200(uuid=f"GPU-{i}") for i in range(4)]
    t = DeviceTelemetry(nvml=FakeNVML(devs), env={"LOCAL_RANK": "0"})
    FakeCuda.device = 0  # what another thread (the sender) would see: CUDA's device is per thread
    assert t.sample()["uuid"] == "GPU-2"
