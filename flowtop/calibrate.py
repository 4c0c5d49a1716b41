"""``flowtop calibrate [--steps N] [--skip S] [--ncu PATH] [--export PATH] -- CMD ARGS...``

Checks the probe's FLOP count against the hardware: runs the training command under Nsight Compute,
which counts the tensor-core and FP instructions of every kernel inside the NVTX ranges the probe
puts around a few chosen steps, and compares them with what the probe counted for those steps.

The command runs with the probe injected as under ``flowtop run`` (an unmodified script works).
Contract with the probe (set in the command's environment):
- ``FLOWTOP_NVTX=1``: wrap each training step ``k`` in an NVTX range named
  ``f"{NVTX_STEP_PREFIX}{k}"`` (k = the probe's step number; the first step is 1 and has no
  range, as it starts before the probe has seen a step boundary).
- ``FLOWTOP_CALIBRATE_STEPS="5,6,7"``: the steps being calibrated (informational: a probe may
  count FLOPs on exactly these; lines for other steps are ignored).
- ``FLOWTOP_KERNELS=0``: no torch.profiler windows (two CUPTI clients would disturb each other).
- ``FLOWTOP_CALIBRATE_OUT=<path>``: append one JSON line per counted step,
  ``{"step": k, "executed_flops": ..., "model_flops": ...}`` (several ranks may append to one file;
  their lines for the same step are summed, as are the kernels of all processes).

The range is a push/pop range, so ncu gets ``--nvtx-push-pop-scope process``: backward kernels are
launched from autograd's device thread, not the thread that pushed the range.

Exit codes: 0 report printed; 2 usage error; 3 Nsight Compute (``ncu``) or an NVIDIA GPU is missing;
4 ncu or the command failed, or no kernel was profiled.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from flowtop.format import fmt_sig
from flowtop.ncu import FP_METRICS, TENSOR_METRICS, NcuKernel, NcuParseError, parse_raw_csv

NVTX_STEP_PREFIX = "flowtop_step_"
ENV_NVTX = "FLOWTOP_NVTX"
ENV_OUT = "FLOWTOP_CALIBRATE_OUT"
ENV_STEPS = "FLOWTOP_CALIBRATE_STEPS"
EXIT_OK, EXIT_USAGE, EXIT_NO_TOOLS, EXIT_FAILED = 0, 2, 3, 4
METRICS: tuple[str, ...] = TENSOR_METRICS + FP_METRICS + ("gpu__time_duration.sum",)
_STEP_RE = re.compile(re.escape(NVTX_STEP_PREFIX) + r"(\d+)$")

Runner = Callable[..., "subprocess.CompletedProcess[Any]"]


@dataclass(frozen=True)
class CalibrateOptions:
    """Parsed command line."""

    steps: int
    skip: int
    ncu: str | None
    export: str | None
    command: tuple[str, ...]


@dataclass(frozen=True)
class ProbeRecord:
    """One line the probe wrote for a calibrated step."""

    step: int
    executed_flops: float | None
    model_flops: float | None


@dataclass(frozen=True)
class StepComparison:
    """Hardware counts (summed over the step's kernels) next to the probe's counts."""

    step: int
    kernels: int
    tensor_flops: int | None
    fp_flops: int | None
    hw_flops: int | None
    probe_executed: float | None
    probe_model: float | None

    @property
    def ratio(self) -> float | None:
        """probe executed FLOPs ÷ hardware FLOPs (tensor + non-tensor FP)."""
        return _div(self.probe_executed, self.hw_flops)

    @property
    def tensor_ratio(self) -> float | None:
        """probe executed FLOPs ÷ tensor-core FLOPs only (isolates the matmul accounting)."""
        return _div(self.probe_executed, self.tensor_flops)


def _div(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# ------------------------------------------------------------------ command line
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flowtop calibrate",
        description="Compare the probe's FLOP count with Nsight Compute's hardware counters.")
    p.add_argument("--steps", type=int, default=3, help="steps to profile (default 3)")
    p.add_argument("--skip", type=int, default=5,
                   help="first profiled step number (the first step is 1); earlier steps warm up "
                        "(default 5)")
    p.add_argument("--ncu", default=None, help="path of the ncu executable (default: PATH)")
    p.add_argument("--export", default=None,
                   help="keep the Nsight Compute report at this path (.ncu-rep is appended)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def parse_args(argv: Sequence[str]) -> CalibrateOptions:
    """Parse the arguments after ``flowtop calibrate``; raises ``SystemExit(2)`` on usage errors."""
    argv = list(argv)
    parser = _parser()
    if "--" in argv:  # everything after "--" belongs to the command, even its own --options
        cut = argv.index("--")
        ns = parser.parse_args(argv[:cut])
        command = argv[cut + 1:]
    else:
        ns = parser.parse_args(argv)
        command = list(ns.command)
    if not command:
        parser.error("no command given: flowtop calibrate [options] -- CMD ARGS...")
    if ns.steps < 1 or ns.skip < 2:
        parser.error("--steps must be >= 1 and --skip >= 2 (step 1 has no NVTX range)")
    return CalibrateOptions(steps=ns.steps, skip=ns.skip, ncu=ns.ncu, export=ns.export,
                            command=tuple(command))


def step_indices(skip: int, steps: int) -> list[int]:
    """The probe step numbers to profile."""
    return list(range(skip, skip + steps))


def build_profile_command(ncu: str, command: Sequence[str], steps: Iterable[int],
                          report_base: str) -> list[str]:
    """The ncu invocation that profiles only kernels inside the chosen steps' NVTX ranges."""
    cmd = [ncu, "--target-processes", "all", "--clock-control", "none",
           "--nvtx", "--nvtx-push-pop-scope", "process"]
    for k in steps:
        cmd += ["--nvtx-include", f"{NVTX_STEP_PREFIX}{k}/"]  # trailing "/": a push/pop range
    cmd += ["--metrics", ",".join(METRICS), "--export", report_base, "--force-overwrite"]
    return cmd + list(command)


def build_import_command(ncu: str, report_file: str) -> list[str]:
    """Reads the saved report back as raw CSV, in base units (no "K"/"M" auto-scaling)."""
    return [ncu, "--import", report_file, "--csv", "--page", "raw", "--print-units", "base"]


def build_env(base: Mapping[str, str], out_path: str, steps: Iterable[int]) -> dict[str, str]:
    """The command's environment: ``flowtop run``'s probe injection (so an unmodified training
    script gets the probe) plus the probe's calibration switches, on top of ``base``."""
    from flowtop.runner import probe_env

    env = probe_env(base)
    env[ENV_NVTX] = "1"
    env[ENV_OUT] = out_path
    env[ENV_STEPS] = ",".join(str(k) for k in steps)
    # Kernel windows would start torch.profiler, whose CUPTI session competes with the one
    # ncu injects (and would profile the profiler's own buffer flushes).
    env["FLOWTOP_KERNELS"] = "0"
    return env


# ------------------------------------------------------------------ environment
def find_ncu(explicit: str | None) -> str | None:
    """The ncu executable: ``explicit`` if it is an executable file, else ``ncu`` on PATH."""
    if explicit is not None:
        path = Path(explicit)
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which("ncu")


def detect_gpu(run: Runner = subprocess.run) -> str | None:
    """``None`` when an NVIDIA GPU is usable, else why not (nvidia-smi first, then NVML)."""
    why: list[str] = []
    smi = shutil.which("nvidia-smi")
    if smi is None:
        why.append("nvidia-smi not found")
    else:
        try:
            res = run([smi, "-L"], capture_output=True, text=True, timeout=30)
            if res.returncode == 0 and "GPU" in (res.stdout or ""):
                return None
            why.append(f"nvidia-smi -L exited {res.returncode}")
        except (OSError, subprocess.SubprocessError) as exc:
            why.append(f"nvidia-smi -L failed: {exc}")
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if int(pynvml.nvmlDeviceGetCount()) > 0:
                return None
            why.append("NVML sees 0 GPUs")
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # ImportError or any NVMLError
        why.append(f"NVML: {exc}")
    return "no NVIDIA GPU found (" + "; ".join(why) + ")"


# ------------------------------------------------------------------ results
def _flops(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_probe_records(path: str | Path) -> list[ProbeRecord]:
    """The probe's JSON lines; malformed lines are skipped (a killed run can leave half a line)."""
    records: list[ProbeRecord] = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return records
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("step"), int):
            continue
        records.append(ProbeRecord(step=obj["step"], executed_flops=_flops(obj.get("executed_flops")),
                                   model_flops=_flops(obj.get("model_flops"))))
    return records


def kernel_step(kernel: NcuKernel) -> int | None:
    """The step whose NVTX range encloses the kernel (innermost flowtop range wins)."""
    for name in reversed(kernel.nvtx):
        m = _STEP_RE.match(name)
        if m:
            return int(m.group(1))
    return None


def _sum_opt(values: Iterable[float | int | None]) -> Any:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def compare_steps(kernels: Sequence[NcuKernel], records: Sequence[ProbeRecord],
                  steps: Iterable[int] | None = None) -> tuple[list[StepComparison], int]:
    """Per-step comparison rows (sorted by step) and the number of kernels outside any step range.

    ``steps`` limits the rows to the calibrated steps (the probe may write a line for every step);
    without it, every step seen on either side gets a row."""
    by_step: dict[int, list[NcuKernel]] = {}
    unassigned = 0
    for k in kernels:
        step = kernel_step(k)
        if step is None:
            unassigned += 1
        else:
            by_step.setdefault(step, []).append(k)
    probe: dict[int, list[ProbeRecord]] = {}
    for r in records:
        probe.setdefault(r.step, []).append(r)
    rows: list[StepComparison] = []
    wanted = set(by_step) | set(probe) if steps is None else set(steps)
    for step in sorted(wanted):
        ks = by_step.get(step, [])
        rs = probe.get(step, [])
        rows.append(StepComparison(
            step=step, kernels=len(ks),
            tensor_flops=_sum_opt(k.tensor_flops for k in ks),
            fp_flops=_sum_opt(k.fp_flops for k in ks),
            hw_flops=_sum_opt(k.hw_flops for k in ks),
            probe_executed=_sum_opt(r.executed_flops for r in rs),
            probe_model=_sum_opt(r.model_flops for r in rs)))
    return rows, unassigned


def format_flops(value: float | None) -> str:
    """``137.44G`` style (five significant digits), or ``-``."""
    return fmt_sig(value, 5, na="-")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


EXPLANATION = """\
ratio = probe executed FLOPs / hardware FLOPs (tensor-core + non-tensor FP, counted by Nsight Compute
for every kernel inside the step's NVTX range); ratio/tensor divides by the tensor-core part only.
  ~1.00  the probe's count matches what the hardware executed.
  < 1    the hardware did work the probe does not count: elementwise, normalisation, softmax and
         optimizer math run on the FP units (the non-tensor column), attention or GEMM kernels the
         FLOP counter does not recognise, tensor-core work on padded tiles of odd shapes.
  > 1    the probe counts work the kernels skip: causal attention kernels skip the masked half of
         the score matrix, or the probe assumed a recompute that did not happen.
ratio/tensor near 1 means the matmul accounting is right and the gap is non-tensor math.
Model FLOPs (for MFU) exclude recomputation, so they may sit below executed FLOPs."""


def _cells(r: StepComparison, label: str) -> tuple[str, ...]:
    return (label, str(r.kernels), format_flops(r.tensor_flops), format_flops(r.fp_flops),
            format_flops(r.hw_flops), format_flops(r.probe_executed), _ratio(r.ratio),
            _ratio(r.tensor_ratio), format_flops(r.probe_model))


def render_report(rows: Sequence[StepComparison], unassigned: int = 0,
                  notes: Sequence[str] = ()) -> str:
    """The table and its explanation."""
    head = ("step", "kernels", "tensor", "non-tensor FP", "hardware", "probe executed",
            "ratio", "ratio/tensor", "probe model")
    body = [_cells(r, str(r.step)) for r in rows]
    matched = [r for r in rows if r.hw_flops is not None and r.probe_executed is not None]
    if len(matched) > 1:  # totals only over steps both sides counted, so the ratio is fair
        total = StepComparison(-1, sum(r.kernels for r in matched), *(
            _sum_opt(getattr(r, f) for r in matched) for f in (
                "tensor_flops", "fp_flops", "hw_flops", "probe_executed", "probe_model")))
        body.append(_cells(total, "all"))
    widths = [max(len(c[i]) for c in [head, *body]) for i in range(len(head))]
    lines = ["FLOP calibration (FLOPs per step, all ranks summed)"]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in [head, *body]]
    if unassigned:
        lines.append(f"({unassigned} profiled kernels were outside any {NVTX_STEP_PREFIX}<k> range "
                     "and are not counted)")
    return "\n".join([*lines, *notes, "", EXPLANATION]) + "\n"


def _notes(kernels: Sequence[NcuKernel], rows: Sequence[StepComparison]) -> list[str]:
    notes: list[str] = []
    if kernels and all(k.fp_flops is None for k in kernels):
        notes.append("note: non-tensor FP counters were not collected; hardware = tensor only.")
    if kernels and all(k.tensor_flops is None for k in kernels):
        notes.append("note: tensor-core counters were not collected on this GPU/ncu version.")
    if rows and all(r.probe_executed is None for r in rows):
        notes.append(f"note: the probe wrote no FLOP counts (${ENV_OUT}); is the probe attached "
                     "to the training script?")
    missing = [r.step for r in rows if r.kernels == 0]
    if missing:
        notes.append(f"note: no profiled kernels for steps {missing}: did training reach them?")
    return notes


# ------------------------------------------------------------------ orchestration
def run_calibration(opts: CalibrateOptions, *, run: Runner = subprocess.run,
                    gpu_check: Callable[[], str | None] = detect_gpu,
                    out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Profile, read back, compare and print. ``run``/``gpu_check`` are injectable for tests."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    ncu = find_ncu(opts.ncu)
    if ncu is None:
        where = f"at {opts.ncu}" if opts.ncu else "on PATH"
        err.write(f"flowtop calibrate: Nsight Compute (ncu) not found {where}. Install Nsight "
                  "Compute (it ships with the CUDA toolkit) or pass --ncu PATH.\n")
        return EXIT_NO_TOOLS
    reason = gpu_check()
    if reason is not None:
        err.write(f"flowtop calibrate: {reason}. Calibration needs an NVIDIA GPU.\n")
        return EXIT_NO_TOOLS
    steps = step_indices(opts.skip, opts.steps)
    with tempfile.TemporaryDirectory(prefix="flowtop-calibrate-") as tmp:
        report_base = opts.export or os.path.join(tmp, "calibrate")
        if report_base.endswith(".ncu-rep"):
            report_base = report_base[: -len(".ncu-rep")]
        report_file = report_base + ".ncu-rep"
        if os.path.exists(report_file):
            os.remove(report_file)  # a stale report must not pass for this run's
        jsonl = os.path.join(tmp, "probe-flops.jsonl")
        cmd = build_profile_command(ncu, opts.command, steps, report_base)
        err.write(f"flowtop calibrate: profiling steps {steps} (kernels run slowly under ncu)\n")
        try:
            res = run(cmd, env=build_env(os.environ, jsonl, steps))
        except OSError as exc:
            err.write(f"flowtop calibrate: could not start ncu: {exc}\n")
            return EXIT_FAILED
        if res.returncode != 0:
            err.write(f"flowtop calibrate: ncu / the command exited {res.returncode}\n")
        if not os.path.exists(report_file):
            err.write(f"flowtop calibrate: ncu wrote no report ({report_file}); nothing profiled.\n")
            return EXIT_FAILED
        imp = run(build_import_command(ncu, report_file), capture_output=True, text=True)
        if imp.returncode != 0:
            err.write(f"flowtop calibrate: reading the report failed: {imp.stderr}\n")
            return EXIT_FAILED
        try:
            kernels = parse_raw_csv(imp.stdout)
        except NcuParseError as exc:
            err.write(f"flowtop calibrate: {exc}\n")
            return EXIT_FAILED
        records = read_probe_records(jsonl)
    if not kernels:
        err.write(f"flowtop calibrate: no kernels inside {NVTX_STEP_PREFIX}<k> ranges for steps "
                  f"{steps}; is the probe attached and does training run that long?\n")
        return EXIT_FAILED
    rows, unassigned = compare_steps(kernels, records, steps)
    out.write(render_report(rows, unassigned, _notes(kernels, rows)))
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    """Entry point for ``flowtop calibrate``; ``argv`` is what follows the word ``calibrate``."""
    try:
        opts = parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage message
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    return run_calibration(opts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
