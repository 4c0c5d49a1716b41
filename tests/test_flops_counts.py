"""StepFlopCounter on matmul/conv models: exact hand-derived FLOPs, robustness, dtype."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from probe.flops import counter as flops_mod
from probe.flops.count import FlopCount
from probe.flops.counter import StepFlopCounter, dtype_label
from probe.flops.formulas import is_heavy_op_name
from flop_helpers import count  # noqa: E402  (tests/ is on sys.path via conftest)




def test_mlp_exact_and_matches_torch_flop_counter() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)  # input needs no grad: layer 1 computes no input gradient

    result = count(lambda: model(x).sum().backward(), root=model)

    # forward: 2·3·8·16 = 768 (layer 1) + 2·3·16·4 = 384 (layer 2) = 1152
    # backward: layer 2 input grad 384 + weight grad 384; layer 1 weight grad only 768
    assert result.model_flops == 1152 + 384 + 384 + 768 == 2688
    assert result.executed_flops == 2688
    assert result.by_op == {"aten.addmm": 1152, "aten.mm": 1536}
    assert result.uncounted == {}
    assert result.micro_batches == 1
    assert result.dtype == "fp32"
    assert result.attention_convention == "full"
    assert result.cost_s > 0

    # torch's own counter agrees on plain matmuls (it differs on attention, see other tests)
    with FlopCounterMode(display=False) as reference:
        model(x).sum().backward()
    assert reference.get_total_flops() == result.executed_flops


def test_conv_net_exact() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),  # (2,3,8,8) -> (2,8,8,8)
        nn.Conv2d(8, 4, 3, stride=2, padding=1), nn.ReLU(),  # -> (2,4,4,4)
        nn.Flatten(), nn.Linear(64, 10),
    )
    x = torch.randn(2, 3, 8, 8)

    result = count(lambda: model(x).sum().backward())

    conv1 = 2 * 8 * 8 * 8 * 3 * 3 * 3 * 2  # 2·Cout·Hout·Wout·Cin·kh·kw·B = 55296
    conv2 = 2 * 4 * 4 * 4 * 8 * 3 * 3 * 2  # = 18432
    linear = 2 * 2 * 64 * 10  # = 2560
    forward = conv1 + conv2 + linear
    # backward: linear and conv2 need input and weight grads (2×); conv1's input needs none (1×)
    backward = 2 * linear + 2 * conv2 + conv1
    assert result.model_flops == result.executed_flops == forward + backward == 173568
    assert result.by_op == {"aten.convolution": forward - linear, "aten.convolution_backward": 2 * conv2 + conv1,
                            "aten.addmm": linear, "aten.mm": 2 * linear}


def test_grouped_and_transposed_conv() -> None:
    grouped = nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False)  # weight (8, 2, 3, 3)
    transposed = nn.ConvTranspose2d(8, 2, 2, stride=2, bias=False)  # weight (8, 2, 2, 2)
    x = torch.randn(1, 8, 3, 3)

    result = count(lambda: transposed(grouped(x)))

    grouped_flops = 2 * (1 * 8 * 3 * 3) * (2 * 3 * 3)  # 2·out elements·(Cin/groups)·kh·kw = 2592
    transposed_flops = 2 * (1 * 8 * 3 * 3) * (2 * 2 * 2)  # 2·input elements·Cout·kh·kw = 1152
    assert result.model_flops == grouped_flops + transposed_flops == 3744


def test_lora_like_frozen_base_needs_no_weight_gradient() -> None:
    torch.manual_seed(0)
    n, d, r = 6, 16, 2

    class LoRALinear(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = nn.Linear(d, d, bias=False).requires_grad_(False)
            self.a = nn.Linear(d, r, bias=False)
            self.b = nn.Linear(r, d, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.b(self.a(x))

    emb = nn.Embedding(10, d).requires_grad_(False)  # frozen embedding: output needs no grad
    layers = nn.Sequential(LoRALinear(), LoRALinear())
    idx = torch.randint(0, 10, (n,))

    result = count(lambda: layers(emb(idx)).sum().backward())

    base, lora = 2 * n * d * d, 2 * n * d * r  # one matmul each of base and of a (= of b)
    forward = 2 * (base + 2 * lora)
    # layer 1 (input needs no grad): a weight grad, b weight + input grad; base nothing
    layer1 = lora + 2 * lora
    # layer 2: base input grad only (frozen), a and b both weight + input grads
    layer2 = base + 2 * lora + 2 * lora
    assert result.model_flops == result.executed_flops == forward + layer1 + layer2 == 13440


def test_gradient_accumulation_is_four_times_one_micro_batch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    batches = [torch.randn(4, 8) for _ in range(4)]

    one = count(lambda: model(batches[0]).pow(2).mean().backward(), root=model)

    def four() -> None:
        for xb in batches:
            (model(xb).pow(2).mean() / 4).backward()

    accumulated = count(four, root=model)
    assert accumulated.model_flops == 4 * one.model_flops == 4 * (3 * 2 * 4 * 8 * 32 * 2 - 2 * 4 * 8 * 32)
    assert accumulated.executed_flops == 4 * one.executed_flops
    assert (one.micro_batches, accumulated.micro_batches) == (1, 4)


def test_heavy_ops_without_formula_are_reported_not_zeroed() -> None:
    signal = torch.randn(64)
    a, b = torch.randn(4), torch.randn(5)

    result = count(lambda: (torch.fft.rfft(signal), torch.outer(a, b), signal.sin()))

    assert result.uncounted == {"aten._fft_r2c": 1}
    assert result.model_flops == 0  # outer is elementwise (mul), sin is elementwise: not counted
    assert is_heavy_op_name("aten::_cslt_sparse_mm") and is_heavy_op_name("aten::_cudnn_rnn_flatten_weight")
    assert is_heavy_op_name("aten::_slow_conv2d_backward")
    assert not is_heavy_op_name("aten::convert_element_type") and not is_heavy_op_name("aten::embedding")
    assert not is_heavy_op_name("aten::upsample_linear1d") and not is_heavy_op_name("aten::gelu")


@pytest.mark.parametrize("fused", [True, False])
def test_lstm_is_counted_fused_or_not(fused: bool) -> None:
    """A 2-layer LSTM(32, 32) over B=4 × T=8 with a head 32 -> 64 (no bias). By hand, per token:
    a layer's gate matmuls 2 · 4h · (in + h) = 2 · 128 · 64 = 16,384 FLOPs forward, the head
    2 · 2,048 = 4,096. The fused CPU op (mkldnn) computes every gradient in its backward: 3 ×
    (2 × 16,384 + 4,096) × 32 = 3,538,944 (before: 393,216, the head alone; the LSTM uncounted).
    Unfused (matmuls of each step, counted one by one) the first step's hidden state, zeros, takes
    no gradient: 2 layers × 2 · 128 · 32 · B=4 less = 3,473,408."""
    torch.manual_seed(0)
    emb, lstm, head = nn.Embedding(50, 32), nn.LSTM(32, 32, num_layers=2), nn.Linear(32, 64, bias=False)
    ids = torch.randint(0, 50, (8, 4))

    def step() -> None:
        head(lstm(emb(ids))[0]).sum().backward()

    with torch.backends.mkldnn.flags(enabled=fused):
        result = count(step)
    assert result.uncounted == {}
    assert result.model_flops == (3_538_944 if fused else 3_473_408)


def test_inference_mode_composites_are_decomposed_and_counted() -> None:
    layer = nn.Linear(8, 4)
    with torch.inference_mode():
        result = count(lambda: layer(torch.randn(2, 8)))
    assert result.model_flops == 2 * 2 * 8 * 4


def test_failure_disables_counter_without_touching_results(monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    monkeypatch.setattr(flops_mod, "warn_once", lambda key, msg: warnings.append(key))

    def broken_formula(bound, out, causal):  # noqa: ANN001, ANN202
        raise RuntimeError("formula bug")

    monkeypatch.setitem(flops_mod.FORMULAS, "aten::mm", broken_formula)
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    counter = StepFlopCounter()
    counter.start()
    product = a @ b
    assert counter.stop() is None
    assert counter.broken and warnings == ["flops.count"]
    assert torch.equal(product, torch.mm(a, b))
    counter.start()  # stays off for good
    assert not counter.active and counter.stop() is None
    assert torch.utils._python_dispatch._get_current_dispatch_mode() is None


def test_stop_without_start_and_restart_and_other_thread() -> None:
    counter = StepFlopCounter()
    assert counter.stop() is None
    counter.start()
    counter.start()  # an unfinished window is discarded, not stacked
    torch.randn(2, 3) @ torch.randn(3, 2)
    assert counter.stop().model_flops == 2 * 2 * 3 * 2
    assert torch.utils._python_dispatch._get_current_dispatch_mode() is None

    counter.start()
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(counter.stop()))
    worker.start()
    worker.join()
    assert results == [None]  # cannot pop another thread's mode stack...
    torch.randn(2, 3) @ torch.randn(3, 2)  # ...so the mode idles (no accounting) ...
    counter.start()  # ...until the owning thread closes it
    assert counter.stop().model_flops == 0
    assert torch.utils._python_dispatch._get_current_dispatch_mode() is None


def test_unknown_convention_falls_back_to_full() -> None:
    assert StepFlopCounter(attention="triangular").attention == "full"


def test_dtype_labels_and_autocast() -> None:
    assert dtype_label(torch.float32, "cuda", "matmul", True, False) == "tf32"
    assert dtype_label(torch.float32, "cuda", "matmul", False, True) == "fp32"
    assert dtype_label(torch.float32, "cuda", "conv", False, True) == "tf32"
    assert dtype_label(torch.float32, "cpu", "matmul", True, True) == "fp32"
    assert dtype_label(torch.float8_e4m3fn, "cuda", "matmul", False, False) == "fp8_e4m3"  # probe.flops.precision
    assert dtype_label(torch.float8_e5m2, "cuda", "matmul", False, False) == "fp8_e5m2"
    assert dtype_label(torch.float16, "cuda", "matmul", True, True) == "fp16"

    layer = nn.Linear(16, 16)
    x = torch.randn(4, 16)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        y.float().sum().backward()

    result = count(step)
    assert result.dtype == "bf16"
    assert result.model_flops == 2 * 4 * 16 * 16 * 2  # forward + weight grad (x needs no grad)


def test_start_inside_root_forward_pre_hook_counts_that_micro_batch() -> None:
    model = nn.Linear(4, 4)
    counter = StepFlopCounter(root=model)
    model.register_forward_pre_hook(lambda module, args: counter.start(in_forward=True) if not counter.active else None)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
    result = counter.stop()
    assert result.micro_batches == 3
    assert result.model_flops == 3 * 2 * (2 * 2 * 4 * 4)  # 3 × (forward + weight grad)
