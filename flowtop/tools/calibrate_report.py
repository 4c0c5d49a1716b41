"""The calibration's results: the probe's JSON lines, per-step hardware vs probe rows, the report.

Split from :mod:`flowtop.tools.calibrate` (which runs ncu and the command); nothing here touches a GPU.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowtop import settings
from flowtop.monitor.format import fmt_sig
from flowtop.tools.ncu import NcuKernel

NVTX_STEP_PREFIX = "flowtop_step_"
ENV_OUT = settings.PROBE_CALIBRATE_OUT.name
_STEP_RE = re.compile(re.escape(NVTX_STEP_PREFIX) + r"(\d+)$")


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


def report_notes(kernels: Sequence[NcuKernel], rows: Sequence[StepComparison]) -> list[str]:
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
