"""FLOP formulas from operator names and recorded input shapes (monitor table and probe mirror)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from flowtop.kernels import opflops
from flowtop.kernels.opflops import COMPOSITE_OPS, FORMULA_OPS, op_flops, parse_concrete
from probe import kernels as probe_kernels

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
]


@pytest.mark.parametrize(("name", "dims", "concrete", "expected"), CASES)
def test_formula(name: str, dims: list, concrete: list | None, expected: float | None) -> None:
    assert op_flops(name, dims, concrete) == expected


@pytest.mark.parametrize(("name", "dims", "concrete", "expected"), CASES)
def test_probe_mirror_agrees(name: str, dims: list, concrete: list | None, expected: float | None) -> None:
    assert probe_kernels.op_flops(name, dims, concrete) == expected


def test_probe_mirror_covers_the_same_operators() -> None:
    assert set(probe_kernels._F) == FORMULA_OPS
    assert set(probe_kernels._C) == COMPOSITE_OPS


def test_chrome_string_inputs() -> None:
    assert [parse_concrete(v) for v in ("", "1", "0.", "True", "[2, 2]", "[]", "x", None, [1])] == [
        None, 1, 0.0, True, [2, 2], [], None, None, [1]]
    dims = [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], [], [], []]
    chrome = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    assert op_flops("aten::convolution", dims, chrome) == 2 * (2 * 8 * 8 * 8) * 27


def test_every_fixture_operator_agrees_between_monitor_and_probe() -> None:
    """Every operator call of the H200 trace with a formula, through both tables."""
    trace = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    seen = 0
    for e in trace["traceEvents"]:
        if e.get("cat") != "cpu_op" or e["name"] not in FORMULA_OPS | COMPOSITE_OPS:
            continue
        args = e["args"]
        concrete = [opflops.parse_concrete(v) for v in args.get("Concrete Inputs", [])]
        mine = op_flops(e["name"], args["Input Dims"], args.get("Concrete Inputs"))
        assert mine is not None and mine > 0
        assert probe_kernels.op_flops(e["name"], args["Input Dims"], concrete) == mine
        seen += 1
    # 51 mm, 4 + 4 fused attention (fwd, bwd), 34 linear, 17 matmul, 8 scaled_dot_product_attention
    assert seen == 51 + 8 + 34 + 17 + 8
