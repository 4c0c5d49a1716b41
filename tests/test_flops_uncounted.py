"""Uncounted ops weighed by their share of the step (issue 14 part 6): FLOP-like sizes from shapes
(probe/flops/uncounted.py), carried on the wire, and the ``uncounted_ops`` hint that fires only when
they matter. Real torch steps, the probe's counter and message, the monitor's FlopsView and hints."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from flop_helpers import count
from flowtop.monitor.accounting import rank_flops
from flowtop.monitor.hints import HintEngine
from probe import wire
from probe.flops.accounting import flops_message
from probe.flops.uncounted import flop_like_size
from test_hints_factories import job, rank

# MLP 64 -> 256 -> 64 on a (32, 64) input that needs no gradient. Forward 2·32·64·256 per layer;
# backward: layer 2 input + weight gradients (2 × forward), layer 1 the weight gradient only.
FWD = 2 * 32 * 64 * 256
MLP_MODEL_FLOPS = 2 * FWD + 2 * FWD + FWD


def test_sizes_by_hand() -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert flop_like_size("aten.my_gemm", (a, b), {}, a @ b) == 2 * 8 * 16 * 4  # exact for a 2-D matmul
    x = torch.randn(1024)
    assert flop_like_size("aten._fft_r2c", (x, [0], 0, True), {}, torch.fft.rfft(x)) == 5 * 1024 * 10
    m = torch.randn(3, 5, 5)
    assert flop_like_size("aten._linalg_solve_ex", (m, torch.randn(3, 5, 1)), {}, None) == 3 * 5 * 5 * 5
    assert flop_like_size("aten.some_heavy_unary", (x,), {}, x) == 2 * 1024  # elementwise: in + out
    assert flop_like_size("aten.anything", (object(),), {}, None) == 0  # nothing to size: never raises


def _mlp_step(extra) -> tuple[dict, object]:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    x = torch.randn(32, 64)

    def step() -> None:
        model(x).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # linalg_vector_norm: no model FLOPs
        extra()

    c = count(step, root=model)
    fields = flops_message(c, step=1, tokens=0, root=model, signature=(), device=torch.device("cpu"),
                           device_name="cpu", flops_per_token=None, attention="full")
    key = wire.RankKey("j", "h", 1, 0, 0)
    msg = wire.decode(wire.encode("flops", key, 1, time.time(), fields)).fields  # as the monitor gets it
    view = rank_flops(wire.flops_report(msg), 0.1)
    snap = job(rank(0, fl=view), fl=view)
    engine = HintEngine()
    engine.evaluate(snap, 0.0)
    hints = [h for h in engine.evaluate(snap, 30.0) if h.id == "uncounted_ops"]
    return msg, hints


def test_clip_norm_and_a_tiny_solve_raise_no_understated_hint() -> None:
    msg, hints = _mlp_step(lambda: torch.linalg.solve(torch.eye(4) + 0.1, torch.ones(4, 1)))
    assert msg["model_flops"] == MLP_MODEL_FLOPS == 5_242_880
    assert "aten.linalg_vector_norm" not in msg["uncounted"]
    assert msg["uncounted"]["aten._linalg_solve_ex"] == 1  # listed, by name ...
    assert msg["uncounted_size"]["aten._linalg_solve_ex"] == 4 * 4 * 4  # ... sized m·n·min(m, n)
    assert hints == []  # ... and weighed: 65 / 5.2 M FLOPs is no reason to call MFU understated


def test_a_large_fft_is_named_with_its_share() -> None:
    big = torch.randn(64, 4096)
    msg, hints = _mlp_step(lambda: torch.fft.rfft(big))
    n = 64 * 4096
    size = 5 * n * math.ceil(math.log2(n))  # 23,592,960
    assert msg["uncounted_size"] == {"aten._fft_r2c": size}
    (hint,) = hints
    share = 100.0 * size / (MLP_MODEL_FLOPS + size)  # 81.8 %
    assert hint.evidence["uncounted_pct"] == share and hint.evidence["share_basis"] == "flop_size"
    assert hint.summary == ("the FLOP count misses 1 op type(s) (aten._fft_r2c ×1), ≈81.8 % of the step's "
                            "FLOPs (a size bound from shapes): MFU is understated")


def test_without_sizes_the_kernel_time_of_their_operators_weighs_them() -> None:
    """An older probe sends no sizes: the share is then the kernel time of the operators (profiler
    rows "aten::x" vs the probe's "aten.x"), and unknown (100, fires as before) without a window."""
    from test_hints_factories import flops, kwin

    fl = flops(uncounted={"aten.my_custom_op": 2})
    small = kwin([("gemm_kernel", 10, 9_960.0, "aten::mm"), ("custom_kernel", 2, 40.0, "aten::my_custom_op")])
    big = kwin([("gemm_kernel", 10, 9_000.0, "aten::mm"), ("custom_kernel", 2, 1_000.0, "aten::my_custom_op")])

    def hint(kernels):  # type: ignore[no-untyped-def]
        snap = job(rank(0, fl=fl, kernels=kernels), fl=fl)
        engine = HintEngine()
        engine.evaluate(snap, 0.0)
        return [h for h in engine.evaluate(snap, 30.0) if h.id == "uncounted_ops"]

    assert hint(small) == []  # 40 of 10,000 µs: 0.4 %
    (h,) = hint(big)
    assert (h.evidence["uncounted_pct"], h.evidence["share_basis"]) == (10.0, "kernel_time")
    assert "≈10.0 % of kernel time" in h.summary
    (h,) = hint(None)
    assert (h.evidence["uncounted_pct"], h.evidence["share_basis"]) == (100.0, "unknown")  # as before sizes
    assert h.summary == "the FLOP count misses 1 op type(s) (aten.my_custom_op ×2): MFU is understated"
