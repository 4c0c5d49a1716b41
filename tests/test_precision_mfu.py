"""Precision-aware MFU (issue 14 part 5): FLOPs per operand dtype, MFU against each dtype's own
peak (ideal time Σ F_d / peak_d over the step time) and the bf16-equivalent figure, fp8 labels,
peaks per dtype, and no MFU for a device the table does not know.

Real torch on the CPU: bf16 autocast beside fp32 ops, ``torch._scaled_mm`` on float8 operands
(it runs on the CPU in torch 2.13, forward only: it has no autograd formula there). Figures on
the H200 come from bench/gpu_moe_fp8.py, run on the GPU machine.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch
from torch import nn

import probe
import step_spy
from flop_helpers import count
from flowtop.monitor.accounting import job_flops, rank_flops
from probe.flops import accounting
from probe.flops.count import FlopCount
from probe.flops.peaks import lookup_peak, normalise_dtype, peak_override, resolve_peak
from probe.wire import flops_report

T = 1e12


class Mixed(nn.Module):
    """A bf16 layer (CPU autocast) feeding an fp32 layer (autocast off): x (4, 16) -> 32 -> 8."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32, bias=False)
        self.b = nn.Linear(32, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.a(x)
        with torch.autocast("cpu", enabled=False):
            return self.b(h.float())


# Hand count (x needs no gradient): a: forward 2·4·16·32 = 4,096 and its weight gradient 4,096,
# both bf16 (the gradient reaching a is cast back to bf16); b: forward 2·4·32·8 = 2,048, its input
# gradient (a's output needs one) and its weight gradient, 2,048 each, fp32.
BF16_FLOPS, FP32_FLOPS = 2 * 4_096, 3 * 2_048


def _step(model: nn.Module) -> None:
    model(torch.randn(4, 16)).square().mean().backward()


def test_mixed_bf16_fp32_step_by_dtype() -> None:
    result = count(lambda: _step(Mixed()))
    assert result.model_by_dtype == {"bf16": BF16_FLOPS, "fp32": FP32_FLOPS}
    assert result.executed_by_dtype == {"bf16": BF16_FLOPS, "fp32": FP32_FLOPS}
    assert result.model_flops == BF16_FLOPS + FP32_FLOPS == 14_336
    assert result.dtype == "bf16"  # the FLOP-weighted majority


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    monkeypatch.setenv("FLOWTOP_PEAK_TFLOPS", "bf16=2,fp32=0.5")  # a known peak per dtype
    yield from _attached(monkeypatch)


def test_mfu_against_each_dtypes_peak_override(captured: list[tuple[str, dict[str, Any]]]) -> None:
    model = Mixed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        _step(model)
        opt.step()
        opt.zero_grad()
    (msg,) = [f for k, f in captured if k == "flops"]
    assert msg["flops_by_dtype"] == {"bf16": [BF16_FLOPS, BF16_FLOPS], "fp32": [FP32_FLOPS, FP32_FLOPS]}
    assert msg["peak_by_dtype"] == {"bf16": 2 * T, "fp32": 0.5 * T}
    view = rank_flops(flops_report(msg), step_time_s=1e-6)
    # ideal time = 8,192 / 2e12 + 6,144 / 0.5e12 = 4.096 ns + 12.288 ns = 16.384 ns; over 1 µs
    assert view.mfu == pytest.approx(0.016384, rel=1e-12)
    assert view.hfu == pytest.approx(0.016384, rel=1e-12)
    # bf16-equivalent: 14,336 FLOPs / 1 µs / 2e12
    assert view.mfu_bf16 == pytest.approx(0.007168, rel=1e-12)
    # the mix peak F / Σ F_d/peak_d = 14,336 / 16.384 ns
    assert view.peak_flops == pytest.approx(14_336 / 16.384e-9)
    assert view.precision.shares == pytest.approx({"bf16": 8 / 14, "fp32": 6 / 14})
    # two such ranks, the second twice as slow: Σ FLOP/s ÷ Σ mix peaks
    slow = rank_flops(flops_report(msg), step_time_s=2e-6)
    job = job_flops([view, slow])
    assert job.mfu == pytest.approx((0.016384 + 0.008192) / 2)
    assert job.mfu_bf16 == pytest.approx((0.007168 + 0.003584) / 2)
    # the monitor's --peak-tflops replaces every dtype's peak: one figure for the whole step
    flat = rank_flops(flops_report(msg), step_time_s=1e-6, peak_override=1 * T)
    assert flat.mfu == pytest.approx(14_336 / 1e-6 / T) and flat.mfu_bf16 == flat.mfu


def _count_mixed() -> FlopCount:
    return count(lambda: _step(Mixed()))


def test_mfu_per_dtype_against_the_h200_table() -> None:
    msg = accounting.flops_message(_count_mixed(), step=2, tokens=0, root=None, signature=(),
                                   device=torch.device("cuda"), device_name="NVIDIA H200",
                                   flops_per_token=None, attention="full")
    assert msg["peak_by_dtype"] == {"bf16": 989.4 * T, "fp32": 66.9 * T}
    view = rank_flops(flops_report(msg), step_time_s=1e-6)
    ideal = BF16_FLOPS / (989.4 * T) + FP32_FLOPS / (66.9 * T)
    assert view.mfu == pytest.approx(ideal / 1e-6, rel=1e-12)
    assert view.mfu_bf16 == pytest.approx(14_336 / 1e-6 / (989.4 * T), rel=1e-12)
    assert view.mfu > view.mfu_bf16  # the fp32 FLOPs' low peak: the bf16-equivalent understates


def test_unknown_device_gets_no_mfu_with_a_reason() -> None:
    msg = accounting.flops_message(_count_mixed(), step=2, tokens=0, root=None, signature=(),
                                   device=torch.device("cuda"), device_name="NVIDIA Z9000",
                                   flops_per_token=None, attention="full")
    assert msg["peak_flops"] is None and msg["peak_by_dtype"] == {}
    assert "no peak-table entry for device 'NVIDIA Z9000'" in msg["peak_source"]
    view = rank_flops(flops_report(msg), step_time_s=1e-6)
    assert view.mfu is None and view.hfu is None and view.mfu_bf16 is None and view.peak_flops is None
    assert "no dense peak for bf16 (57.1% of model FLOPs), fp32 (42.9% of model FLOPs)" in view.mfu_reason
    assert "(unknown: no peak-table entry for device 'NVIDIA Z9000'" in view.mfu_reason  # what the rank said of its peak
    # an older probe (no per-dtype fields): the single-peak path says why, no guess either
    old = {k: v for k, v in msg.items() if k not in ("flops_by_dtype", "peak_by_dtype")}
    view = rank_flops(flops_report(old), step_time_s=1e-6)
    assert view.mfu is None and "no peak-table entry" in view.mfu_reason
    # a known device lacking one dtype's peak: A100 has no fp8
    peak, reason = lookup_peak("NVIDIA A100-SXM4-80GB", "fp8_e4m3")
    assert peak is None and "no dense fp8 peak" in reason


def _fp8(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def test_scaled_mm_is_labelled_by_its_fp8_formats() -> None:
    one = torch.tensor(1.0)
    x, w = _fp8((16, 32), torch.float8_e4m3fn), _fp8((64, 32), torch.float8_e4m3fn).t()
    g = _fp8((16, 32), torch.float8_e5m2)
    res = count(lambda: torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    assert res.model_by_dtype == {"fp8_e4m3": 2 * 16 * 32 * 64}
    # a gradient GEMM of the hybrid recipe: e5m2 × e4m3 is named by its e5m2 operand
    res = count(lambda: torch._scaled_mm(g, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    assert res.model_by_dtype == {"fp8_e5m2": 2 * 16 * 32 * 64}


def test_fp8_and_bf16_mix_against_hopper_peaks() -> None:
    one = torch.tensor(1.0)
    x, w = _fp8((64, 128), torch.float8_e4m3fn), _fp8((256, 128), torch.float8_e4m3fn).t()
    a, b = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(128, 64, dtype=torch.bfloat16)

    def step() -> None:
        torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # 2·64·128·256
        a @ b  # 2·64·128·64

    fp8, bf16 = 2 * 64 * 128 * 256, 2 * 64 * 128 * 64
    res = count(step)
    assert res.model_by_dtype == {"fp8_e4m3": fp8, "bf16": bf16}
    msg = accounting.flops_message(res, step=2, tokens=0, root=None, signature=(), device=torch.device("cuda"),
                                   device_name="NVIDIA H100 80GB HBM3", flops_per_token=None, attention="full")
    assert msg["peak_by_dtype"] == {"fp8_e4m3": 1978.9 * T, "bf16": 989.4 * T}
    view = rank_flops(flops_report(msg), step_time_s=1e-6)
    assert view.mfu == pytest.approx((fp8 / (1978.9 * T) + bf16 / (989.4 * T)) / 1e-6, rel=1e-12)
    assert view.mfu_bf16 == pytest.approx((fp8 + bf16) / 1e-6 / (989.4 * T), rel=1e-12)
    assert view.mfu_bf16 > view.mfu  # fp8 work against the bf16 peak overstates: why both are shown


def test_peak_table_conventions_for_fp8_labels_and_new_rows() -> None:
    assert normalise_dtype("fp8_e4m3") == normalise_dtype("fp8_e5m2") == normalise_dtype("float8_e5m2") == "fp8"
    for name, bf16, fp8 in (("NVIDIA H800", 989.4, 1978.9), ("NVIDIA GB200", 2500.0, 5000.0),
                            ("NVIDIA B100", 1750.0, 3500.0), ("NVIDIA B200", 2250.0, 4500.0),
                            ("NVIDIA H200", 989.4, 1978.9)):
        assert lookup_peak(name, "bf16")[0].flops == pytest.approx(bf16 * T), name
        assert lookup_peak(name, "fp8_e4m3")[0].flops == pytest.approx(fp8 * T), name
        assert fp8 == pytest.approx(2 * bf16, rel=1e-4)  # dense fp8 = 2 × dense bf16 (datasheet rounding)
    env = {"FLOWTOP_PEAK_TFLOPS": "bf16=100, fp8=200"}
    assert peak_override(env, "bf16") == 100 * T and peak_override(env, "fp8_e5m2") == 200 * T
    assert peak_override(env, "fp32") is None
    assert resolve_peak("NVIDIA H200", "fp32", env)[0].flops == 66.9 * T  # unnamed: the table's
    assert resolve_peak("NVIDIA H200", "bf16", env)[0].source.startswith("override")
    peak, reason = resolve_peak("NVIDIA H200", "bf16", {"FLOWTOP_PEAK_TFLOPS": "bf16=fast"})
    assert peak is None and "FLOWTOP_PEAK_TFLOPS" in reason


E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


class Fp8Matmul(torch.autograd.Function):
    """``x @ w.T`` the way torchao's Float8Linear trains it (the hybrid recipe), unit scales:
    forward e4m3 × e4m3; both gradient GEMMs e5m2 (the gradient) × e4m3. ``_scaled_mm`` runs on
    the CPU in torch 2.13 but has no autograd formula there, hence this Function."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        one = torch.tensor(1.0)
        # _scaled_mm takes a row-major first and a column-major second operand
        return torch._scaled_mm(x.to(E4M3), w.to(E4M3).t(), scale_a=one, scale_b=one, out_dtype=x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        x, w = ctx.saved_tensors
        one, g8 = torch.tensor(1.0), g.to(E5M2)
        gx = None
        if ctx.needs_input_grad[0]:  # (M, N) @ (N, K)
            gx = torch._scaled_mm(g8, w.to(E4M3).t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=x.dtype)
        # (N, M) @ (M, K)
        gw = torch._scaled_mm(g8.t().contiguous(), x.to(E4M3).t().contiguous().t(), scale_a=one, scale_b=one,
                              out_dtype=w.dtype)
        return gx, gw


class Fp8Model(nn.Module):
    """x (16, 16) -> a bf16-autocast linear -> 32 -> an fp8 linear -> 64."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32, bias=False)
        self.w = nn.Parameter(torch.randn(64, 32) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.a(x)
        return Fp8Matmul.apply(h, self.w)


# Hand count, M = 16 rows (x needs no gradient): a, bf16: forward 2·16·16·32 = 16,384 and its
# weight gradient 16,384; the fp8 GEMM (K 32, N 64): forward 2·16·32·64 = 65,536 in e4m3, its input
# and weight gradients 65,536 each in e5m2 (named by the e5m2 operand).
FP8_BF16, FP8_E4M3, FP8_E5M2 = 2 * 16_384, 65_536, 2 * 65_536


@pytest.fixture
def captured_fp8(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    monkeypatch.setenv("FLOWTOP_PEAK_TFLOPS", "bf16=2,fp8=4")  # fp8 at twice bf16, as on Hopper
    yield from _attached(monkeypatch)


def _attached(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    monkeypatch.setenv("FLOWTOP_ADDR", "tcp://127.0.0.1:1")
    out: list[tuple[str, dict[str, Any]]] = []
    assert probe.attach(job="t")
    step_spy.spy(probe._current(), out)
    try:
        yield out
    finally:
        probe.detach()


def test_fp8_training_step_through_the_probe(captured_fp8: list[tuple[str, dict[str, Any]]]) -> None:
    """Issue 14 part 5 on the CPU: a training loop under probe.attach whose step runs a float8
    GEMM forward and backward beside a bf16 layer. The counted step carries each GEMM's operand
    dtype, the peaks per dtype, and MFU = Σ F_d / peak_d over the step time, by hand."""
    torch.manual_seed(0)
    model = Fp8Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(16, 16)).float().square().mean().backward()
        opt.step()
        opt.zero_grad()
    (msg,) = [f for k, f in captured_fp8 if k == "flops"]
    assert msg["flops_by_dtype"] == {"bf16": [FP8_BF16] * 2, "fp8_e4m3": [FP8_E4M3] * 2, "fp8_e5m2": [FP8_E5M2] * 2}
    assert msg["model_flops"] == FP8_BF16 + FP8_E4M3 + FP8_E5M2 == 229_376
    assert msg["dtype"] == "fp8_e5m2"  # the FLOP-weighted majority
    assert msg["peak_by_dtype"] == {"bf16": 2 * T, "fp8_e4m3": 4 * T, "fp8_e5m2": 4 * T}
    view = rank_flops(flops_report(msg), step_time_s=1e-6)
    # ideal time = 32,768 / 2e12 + 196,608 / 4e12 = 16.384 ns + 49.152 ns = 65.536 ns; over 1 µs
    assert view.mfu == pytest.approx(0.065536, rel=1e-12)
    # bf16-equivalent: 229,376 FLOPs / 1 µs / 2e12 = 11.4688 %: the fp8 work read at the bf16 rate
    assert view.mfu_bf16 == pytest.approx(0.114688, rel=1e-12)
    assert view.precision.shares == pytest.approx({"bf16": 1 / 7, "fp8_e4m3": 2 / 7, "fp8_e5m2": 4 / 7})
    assert view.peak_flops == pytest.approx(229_376 / 65.536e-9)  # the mix peak F / Σ F_d/peak_d
