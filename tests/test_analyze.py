"""``flowtop analyze``: golden output on the H200 trace, ordering, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowtop.tools.analyze import main

DATA = Path(__file__).parent / "data"
TRACE = DATA / "h200-gpt-small-step.trace.json.gz"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_text_golden(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, str(TRACE))
    assert (code, err) == (0, "")
    assert out == (DATA / "analyze-h200-gpt-small-step.txt").read_text(encoding="utf-8")


def test_json_golden(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, str(TRACE), "--json")
    assert (code, err) == (0, "")
    assert out == (DATA / "analyze-h200-gpt-small-step.json").read_text(encoding="utf-8")
    doc = json.loads(out)
    assert doc["kernels_total"] == len(doc["kernels"]) == 36
    # 6·N·tokens + executed causal attention (half the square; backward 2.5 × forward)
    assert doc["anatomy"]["flops"] == 35_970_351_104 - 4 * (4 * 4 * 4 * 256 * 256 * 64) * 3.5 / 2
    assert sum(k["calls"] for k in doc["kernels"]) == doc["anatomy"]["launches"] == 208


@pytest.mark.parametrize(("sort", "first"), [
    ("calls", "vectorized_elementwise_kernel<bfloat16_copy_kernel_cuda>"),  # 35 calls
    ("mean", "multi_tensor_apply_kernel<FusedAdamMathFunctor>"),  # 84.45 µs
    ("tflops", "nvjet_sm90_tst_128x128_64x6_1x2_h_bz_NTT"),  # LM-head backward: 4.29 GFLOP in 9.09 µs
    ("time", "unrolled_elementwise_kernel<direct_copy_kernel_cuda>"),
])
def test_sort(capsys: pytest.CaptureFixture[str], sort: str, first: str) -> None:
    code, out, _ = _run(capsys, str(TRACE), "--json", "--sort", sort, "--top", "3")
    doc = json.loads(out)
    assert code == 0 and len(doc["kernels"]) == 3 and doc["kernels"][0]["short"] == first
    key = {"calls": "calls", "mean": "mean_us", "tflops": "tflops", "time": "total_us"}[sort]
    values = [k[key] for k in doc["kernels"]]
    assert values == sorted(values, reverse=True)


def test_top_in_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, str(TRACE), "--top", "2")
    table = out.split("KERNEL\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert code == 0 and len(table) == 3 and table[2] == "... 34 more (--top 0 shows all)"


@pytest.mark.parametrize("argv", [
    ["/nonexistent/trace.json"],
    ["--sort", "bogus", "x.json"],
    [],
    ["x.json", "--top", "-1"],
])
def test_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == "" and err.strip()


def test_invalid_file_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [', encoding="utf-8")
    code, out, err = _run(capsys, str(bad))
    assert code == 2 and out == "" and err.startswith("flowtop analyze: cannot read ")


def test_step_ms_gives_busy_share_of_the_unprofiled_step(capsys: pytest.CaptureFixture[str]) -> None:
    # Busy kernel + memset time on the fixture is 890.8 µs; against the 6.8 ms unprofiled step
    # of the reference step (docs/design.md) that is 13.1 %, against the 12,995 µs profiled span 6.9 %.
    assert main([str(TRACE), "--step-ms", "6.8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    anatomy = data["anatomy"]
    assert anatomy["typical_step_us"] == 6800.0
    assert anatomy["busy_frac_typical"] == pytest.approx(anatomy["busy_us"] / 6800.0, abs=1e-6)  # JSON rounds
    assert round(100 * anatomy["busy_frac_typical"], 1) == 13.1
    assert main([str(TRACE), "--step-ms", "0"]) == 2
