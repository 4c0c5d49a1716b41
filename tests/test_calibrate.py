"""flowtop calibrate: command building, the exit-3 paths and the report from a CSV + JSONL pair."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flowtop.tools import calibrate as cal
from flowtop.tools.ncu import parse_raw_csv

NVTX_COL = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
BF16 = "sm__ops_path_tensor_src_bf16_dst_fp32.sum"
FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"
FADD = "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"
GEMM = 2 * 4096**3  # 137,438,953,472 tensor FLOPs, as ncu counted on H200


def nvtx(step: int) -> str:
    return f'1234  "<default domain>:{cal.NVTX_STEP_PREFIX}{step}:none:none:none:none:none:none"'


def synthetic_csv() -> str:
    """Two steps: step 5 = two GEMMs + an elementwise kernel; step 6 = one GEMM."""
    header = ["ID", "Process ID", "Process Name", NVTX_COL, "Kernel Name", "Device", BF16, FADD,
              FFMA, "gpu__time_duration.sum"]
    units = ["", "", "", "", "", "", "", "inst", "inst", "ns"]
    rows = [
        ["0", "9", "python", nvtx(5), "nvjet_sm90_gemm", "0", f"{GEMM:,}", "0", "0", "174,560"],
        ["1", "9", "python", nvtx(5), "nvjet_sm90_gemm", "0", f"{GEMM:,}", "0", "0", "173,888"],
        ["2", "9", "python", nvtx(5), "vectorized_elementwise", "0", "0", "1,000,000",
         "3,000,000", "9,000"],
        ["3", "9", "python", nvtx(6), "nvjet_sm90_gemm", "0", f"{GEMM:,}", "0", "0", "174,000"],
    ]
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerows([header, units, *rows])
    return buf.getvalue()


def cells(line: str) -> list[str]:
    """Table cells: columns are separated by at least two spaces (headers hold single ones)."""
    return re.split(r"\s{2,}", line.strip())


def write_jsonl(path: Path, lines: list[Any]) -> None:
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))


def test_parse_args_splits_at_double_dash() -> None:
    o = cal.parse_args(["--steps", "2", "--skip", "10", "--", "python", "train.py", "--steps", "9"])
    assert o == cal.CalibrateOptions(steps=2, skip=10, ncu=None, export=None,
                                     command=("python", "train.py", "--steps", "9"))
    o = cal.parse_args(["python", "train.py"])
    assert (o.steps, o.skip, o.command) == (3, 5, ("python", "train.py"))


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cal.main(["--steps", "2"]) == cal.EXIT_USAGE
    assert "no command given" in capsys.readouterr().err
    assert cal.main(["--steps", "0", "--", "python"]) == cal.EXIT_USAGE
    assert cal.main(["--skip", "1", "--", "python"]) == cal.EXIT_USAGE  # step 1 has no range
    assert "--skip >= 2" in capsys.readouterr().err


def test_profile_command_is_exact() -> None:
    cmd = cal.build_profile_command("/opt/ncu", ["python", "train.py", "-x"], [5, 6], "/tmp/r")
    metrics = ",".join(cal.METRICS)
    assert cmd == [
        "/opt/ncu", "--target-processes", "all", "--clock-control", "none",
        "--nvtx", "--nvtx-push-pop-scope", "process",
        "--nvtx-include", "flowtop_step_5/", "--nvtx-include", "flowtop_step_6/",
        "--metrics", metrics, "--export", "/tmp/r", "--force-overwrite",
        "python", "train.py", "-x",
    ]
    assert "sm__ops_path_tensor_src_bf16_dst_fp32.sum" in metrics
    assert "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum" in metrics
    assert cal.build_import_command("/opt/ncu", "/tmp/r.ncu-rep") == [
        "/opt/ncu", "--import", "/tmp/r.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"]
    assert cal.step_indices(5, 3) == [5, 6, 7]


def test_env_for_the_probe() -> None:
    env = cal.build_env({"PATH": "/bin", "FLOWTOP_NVTX": "0", "PYTHONPATH": "/mine"},
                        "/tmp/out.jsonl", [5, 6, 7])
    assert (env["FLOWTOP_NVTX"], env["FLOWTOP_CALIBRATE_OUT"], env["FLOWTOP_CALIBRATE_STEPS"]) == (
        "1", "/tmp/out.jsonl", "5,6,7")
    assert env["FLOWTOP_KERNELS"] == "0"  # torch.profiler's CUPTI session would fight ncu's
    assert env["PATH"] == "/bin"
    # the probe is injected like `flowtop run` does: its bootstrap first, the user's path next,
    # the probe's package root last
    bootstrap, user, root = env["PYTHONPATH"].split(os.pathsep)
    assert bootstrap == str(Path(cal.__file__).resolve().parents[2] / "probe" / "bootstrap")
    assert user == "/mine"
    assert root == str(Path(cal.__file__).resolve().parents[2])


def test_no_ncu_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope" / "ncu"
    assert cal.main(["--ncu", str(missing), "--", "python", "x.py"]) == cal.EXIT_NO_TOOLS
    err = capsys.readouterr().err
    assert f"Nsight Compute (ncu) not found at {missing}" in err
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without ncu
    assert cal.main(["--", "python", "x.py"]) == cal.EXIT_NO_TOOLS
    assert "Nsight Compute (ncu) not found on PATH" in capsys.readouterr().err


def fake_executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_no_gpu_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ncu = fake_executable(tmp_path / "ncu")
    rc = cal.run_calibration(cal.parse_args(["--ncu", str(ncu), "--", "python", "x.py"]),
                             gpu_check=lambda: "no NVIDIA GPU found (nvidia-smi not found)")
    assert rc == cal.EXIT_NO_TOOLS
    assert "no NVIDIA GPU found (nvidia-smi not found). Calibration needs an NVIDIA GPU." in (
        capsys.readouterr().err)


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has an NVIDIA GPU")
def test_detect_gpu_on_this_machine_says_why() -> None:
    reason = cal.detect_gpu()
    assert reason is not None and reason.startswith("no NVIDIA GPU found (")
    assert "NVML" in reason


def test_read_probe_records_skips_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "flops.jsonl"
    write_jsonl(p, [
        {"step": 5, "executed_flops": 1.5e12, "model_flops": 1.2e12},
        "{not json",
        {"step": "6", "executed_flops": 1.0},  # step must be an int
        {"step": 6, "executed_flops": None, "model_flops": float(3)},
        {"step": 7, "executed_flops": True},  # a bool is not a count
        '{"step": 8, "executed_flops": 2.0',  # a line cut short by a kill
    ])
    assert cal.read_probe_records(p) == [
        cal.ProbeRecord(5, 1.5e12, 1.2e12), cal.ProbeRecord(6, None, 3.0),
        cal.ProbeRecord(7, None, None)]
    assert cal.read_probe_records(tmp_path / "missing.jsonl") == []


def test_report_from_csv_and_jsonl(tmp_path: Path) -> None:
    kernels = parse_raw_csv(synthetic_csv())
    assert [cal.kernel_step(k) for k in kernels] == [5, 5, 5, 6]
    p = tmp_path / "flops.jsonl"
    write_jsonl(p, [
        {"step": 4, "executed_flops": 9e12, "model_flops": 9e12},  # not calibrated: ignored
        # two ranks wrote step 5: their counts add up, like the kernels of both processes
        {"step": 5, "executed_flops": GEMM, "model_flops": GEMM},
        {"step": 5, "executed_flops": GEMM, "model_flops": GEMM},
        {"step": 6, "executed_flops": 1.5 * GEMM, "model_flops": GEMM},
    ])
    rows, unassigned = cal.compare_steps(kernels, cal.read_probe_records(p), [5, 6, 7])
    assert unassigned == 0
    assert [r.step for r in rows] == [5, 6, 7]
    r5, r6, r7 = rows
    # step 5: 2 GEMMs on tensor cores + 1,000,000 fadd + 2·3,000,000 ffma on the FP units
    assert (r5.kernels, r5.tensor_flops, r5.fp_flops) == (3, 2 * GEMM, 7_000_000)
    assert r5.hw_flops == 2 * GEMM + 7_000_000
    assert r5.probe_executed == 2 * GEMM
    assert r5.tensor_ratio == 1.0
    assert r5.ratio == pytest.approx(2 * GEMM / (2 * GEMM + 7_000_000))
    assert (r6.kernels, r6.hw_flops, r6.ratio, r6.probe_model) == (1, GEMM, 1.5, GEMM)
    assert (r7.kernels, r7.hw_flops, r7.probe_executed, r7.ratio) == (0, None, None, None)

    text = cal.render_report(rows, unassigned, cal.report_notes(kernels, rows))
    table = [cells(line) for line in text.splitlines()[1:6]]
    assert table == [
        ["step", "kernels", "tensor", "non-tensor FP", "hardware", "probe executed", "ratio",
         "ratio/tensor", "probe model"],
        ["5", "3", "274.88G", "7M", "274.88G", "274.88G", "1.000", "1.000", "274.88G"],
        ["6", "1", "137.44G", "0", "137.44G", "206.16G", "1.500", "1.500", "137.44G"],
        ["7", "0", "-", "-", "-", "-", "-", "-", "-"],
        # totals over the steps both sides counted: 3.5 GEMMs / (3 GEMMs + 7 M) = 1.1666...
        ["all", "4", "412.32G", "7M", "412.32G", "481.04G", "1.167", "1.167", "412.32G"],
    ]
    assert "note: no profiled kernels for steps [7]: did training reach them?" in text
    assert "causal attention kernels skip the masked half" in text


def test_report_notes_missing_counters_and_probe() -> None:
    kernels = parse_raw_csv(synthetic_csv().replace(FADD, "x_fadd").replace(FFMA, "x_ffma")
                            .replace(BF16, "x_bf16"))
    assert all(k.hw_flops is None for k in kernels)
    rows, _ = cal.compare_steps(kernels, [], [5])
    notes = cal.report_notes(kernels, rows)
    assert notes == [
        "note: non-tensor FP counters were not collected; hardware = tensor only.",
        "note: tensor-core counters were not collected on this GPU/ncu version.",
        "note: the probe wrote no FLOP counts ($FLOWTOP_CALIBRATE_OUT); is the probe attached "
        "to the training script?",
    ]


def test_run_calibration_end_to_end_with_fake_runner(tmp_path: Path) -> None:
    ncu = fake_executable(tmp_path / "ncu")
    calls: list[tuple[list[str], dict[str, Any]]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append((cmd, kw))
        if "--query-metrics" in cmd:  # this ncu knows every counter but the fp64 tensor one
            known = [m.split(".")[0] for m in cal.METRICS if "tensor_src_fp64" not in m]
            listing = "Device NVIDIA H200 (GH100)\n---- ----\nMetric Name   Metric Description\n"
            return subprocess.CompletedProcess(cmd, 0, stdout=listing + "\n".join(
                f"{m}   some description" for m in known), stderr="")
        if "--import" in cmd:
            return subprocess.CompletedProcess(cmd, 0, stdout=synthetic_csv(), stderr="")
        env = kw["env"]
        assert env["FLOWTOP_NVTX"] == "1" and env["FLOWTOP_CALIBRATE_STEPS"] == "5,6"
        write_jsonl(Path(env["FLOWTOP_CALIBRATE_OUT"]), [
            {"step": 5, "executed_flops": 2 * GEMM, "model_flops": 2 * GEMM},
            {"step": 6, "executed_flops": GEMM, "model_flops": GEMM}])
        base = cmd[cmd.index("--export") + 1]
        Path(base + ".ncu-rep").write_bytes(b"report")
        return subprocess.CompletedProcess(cmd, 0)

    out, err = io.StringIO(), io.StringIO()
    export = tmp_path / "keep" / "calib.ncu-rep"
    export.parent.mkdir()
    opts = cal.parse_args(["--ncu", str(ncu), "--steps", "2", "--export", str(export), "--",
                           "python", "train.py"])
    assert cal.run_calibration(opts, run=run, gpu_check=lambda: None, out=out, err=err) == 0
    query, profile, imp = calls
    assert query[0] == [str(ncu), "--query-metrics"]
    assert profile[0][-2:] == ["python", "train.py"]
    metrics = profile[0][profile[0].index("--metrics") + 1].split(",")
    assert metrics == [m for m in cal.METRICS if "tensor_src_fp64" not in m]
    assert profile[0][profile[0].index("--export") + 1] == str(tmp_path / "keep" / "calib")
    assert imp[0] == cal.build_import_command(str(ncu), str(export))
    report = [cells(line) for line in out.getvalue().splitlines()[2:5]]
    assert [(r[0], r[1], r[6]) for r in report] == [("5", "3", "1.000"), ("6", "1", "1.000"),
                                                     ("all", "4", "1.000")]
    assert "profiling steps [5, 6]" in err.getvalue()
    assert "lacks sm__ops_path_tensor_src_fp64.sum; calibrating without them" in err.getvalue()


def test_run_calibration_fails_without_report(tmp_path: Path) -> None:
    ncu = fake_executable(tmp_path / "ncu")
    err = io.StringIO()

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1)  # e.g. the training command crashed

    opts = cal.parse_args(["--ncu", str(ncu), "--", "python", "train.py"])
    assert cal.run_calibration(opts, run=run, gpu_check=lambda: None, out=io.StringIO(),
                               err=err) == cal.EXIT_FAILED
    assert "ncu / the command exited 1" in err.getvalue()
    assert "ncu wrote no report" in err.getvalue()


def test_format_flops() -> None:
    assert cal.format_flops(None) == "-"
    assert cal.format_flops(137_438_953_472) == "137.44G"
    assert cal.format_flops(1.5e15) == "1.5P"
    assert cal.format_flops(999) == "999"


def test_metric_listing_parse_and_selection() -> None:
    from flowtop.tools.ncu import parse_query_metrics, usable_metrics

    listing = ("Device NVIDIA H200 (GH100)\n"
               "------------------------------------ ---------------------------\n"
               "Metric Name                          Metric Description\n"
               "------------------------------------ ---------------------------\n"
               "dram__bytes                          # of bytes accessed in DRAM\n"
               "sm__ops_path_tensor_src_bf16_dst_fp32  # of tensor ops, bf16 sources\n"
               "==PROF== done\n")
    names = parse_query_metrics(listing)
    assert names == {"dram__bytes", "sm__ops_path_tensor_src_bf16_dst_fp32"}
    kept, dropped = usable_metrics(("sm__ops_path_tensor_src_bf16_dst_fp32.sum", "x__y.sum"), names)
    assert (kept, dropped) == (["sm__ops_path_tensor_src_bf16_dst_fp32.sum"], ["x__y.sum"])


def test_unlistable_metrics_fall_back_to_all() -> None:
    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="==ERROR== no device")

    err = io.StringIO()
    assert cal.select_metrics("ncu", run, err) == list(cal.METRICS)
    assert err.getvalue() == ""

    def unrelated(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 0, stdout="dram__bytes  bytes\nsm__cycles  cycles\n", stderr="")

    # a listing that knows none of ours: no empty --metrics, ncu names what it lacks itself
    assert cal.select_metrics("ncu", unrelated, err) == list(cal.METRICS)
