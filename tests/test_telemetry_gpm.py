"""GPM (probe/telemetry/gpm.py) through DeviceTelemetry, and MIG instances, against the fake NVML.

The fake (tests/test_telemetry_device.py) stands in for the library only because this machine has
no GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_telemetry_device import GPM_VALUES, UNKNOWN, FakeDevice, FakeNVML, h200

from probe.telemetry.nvml import ALL_FIELDS, GPM_FIELDS, DeviceTelemetry


def test_gpm_two_sample_flow_uses_previous_and_latest() -> None:
    nv = FakeNVML([h200()])
    t = DeviceTelemetry(nvml=nv, env={})
    t.sample()
    s2 = t.sample()
    assert s2["sm_active"] == pytest.approx(84.002)
    assert s2["sm_occupancy"] == pytest.approx(41.502)
    assert s2["tensor_active"] == pytest.approx(52.002)
    assert s2["tensor_hmma"] == pytest.approx(50.402)
    assert s2["dram_bw_util"] == pytest.approx(28.002)
    # NVLink comes in MiB/s and is reported in bytes/s
    assert s2["nvlink_tx_bytes_s"] == pytest.approx(2.002 * 2**20)
    assert s2["nvlink_rx_bytes_s"] == pytest.approx(3.002 * 2**20)
    assert s2["reasons"] == {}
    s3 = t.sample()  # the fake asserts the pairing (tick 2, tick 3)
    assert s3["sm_active"] == pytest.approx(84.003)
    assert nv.count("nvmlGpmSampleAlloc") == 2  # two buffers, reused
    assert nv.count("nvmlGpmQueryDeviceSupport") == 1
    t.close()
    assert nv.count("nvmlGpmSampleFree") == 2 and nv.count("nvmlShutdown") == 1
    after = t.sample()
    assert all(after[k] is None for k in ALL_FIELDS)
    assert after["reasons"]["gpu_util"] == "telemetry closed"



def test_gpm_unsupported_device() -> None:
    nv = FakeNVML([h200(name="NVIDIA A100-SXM4-80GB", gpm_supported=False)])
    t = DeviceTelemetry(nvml=nv, env={})
    t.sample()
    s = t.sample()
    assert s["gpu_util"] == 100.0
    for key in GPM_FIELDS:
        assert s[key] is None
        assert s["reasons"][key].startswith("GPM unsupported on this device")
    assert nv.count("nvmlGpmSampleGet") == 0
    assert nv.count("nvmlGpmQueryDeviceSupport") == 1  # asked once, not every second



def test_gpm_missing_from_old_binding() -> None:
    class NoGpm(FakeNVML):
        def __getattribute__(self, name: str) -> Any:
            if name.startswith("nvmlGpm"):
                raise AttributeError(name)
            return super().__getattribute__(name)

    t = DeviceTelemetry(nvml=NoGpm([h200()]), env={})
    t.sample()
    s = t.sample()
    assert s["gpu_util"] == 100.0
    assert s["sm_active"] is None
    assert s["reasons"]["sm_active"] == "GPM unsupported by this NVML binding (nvidia-ml-py too old)"



def test_mig_instance() -> None:
    parent = h200(uuid="GPU-parent", temp=70, reasons_mask=0x8)
    mig = FakeDevice(uuid="MIG-1234", mem_used=5, mem_total=20, mig_parent=parent, gi_id=3)
    nv = FakeNVML([parent], migs=[mig])
    t = DeviceTelemetry(nvml=nv, env={"CUDA_VISIBLE_DEVICES": "MIG-1234"})
    t.sample()
    s = t.sample()
    assert (s["mem_used"], s["mem_total"]) == (5, 20)  # the instance's own memory
    for key in ("gpu_util", "power_w", "power_limit_w"):
        assert s[key] is None
        assert s["reasons"][key] == "MIG instance: device-level metrics unavailable"
    assert s["temp_c"] == 70 and s["throttle"] == ["hw_slowdown"]  # from the physical GPU
    assert s["uuid"] == "MIG-1234"
    assert s["sm_active"] == pytest.approx(84.002)
    mig_gets = [args for name, args in nv.calls if name == "nvmlGpmMigSampleGet"]
    assert len(mig_gets) == 2 and all(a[0] is parent and a[1] == 3 for a in mig_gets)
    assert nv.count("nvmlGpmSampleGet") == 0



def test_gpm_metric_errors_and_sample_failure_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(GPM_VALUES, 61)  # the fake now answers NOT_SUPPORTED for NVLink TX
    nv = FakeNVML([h200()])
    t = DeviceTelemetry(nvml=nv, env={})
    t.sample()
    s = t.sample()
    assert s["nvlink_tx_bytes_s"] is None
    assert s["reasons"]["nvlink_tx_bytes_s"] == "GPM metric not supported on this device"
    assert s["sm_active"] == pytest.approx(84.002)
    nv.query_error = UNKNOWN  # one failing reading (every query raises) ...
    s = t.sample()
    assert s["sm_active"] is None
    assert s["reasons"]["sm_active"] == "GPM sample failed: fake NVML error 999"
    nv.query_error = None  # ... then GPM restarts its two-sample cycle
    s = t.sample()
    assert s["sm_active"] is None and "two samples" in s["reasons"]["sm_active"]
    s = t.sample()
    assert s["sm_active"] == pytest.approx(84.004)  # samples 3 and 4: the failed one took none
