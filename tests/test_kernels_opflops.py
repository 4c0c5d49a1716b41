"""FLOP formulas from operator names and recorded input shapes (the one table, on the monitor)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from flowtop.monitor.kernels.opflops import COMPOSITE_OPS, FORMULA_OPS, op_flops, parse_concrete
from probe.kernels.records import might_have_formula

FIXTURE = Path(__file__).parent / "data" / "h200-gpt-small-step.trace.json.gz"

# (name, input dims, concrete inputs as the profiler API gives them, expected FLOPs)
CASES = [
    ("aten::mm", [[8192, 1024], [1024, 256]], None, 2 * 8192 * 1024 * 256),
    ("aten::addmm", [[128], [32, 64], [64, 128], [], []], None, 2 * 32 * 64 * 128),
    ("aten::bmm", [[2, 3, 4], [2, 4, 5]], None, 2 * 2 * 3 * 4 * 5),
    ("aten::baddbmm", [[2, 3, 5], [2, 3, 4], [2, 4, 5], [], []], None, 2 * 2 * 3 * 4 * 5),
    ("aten::mv", [[6, 7], [7]], None, 2 * 6 * 7),
    ("aten::dot", [[9], [9]], None, 18),
    ("aten::matmul", [[3, 4, 5], [5, 6]], None, 2 * 3 * 4 * 5 * 6),
    ("aten::matmul", [[5], [5, 6]], None, 2 * 5 * 6),
    ("aten::linear", [[4, 256, 256], [768, 256], []], None, 2 * 1024 * 768 * 256),
    ("aten::linear_backward", [[4, 10], [4, 6], [6, 10], []], [None, None, None, [True, False, True]], 2 * 4 * 6 * 10),
    # conv2d 3->8, 3x3, stride 2, padding 1 on 16x16: output 8x8
    ("aten::convolution", [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], [], [], []],
     [None, None, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1], 2 * (2 * 8 * 8 * 8) * (3 * 3 * 3)),
    ("aten::_convolution", [[1, 4, 10], [6, 2, 3], [], [], [], [], [], [], []],
     [None, None, None, [1], [0], [1], False, [0], 2], 2 * (1 * 6 * 8) * (2 * 3)),
    ("aten::convolution", [[1, 4, 5, 5], [4, 2, 3, 3], [], [], [], [], [], [], []],
     [None, None, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1], 2 * (4 * 5 * 5) * (2 * 3 * 3)),
    ("aten::convolution", [[2, 3, 16, 16], [8, 3, 3, 3], [8]], None, None),  # no stride/padding known
    ("aten::convolution_backward", [[2, 8, 8, 8], [2, 3, 16, 16], [8, 3, 3, 3]] + [[]] * 8,
     [None, None, None, [8], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]], 2 * 2 * 1024 * 27),
    ("aten::convolution_backward", [[2, 8, 8, 8], [2, 3, 16, 16], [8, 3, 3, 3]] + [[]] * 8,
     [None, None, None, [8], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]], 2 * 1024 * 27),
    # attention (B, H, S, D) = (4, 4, 256, 64): forward 4·B·H·S²·D, fused backward 2.5 × forward
    ("aten::_scaled_dot_product_cudnn_attention", [[4, 4, 256, 64]] * 3 + [[]] * 6, None, 4 * 4 * 4 * 256 * 256 * 64),
    ("aten::_scaled_dot_product_cudnn_attention_backward", [[4, 4, 256, 64]] * 5 + [[4, 4, 256, 1]] + [[]] * 10, None,
     10 * 4 * 4 * 256 * 256 * 64),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", [[2, 4, 8, 16]] * 3, None, 4 * 2 * 4 * 8 * 8 * 16),
    ("aten::_flash_attention_forward", [[2, 8, 4, 16], [2, 6, 4, 16], [2, 6, 4, 32]], None, 2 * 2 * 4 * 8 * 6 * (16 + 32)),
    ("aten::_efficient_attention_backward", [[2, 8, 4, 16]] * 4, None, 2.5 * 4 * 2 * 4 * 8 * 8 * 16),
    ("aten::_flash_attention_forward", [[64, 4, 16]] * 3, None, None),  # varlen: lengths unknown
    ("aten::scaled_dot_product_attention", [[4, 4, 256, 64]] * 3, None, 4 * 4 * 4 * 256 * 256 * 64),
    ("aten::add", [[4, 4], [4, 4]], None, None),
    ("aten::mm", [[4]], None, None),  # malformed: never raises
    # hostile shapes and inputs (a foreign trace, a wire-valid message): None, never an exception
    ("aten::convolution", [[2, 3, 16, 16], [8, 3, 3, 3], [8]],
     [None, None, None, [0, 0], [1, 1], [1, 1], False], None),  # stride 0
    ("aten::mm", [[10**200, 10**200], [10**200, 10**200]], None, None),  # inf
    ("aten::mm", [[10**400, 2], [2, 2]], None, None),  # too large for a float
    ("aten::mm", {"a": 1}, None, None),
    ("aten::mm", [[-4, 3], [3, 5]], None, None),  # negative FLOPs
]


@pytest.mark.parametrize(("name", "dims", "concrete", "expected"), CASES)
def test_formula(name: str, dims: list, concrete: list | None, expected: float | None) -> None:
    assert op_flops(name, dims, concrete) == expected


def test_probe_sends_shapes_of_every_formula_operator() -> None:
    """The probe's cheap name test admits every operator with a formula, and filters the rest."""
    assert all(might_have_formula(name) for name in FORMULA_OPS | COMPOSITE_OPS)
    others = ("aten::add", "aten::copy_", "aten::relu", "aten::layer_norm", "aten::_softmax", "aten::empty",
              "aten::view", "aten::t", "aten::fill_", "AddmmBackward0", "aten::mul")
    assert not [name for name in others if might_have_formula(name)]


def test_chrome_string_inputs() -> None:
    assert [parse_concrete(v) for v in ("", "1", "0.", "True", "[2, 2]", "[]", "x", None, [1])] == [
        None, 1, 0.0, True, [2, 2], [], None, None, [1]]
    dims = [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], [], [], []]
    chrome = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    assert op_flops("aten::convolution", dims, chrome) == 2 * (2 * 8 * 8 * 8) * 27


def test_every_fixture_operator_has_flops() -> None:
    """Every operator call of the H200 trace with a formula gets FLOPs from its recorded inputs."""
    trace = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    seen = 0
    for e in trace["traceEvents"]:
        if e.get("cat") != "cpu_op" or e["name"] not in FORMULA_OPS | COMPOSITE_OPS:
            continue
        args = e["args"]
        chrome = op_flops(e["name"], args["Input Dims"], args.get("Concrete Inputs"))
        assert chrome is not None and chrome > 0
        # the probe sends concrete inputs as Python values: the same FLOPs
        concrete = [parse_concrete(v) for v in args.get("Concrete Inputs", [])]
        assert op_flops(e["name"], args["Input Dims"], concrete) == chrome
        seen += 1
    # 51 mm, 4 + 4 fused attention (fwd, bwd), 34 linear, 17 matmul, 8 scaled_dot_product_attention
    assert seen == 51 + 8 + 34 + 17 + 8
