"""flowtop.tools.ncu: Nsight Compute raw CSV parsing and hardware FLOP arithmetic."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import pytest

from flowtop.tools.ncu import FP_METRICS, TENSOR_METRICS, NcuParseError, parse_raw_csv

FIXTURE = Path(__file__).parent / "data" / "h200-ncu-gemm4096-bf16.raw.csv.gz"
NVTX_COL = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"


def make_csv(metrics: dict[str, str], rows: list[dict[str, str]], preamble: str = "",
             extra_ids: tuple[str, ...] = ()) -> str:
    """A raw-page CSV as ncu writes it: quoted cells, header row, units row, one row per launch."""
    ids = ["ID", "Process ID", "Process Name", *extra_ids, "Kernel Name", "Device"]
    header = ids + list(metrics)
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(header)
    w.writerow([""] * len(ids) + list(metrics.values()))
    for i, row in enumerate(rows):
        base = {"ID": str(i), "Process ID": "77", "Process Name": "python3", "Kernel Name": "k",
                "Device": "0"}
        base.update(row)
        w.writerow([base.get(h, "0") for h in header])
    return preamble + buf.getvalue()


def test_fixture_gemm_tensor_flops_are_exactly_2mnk() -> None:
    kernels = parse_raw_csv(gzip.open(FIXTURE, "rt").read())
    assert len(kernels) == 2
    for k in kernels:
        assert k.name == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
        assert k.tensor_flops == 2 * 4096**3 == 137_438_953_472
        assert dict(k.tensor_by_src)["bf16_dst_fp32"] == 137_438_953_472
        # the roofline set has only per-cycle rates for SASS FP instructions, not counts
        assert k.fp_flops is None
        assert k.hw_flops == 137_438_953_472
        assert k.process_id == 525 and k.device == 0 and k.nvtx == ()
    assert [k.id for k in kernels] == [0, 1]
    assert kernels[0].duration_ns == 174_560.0 and kernels[1].duration_ns == 173_888.0


def test_fp_instruction_weights_thousands_separators_and_preamble() -> None:
    metrics = {m: "inst" for m in FP_METRICS}
    metrics["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed"] = "inst/cycle"
    metrics["gpu__time_duration.sum"] = "usecond"
    row = {
        "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": "1,000",
        "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": "2,000",
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "3,000,000",
        "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum": "10",
        "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum": "5",
        "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum": "7",
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed": "9,999.5",
        "gpu__time_duration.sum": "12.50",
    }
    text = make_csv(metrics, [row], preamble="==PROF== Connected to process 77\n")
    (k,) = parse_raw_csv(text + "==PROF== Disconnected from process 77\n")
    # f: 1000 + 2000 + 2*3,000,000; d: 2*10; h (packed two-wide): 2*5 + 4*7
    assert k.fp_flops == 1_000 + 2_000 + 6_000_000 + 20 + 10 + 28
    assert k.tensor_flops is None
    assert k.hw_flops == k.fp_flops
    assert k.duration_ns == 12_500.0


def test_tensor_sources_int_excluded_and_no_double_count() -> None:
    metrics = {
        "sm__ops_path_tensor_src_fp16.sum": "",
        "sm__ops_path_tensor_src_tf32_dst_fp32.sum": "",
        "sm__ops_path_tensor_src_int8.sum": "",  # integer ops are not FLOPs
        "sm__ops_path_tensor_src_fp8.sum": "",  # aggregate present: its split must be skipped
        "sm__ops_path_tensor_src_fp8_sparsity_off.sum": "",
        "sm__ops_path_tensor_op_hmma_src_fp16_dst_fp32_sparsity_off.sum": "",  # per-instr breakdown
        "sm__ops_path_tensor_src_fp16.sum.per_second": "",
    }
    row = {
        "sm__ops_path_tensor_src_fp16.sum": "1,024",
        "sm__ops_path_tensor_src_tf32_dst_fp32.sum": "2,048",
        "sm__ops_path_tensor_src_int8.sum": "999,999",
        "sm__ops_path_tensor_src_fp8.sum": "4,096",
        "sm__ops_path_tensor_src_fp8_sparsity_off.sum": "4,096",
        "sm__ops_path_tensor_op_hmma_src_fp16_dst_fp32_sparsity_off.sum": "1,024",
        "sm__ops_path_tensor_src_fp16.sum.per_second": "123,456,789",
    }
    (k,) = parse_raw_csv(make_csv(metrics, [row]))
    assert k.tensor_flops == 1_024 + 2_048 + 4_096
    assert dict(k.tensor_by_src) == {"fp16": 1_024, "tf32_dst_fp32": 2_048, "fp8": 4_096}
    assert k.fp_flops is None and k.hw_flops == 7_168


def test_auto_scaled_units_are_multiplied() -> None:
    metrics = {"sm__ops_path_tensor_src_bf16_dst_fp32.sum": "Gop",
               "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "Kinst",
               "gpu__time_duration.sum": "msecond"}
    row = {"sm__ops_path_tensor_src_bf16_dst_fp32.sum": "137.44",
           "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "1.5",
           "gpu__time_duration.sum": "0.17"}
    (k,) = parse_raw_csv(make_csv(metrics, [row]))
    assert k.tensor_flops == 137_440_000_000
    assert k.fp_flops == 3_000
    assert k.duration_ns == pytest.approx(170_000.0)


def test_nvtx_ranges_and_missing_values() -> None:
    metrics = {"sm__ops_path_tensor_src_bf16_dst_fp32.sum": ""}
    rows = [
        {NVTX_COL: '4242  "<default domain>:flowtop_step_7:none:none:none:none:none:none"',
         "sm__ops_path_tensor_src_bf16_dst_fp32.sum": "8", "Kernel Name": "gemm_a"},
        {NVTX_COL: '4243  "<default domain>:outer:none:none:none:none:none:none"  '
                   '"<default domain>:flowtop_step_8:none:none:none:none:none:none"',
         "sm__ops_path_tensor_src_bf16_dst_fp32.sum": "n/a", "Kernel Name": "gemm_b"},
        {NVTX_COL: "", "sm__ops_path_tensor_src_bf16_dst_fp32.sum": "", "Kernel Name": "copy"},
    ]
    a, b, c = parse_raw_csv(make_csv(metrics, rows, extra_ids=(NVTX_COL,)))
    assert a.nvtx == ("flowtop_step_7",) and a.tensor_flops == 8 and a.name == "gemm_a"
    assert b.nvtx == ("outer", "flowtop_step_8")
    assert b.tensor_flops is None and b.hw_flops is None
    assert c.nvtx == () and c.tensor_flops is None


def test_calibrate_metric_lists_parse_from_fixture_names() -> None:
    # every tensor counter calibrate requests is one the parser counts
    header = next(csv.reader(io.StringIO(gzip.open(FIXTURE, "rt").readline())))
    for name in TENSOR_METRICS:
        assert name in header, name
    assert len(FP_METRICS) == 9


def test_not_an_ncu_csv() -> None:
    with pytest.raises(NcuParseError):
        parse_raw_csv("==ERROR== The application returned an error code (1).\n")
    with pytest.raises(NcuParseError):
        parse_raw_csv("")
