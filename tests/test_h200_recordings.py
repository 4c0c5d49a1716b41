"""Real H200 data: recordings the monitor made during ``bench/gpu_check.py`` on an H200
(torch 2.11, CUDA 13, bf16 autocast, fused AdamW), replayed through the monitor's model.

What the probe measured there is pinned here, so a change to the monitor's decoding, accounting,
kernel aggregation or hints that alters what a user saw on real hardware fails on a CPU machine.
Both are the demo GPT (``flowtop.tools.demo.gpt``): "large" 16 layers × 2048 wide, vocab 32768,
16 × 1024 tokens per step; "small" 4 × 256, vocab 8192, 4 × 256 tokens.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from flowtop.monitor.recording import RecordingError, read_recording, replay_all
from flowtop.monitor.snapshot_json import to_json
from flowtop.monitor.wiring import make_model
from snapshot_schema import assert_valid_snapshot

DATA = Path(__file__).parent / "data"
H200_BF16_PEAK = 989.4e12


def gpt_model_flops(batch: int, seq: int, layers: int, width: int, vocab: int) -> int:
    """Model FLOPs of one demo-GPT step, full attention: every matmul forward + 2 × backward."""
    n = batch * seq
    linears = 24 * n * width * width  # per layer: 2·N·(3d² + d² + 4d² + 4d²)
    head = 2 * n * width * vocab
    attention = 4 * batch * seq * seq * width  # per layer: scores + weighted sum
    return 3 * (layers * linears + head) + 3 * layers * attention


def replay(name: str):  # type: ignore[no-untyped-def]
    snap = replay_all(DATA / f"h200-gpt-{name}.rec.gz", make_model())
    assert snap.rejected == 0
    assert_valid_snapshot(to_json(snap))  # real H200 kernel windows and NVML/GPM telemetry
    (job,) = snap.jobs
    (rank,) = job.ranks
    return snap, job, rank


def test_large_gpt_on_h200_is_compute_bound_at_half_the_peak() -> None:
    snap, job, r = replay("large")
    assert (job.job, r.device, r.status, r.step) == ("gpu_check-large", "NVIDIA H200", "live", 54)
    f = r.flops
    attention = 4 * 16 * 1024 * 1024 * 2048
    assert f.model_flops_per_step == gpt_model_flops(16, 1024, 16, 2048, 32768) == 92_358_976_733_184
    # the cuDNN attention backward recomputes the scores: + half a forward per layer
    assert f.executed_flops_per_step == f.model_flops_per_step + 16 * attention // 2
    assert (f.dtype, f.attention_convention, f.peak_flops) == ("bf16", "full", H200_BF16_PEAK)
    assert "NVIDIA H200 SXM datasheet" in f.peak_source
    assert f.mfu == pytest.approx(0.5134, abs=5e-4)  # ≈ 508 TFLOP/s of model FLOPs
    assert r.step_time_s == pytest.approx(0.182, abs=0.003)
    tel = r.telemetry.device
    assert tel["gpu_util"] == 100.0 and tel["tensor_active"] == pytest.approx(59.56, abs=0.01)
    assert tel["throttle"] == ["sw_power_cap"] and tel["power_w"] > 0.99 * tel["power_limit_w"]
    k = r.kernels
    a = k.anatomy
    # The host queued this step in far less time than the GPU took: the step is the device span.
    assert a.step_basis == "device" and a.step_us == pytest.approx(180_237, abs=1)
    assert a.busy_frac == pytest.approx(0.986, abs=1e-3)
    assert a.launches == 1259 and k.kernels[0].category == "gemm" and k.kernels[0].op == "aten::mm"
    assert a.tflops == pytest.approx(497.2, abs=0.1)  # attributed FLOPs ÷ the device span
    assert not [x for x in k.kernels if x.name.startswith("Optimizer.")]  # annotations are no kernels
    # GPU-bound: neither launch-bound nor "waiting for input" (the host blocks on a full queue)
    assert [(h.id, h.severity) for h in job.hints] == [("attention_flops_note", "info")]


def test_small_gpt_on_h200_is_launch_bound() -> None:
    _, job, r = replay("small")
    f = r.flops
    assert f.model_flops_per_step == gpt_model_flops(4, 256, 4, 256, 8192) == 35_433_480_192
    assert f.mfu == pytest.approx(0.00404, abs=5e-5)
    a = r.kernels.anatomy
    assert (a.step_basis, a.launches, a.short_kernels) == ("host", 275, 235)
    assert a.busy_frac_typical == pytest.approx(0.169, abs=1e-3)
    assert r.telemetry.device["gpu_util"] == 19.0
    hints = {h.id: h for h in job.hints}
    assert hints["launch_bound"].severity == "critical"
    assert hints["launch_bound"].evidence["short_kernel_pct"] == pytest.approx(100 * 235 / 275)
    assert hints["input_wait"].evidence["device_idle_pct"] == 81.0  # 100 − GPU-Util


def test_gzip_recordings_read_like_plain_ones(tmp_path: Path) -> None:
    plain = tmp_path / "run.rec"
    plain.write_bytes(gzip.decompress((DATA / "h200-gpt-small.rec.gz").read_bytes()))
    frames = list(read_recording(plain))
    assert frames == list(read_recording(DATA / "h200-gpt-small.rec.gz")) and len(frames) > 1000
    # a compressed recording cut short keeps what came before the cut
    cut = tmp_path / "cut.rec.gz"
    cut.write_bytes((DATA / "h200-gpt-small.rec.gz").read_bytes()[:60_000])
    partial = list(read_recording(cut))
    assert 0 < len(partial) < len(frames) and partial == frames[:len(partial)]
    bad = tmp_path / "bad.rec.gz"
    bad.write_bytes(b"\x1f\x8bnot really gzip")
    with pytest.raises(RecordingError):
        list(read_recording(bad))
