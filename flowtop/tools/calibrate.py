"""``flowtop calibrate [--steps N] [--skip S] [--ncu PATH] [--export PATH] -- CMD ARGS...``

Checks the probe's FLOP count against the hardware: runs the training command under Nsight Compute,
which counts the tensor-core and FP instructions of every kernel inside the NVTX ranges the probe
puts around a few chosen steps, and compares them with what the probe counted for those steps.

The command runs with the probe injected as under ``flowtop run`` (an unmodified script works).
Contract with the probe (set in the command's environment):
- ``FLOWTOP_NVTX=1``: wrap each training step ``k`` in an NVTX range named
  ``f"{NVTX_STEP_PREFIX}{k}"`` (k = the probe's step number; the first step is 1 and has no
  range, as it starts before the probe has seen a step boundary).
- ``FLOWTOP_CALIBRATE_STEPS="5,6,7"``: the steps being calibrated, for the training's own use
  (the probe does not read it; its lines for other steps are ignored here).
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
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from flowtop import settings
from flowtop.tools.calibrate_report import (  # noqa: F401  (re-exported: the report's public names)
    ENV_OUT, NVTX_STEP_PREFIX, ProbeRecord, StepComparison, report_notes, compare_steps, format_flops,
    kernel_step, read_probe_records, render_report)
from flowtop.tools.ncu import (FP_METRICS, TENSOR_METRICS, NcuParseError, parse_query_metrics,
                         parse_raw_csv, usable_metrics)

ENV_NVTX = settings.PROBE_NVTX.name
ENV_STEPS = settings.CALIBRATE_STEPS.name
EXIT_OK, EXIT_USAGE, EXIT_NO_TOOLS, EXIT_FAILED = 0, 2, 3, 4
METRICS: tuple[str, ...] = TENSOR_METRICS + FP_METRICS + ("gpu__time_duration.sum",)

Runner = Callable[..., "subprocess.CompletedProcess[Any]"]


@dataclass(frozen=True)
class CalibrateOptions:
    """Parsed command line."""

    steps: int
    skip: int
    ncu: str | None
    export: str | None
    command: tuple[str, ...]



# ------------------------------------------------------------------ command line
DESCRIPTION = "Compare the probe's FLOP count with Nsight Compute's hardware counters."


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowtop calibrate", description=DESCRIPTION)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``flowtop calibrate`` (also the ``calibrate`` subcommand of ``flowtop.cli``)."""
    p.add_argument("--steps", type=int, default=3, help="steps to profile (default 3)")
    p.add_argument("--skip", type=int, default=5,
                   help="first profiled step number (the first step is 1); earlier steps warm up "
                        "(default 5)")
    p.add_argument("--ncu", default=None, help="path of the ncu executable (default: PATH)")
    p.add_argument("--export", default=None,
                   help="keep the Nsight Compute report at this path (.ncu-rep is appended)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")


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
    return options(ns, command, parser.error)


def options(ns: argparse.Namespace, command: Sequence[str], error: Callable[[str], Any]) -> CalibrateOptions:
    """The parsed options (:func:`add_arguments`) with CMD; ``error`` (the parser's) reports a
    usage error and exits 2."""
    if not command:
        error("no command given: flowtop calibrate [options] -- CMD ARGS...")
    if ns.steps < 1 or ns.skip < 2:
        error("--steps must be >= 1 and --skip >= 2 (step 1 has no NVTX range)")
    return CalibrateOptions(steps=ns.steps, skip=ns.skip, ncu=ns.ncu, export=ns.export,
                            command=tuple(command))


def step_indices(skip: int, steps: int) -> list[int]:
    """The probe step numbers to profile."""
    return list(range(skip, skip + steps))


def build_profile_command(ncu: str, command: Sequence[str], steps: Iterable[int],
                          report_base: str, metrics: Sequence[str] = METRICS) -> list[str]:
    """The ncu invocation that profiles only kernels inside the chosen steps' NVTX ranges."""
    cmd = [ncu, "--target-processes", "all", "--clock-control", "none",
           "--nvtx", "--nvtx-push-pop-scope", "process"]
    for k in steps:
        cmd += ["--nvtx-include", f"{NVTX_STEP_PREFIX}{k}/"]  # trailing "/": a push/pop range
    cmd += ["--metrics", ",".join(metrics), "--export", report_base, "--force-overwrite"]
    return cmd + list(command)


def build_import_command(ncu: str, report_file: str) -> list[str]:
    """Reads the saved report back as raw CSV, in base units (no "K"/"M" auto-scaling)."""
    return [ncu, "--import", report_file, "--csv", "--page", "raw", "--print-units", "base"]


def build_env(base: Mapping[str, str], out_path: str, steps: Iterable[int]) -> dict[str, str]:
    """The command's environment: ``flowtop run``'s probe injection (so an unmodified training
    script gets the probe) plus the probe's calibration switches, on top of ``base``."""
    from flowtop.tools.runner import probe_env

    env = probe_env(base)
    env[ENV_NVTX] = "1"
    env[ENV_OUT] = out_path
    env[ENV_STEPS] = ",".join(str(k) for k in steps)
    # Kernel windows would start torch.profiler, whose CUPTI session competes with the one
    # ncu injects (and would profile the profiler's own buffer flushes).
    settings.PROBE_KERNELS.put(env, "0")
    return env


# ------------------------------------------------------------------ environment
def select_metrics(ncu: str, run: Runner, err: TextIO) -> list[str]:
    """The counters of :data:`METRICS` this GPU and ncu version know (all of them when ncu
    cannot list its metrics: then ncu itself names any unknown one)."""
    try:
        res = run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=300)
        available = parse_query_metrics(res.stdout or "") if res.returncode == 0 else set()
    except (OSError, subprocess.SubprocessError):
        available = set()
    if not available:
        return list(METRICS)
    kept, dropped = usable_metrics(METRICS, available)
    if not kept:  # a listing in a form we do not read: let ncu itself name what it lacks
        return list(METRICS)
    if dropped:
        err.write(f"flowtop calibrate: this GPU/ncu lacks {', '.join(dropped)}; calibrating "
                  "without them\n")
    return kept


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
        cmd = build_profile_command(ncu, opts.command, steps, report_base,
                                    select_metrics(ncu, run, err))
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
    out.write(render_report(rows, unassigned, report_notes(kernels, rows)))
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
