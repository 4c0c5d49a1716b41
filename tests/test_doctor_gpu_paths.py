"""The GPU paths of ``flowtop doctor`` and of the exporter on a machine without a GPU: NVML
absent, failing, or a stand-in module reporting GPUs (GPM on, off, failing), each ending in a
finding with its fix and never in a traceback; a rank without telemetry has no GPU samples
(left out, never 0). The same paths on a real GPU are for the device check (bench/device_run.sh)."""

from __future__ import annotations

import sys
import types
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

import flowtop.tools.doctor_child as child
from flowtop.tools.doctor_checks import device_findings


class NVMLError(Exception):
    pass


def fake_nvml(devices: list[tuple[str, Any]], init_error: bool = False) -> types.ModuleType:
    """A pynvml stand-in: ``devices`` are (name, GPM answer: True/False/an exception)."""
    m = types.ModuleType("pynvml")

    def init() -> None:
        if init_error:
            raise NVMLError("NVML Shared Library Not Found")

    def gpm(handle: int) -> Any:
        answer = devices[handle][1]
        if isinstance(answer, Exception):
            raise answer
        return types.SimpleNamespace(isSupportedDevice=int(answer))

    def shutdown() -> None:
        raise NVMLError("already shut down")  # must not spoil the report

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlSystemGetDriverVersion = lambda: b"580.65"
    m.nvmlSystemGetNVMLVersion = lambda: "12.580"
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: devices[h][0].encode()
    m.nvmlGpmQueryDeviceSupport = gpm
    return m


def report(nvml: dict[str, Any], cuda: bool, devices: list[str]) -> dict[str, Any]:
    return {"torch": {"ok": True, "version": "2.13.0", "cuda": "13.0" if cuda else None, "cuda_available": cuda,
                      "devices": devices}, "nvml": nvml, "peaks": child.peak_report(devices)}


def test_nvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    nvml = child.nvml_report()
    assert nvml["ok"] is False and "nvidia-ml-py not importable" in nvml["error"]
    (f,) = [f for f in device_findings(report(nvml, False, [])) if f.check == "nvml"]
    assert f.status == "info" and "no GPU telemetry" in f.summary  # a CPU node: nothing to fix


def test_nvml_without_a_driver_on_a_cuda_node_warns_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], init_error=True))
    nvml = child.nvml_report()
    assert nvml["ok"] is False and "NVML init failed" in nvml["error"]
    (f,) = [f for f in device_findings(report(nvml, True, ["NVIDIA H200"])) if f.check == "nvml"]
    assert f.status == "warn" and "install the NVIDIA driver" in f.fix  # CUDA works, telemetry would not


def test_gpus_with_and_without_gpm_and_their_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [("NVIDIA H200", True), ("NVIDIA A100-SXM4-80GB", False), ("NVIDIA H100 80GB HBM3", NVMLError("boom")),
            ("Mystery GPU 9000", False)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus))
    monkeypatch.delenv("FLOWTOP_PEAK_TFLOPS", raising=False)
    nvml = child.nvml_report()
    assert nvml["ok"] and nvml["driver"] == "580.65" and len(nvml["devices"]) == 4
    findings = device_findings(report(nvml, True, [g[0] for g in gpus]))
    by = {f.check: [x for x in findings if x.check == f.check] for f in findings}
    assert by["nvml"][0].status == "ok" and "4 GPU(s)" in by["nvml"][0].summary
    gpm = [(f.status, f.summary) for f in by["gpm"]]
    assert gpm[0][0] == "ok" and "GPM on" in gpm[0][1]
    assert gpm[1][0] == "info" and "needs Hopper or newer" in gpm[1][1]
    assert gpm[2][0] == "info" and "GPM query failed: NVMLError: boom" in gpm[2][1]
    peaks = {f.summary.split(":")[0]: f for f in by["peak"]}
    assert peaks["NVIDIA H200 bf16"].status == "ok" and "TFLOP/s" in peaks["NVIDIA H200 bf16"].summary
    unknown = peaks["Mystery GPU 9000 bf16"]
    assert unknown.status == "warn" and "MFU n/a" in unknown.summary and "FLOWTOP_PEAK_TFLOPS" in unknown.fix


def test_a_rank_without_gpu_telemetry_has_no_gpu_samples() -> None:
    from flowtop.export.exporter import ExportPolicy
    from flowtop.export.metrics_http import HostPort, MetricsServer
    from flowtop.monitor.snapshot import MonitorSnapshot
    from synthetic.cluster import cluster_job
    from test_prometheus import http_get

    job = cluster_job(4, job="cpu-and-gpu")
    ranks = (replace(job.ranks[0], telemetry=None, device="cpu"), *job.ranks[1:])
    snap = MonitorSnapshot(taken_at=5000.0, listen="tcp://127.0.0.1:5759", jobs=(replace(job, ranks=ranks),),
                           received=1, rejected=0)
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: snap, ExportPolicy())
    where = server.start()
    try:
        text = http_get(where.url())
    finally:
        server.stop()
    for name in ("flowtop_rank_gpu_utilization_ratio", "flowtop_rank_tensor_active_ratio"):
        got = {s.labels["rank"]: s.value for f in parse_text(text) for s in f.samples if s.name == name}
        assert set(got) == {"1", "2", "3"}, name  # rank 0: left out, never 0
