"""``flowtop analyze TRACE.json[.gz]``: the kernel top list and step anatomy of a profiler trace.

Reads a torch.profiler Chrome trace offline (no torch needed) through the same aggregation the
live monitor uses, and prints a fixed-width table (or JSON with ``--json``).  Exit status: 0 on
success, 2 for bad arguments or a file that is missing or not a Chrome trace.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowtop.monitor.format import rate_prefix
from flowtop.monitor.kernels.aggregate import KernelStat, KernelWindowStats, aggregate
from flowtop.monitor.kernels.chrome import load_trace
from flowtop.monitor.kernels.trace import TraceError
from flowtop.monitor.snapshot_json import jsonable

SORT_KEYS = ("time", "calls", "mean", "tflops")
DEFAULT_TOP = 20
DESCRIPTION = "Kernel top list and step anatomy of a torch.profiler Chrome trace."


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="flowtop analyze", description=DESCRIPTION)
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``flowtop analyze`` (also the ``analyze`` subcommand of ``flowtop.cli``)."""
    ap.add_argument("trace", help="Chrome trace exported by torch.profiler (.json or .json.gz)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--top", type=int, default=None, metavar="N",
                    help=f"show the first N kernels (default {DEFAULT_TOP} in the table, all in JSON; 0: all)")
    ap.add_argument("--sort", choices=SORT_KEYS, default="time", help="kernel order (default: time)")
    ap.add_argument("--step-ms", type=float, default=None, metavar="MS",
                    help="the step's wall time WITHOUT the profiler (it stretches host time): busy %% is also "
                         "given against it")


def sort_kernels(kernels: Sequence[KernelStat], key: str) -> list[KernelStat]:
    """Kernels ordered by ``key`` (largest first; ties by name; unknown TFLOP/s last)."""
    if key == "calls":
        return sorted(kernels, key=lambda k: (-k.calls, k.name))
    if key == "mean":
        return sorted(kernels, key=lambda k: (-k.mean_us, k.name))
    if key == "tflops":
        return sorted(kernels, key=lambda k: (k.tflops is None, -(k.tflops or 0.0), k.name))
    return sorted(kernels, key=lambda k: (-k.total_us, k.name))


def _pct(frac: float | None) -> str:
    return "n/a" if frac is None else f"{100.0 * frac:.1f} %"


def render_text(stats: KernelWindowStats, source: str, kernels: list[KernelStat]) -> str:
    """The fixed-width report."""
    a = stats.anatomy
    lines = [
        f"flowtop analyze: {source}",
        f"device {stats.device}   step {a.step_us:.1f} us   busy {a.busy_us:.1f} us ({_pct(a.busy_frac)})"
        f"   idle {a.idle_us:.1f} us",
    ]
    if a.busy_frac_typical is not None and a.typical_step_us is not None:
        lines.append(f"unprofiled step {a.typical_step_us:.1f} us: device busy {_pct(a.busy_frac_typical)} of it")
    if a.flops is not None:
        scale, prefix = rate_prefix([(a.tflops or 0.0) * 1e12])  # GFLOP/s on a CPU, not 0.000 TFLOP/s
        rate = (a.tflops or 0.0) * 1e12 / scale
        lines.append(f"FLOPs attributed to kernels {a.flops / 1e9:.3f} G ({rate:.3f} {prefix}FLOP/s over the step)")
    if a.launches is not None:
        lines.append(f"launches {a.launches}   short kernels {a.short_kernels} ({a.short_kernel_us or 0.0:.1f} us)"
                     f": {a.short_note}")
    lines.append(f"communication {a.comm_us:.1f} us   overlapped with compute {a.comm_overlap_us:.1f} us"
                 f" ({_pct(a.comm_overlap_frac)})")
    scale, prefix = rate_prefix(k.tflops * 1e12 for k in kernels if k.tflops is not None)  # GFLOP/s on a CPU
    lines += ["", f"{'TIME%':>6} {'TOTAL us':>10} {'CALLS':>6} {'MEAN us':>9} {prefix + 'FLOP/s':>8}  "
                  f"{'CATEGORY':<13} KERNEL"]
    for k in kernels:
        tf = "-" if k.tflops is None else f"{k.tflops * 1e12 / scale:.1f}"
        lines.append(f"{100 * k.share:6.2f} {k.total_us:10.1f} {k.calls:6d} {k.mean_us:9.2f} {tf:>8}  "
                     f"{k.category:<13} {k.short}")
    shown = len(kernels)
    if shown < len(stats.kernels):
        lines.append(f"... {len(stats.kernels) - shown} more (--top 0 shows all)")
    lines += ["", f"{'TIME%':>6} {'TOTAL us':>10} {'CALLS':>6}  CATEGORY"]
    for c in stats.categories:
        lines.append(f"{100 * c.share:6.2f} {c.total_us:10.1f} {c.calls:6d}  {c.category}")
    lines += ["", "largest idle gaps (no device work):", f"{'START us':>10} {'LENGTH us':>10}  HOST DURING THE GAP"]
    for g in a.gaps:
        lines.append(f"{g.start_us:10.1f} {g.dur_us:10.1f}  {', '.join(g.host_ops) or '-'}")
    return "\n".join(lines) + "\n"


def _rounded(obj: Any) -> Any:
    """JSON-ready copy with floats rounded to 6 decimals (stable output; µs to the picosecond)."""
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj


def render_json(stats: KernelWindowStats, source: str, kernels: list[KernelStat]) -> str:
    """The report as JSON (dataclass fields; ``kernels`` in the requested order)."""
    doc = jsonable(stats)
    doc["kernels"] = [jsonable(k) for k in kernels]
    doc["kernels_total"] = len(stats.kernels)
    doc = {"trace": source, **doc}
    return json.dumps(_rounded(doc), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """Run ``flowtop analyze``; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage or help
        return int(exc.code or 0)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run ``flowtop analyze`` with parsed arguments (:func:`add_arguments`); returns the exit status."""
    if args.step_ms is not None and not 0 < args.step_ms < float("inf"):
        print("flowtop analyze: --step-ms must be a positive number", file=sys.stderr)
        return 2
    if args.top is not None and args.top < 0:
        print("flowtop analyze: --top must be 0 or more", file=sys.stderr)
        return 2
    try:
        window = load_trace(args.trace)
        if args.step_ms is not None:
            window = dataclasses.replace(window, typical_step_us=args.step_ms * 1e3)
        stats = aggregate(window)
    except TraceError as exc:
        print(f"flowtop analyze: {exc}", file=sys.stderr)
        return 2
    top = args.top if args.top is not None else (0 if args.json else DEFAULT_TOP)
    kernels = sort_kernels(stats.kernels, args.sort)
    if top:
        kernels = kernels[:top]
    source = Path(args.trace).name
    sys.stdout.write(render_json(stats, source, kernels) if args.json else render_text(stats, source, kernels))
    return 0
