"""Parser for Nsight Compute raw CSV (``ncu --csv --page raw``): hardware FLOP counts per kernel launch.

Layout: a header row (identity columns, then metric names), a row of units, then one row per
kernel launch. Numbers carry thousands separators ("137,438,953,472"), so every cell is quoted.
Tool chatter such as ``==PROF== ...`` lines before the header is skipped.

FLOP definitions (docs/design.md, "Hardware cross-checks"):
- tensor FLOPs: sum of the ``sm__ops_path_tensor_src_<type>.sum`` counters over floating-point source
  types (bf16, fp16, tf32, fp8, fp64). These count 2 per multiply-add: one 4096³ bf16 GEMM reads
  2·4096³. Integer types (int1/int4/int8) are not FLOPs and are left out. The
  ``sm__ops_path_tensor_op_<instr>_...`` counters break the same work down by instruction and
  would double-count, so they are ignored.
- non-tensor FP FLOPs from the SASS thread-instruction counters
  ``smsp__sass_thread_inst_executed_op_<p><op>_pred_on.sum``: add + mul + 2·fma for fp32 (f) and
  fp64 (d). Half precision (h) instructions are packed two-wide (HADD2/HMUL2/HFMA2), so each counts
  twice: 2·hadd + 2·hmul + 4·hfma. This follows Nsight Compute's own roofline metrics, which scale
  hadd/hmul by 2 and hfma by 4 (``derived__..._hfma_pred_on_x4``).
Only exact ``.sum`` counters are used; ``.sum.per_cycle_elapsed`` and ``peak_sustained`` columns are
rates and peaks, not counts. A family whose counters are absent gives ``None`` (not 0).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

__all__ = ["NcuKernel", "NcuParseError", "parse_raw_csv", "parse_query_metrics", "usable_metrics",
           "TENSOR_METRICS", "FP_METRICS"]

# The counters calibrate asks ncu for (names as Nsight Compute 2025.3 reports them on Hopper).
TENSOR_METRICS: tuple[str, ...] = (
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp16.sum",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp8_sparsity_off.sum",
    "sm__ops_path_tensor_src_fp8_sparsity_on.sum",
    "sm__ops_path_tensor_src_fp64.sum",
)
FP_METRICS: tuple[str, ...] = tuple(
    f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum"
    for p in "hfd" for op in ("add", "mul", "fma"))

_TENSOR_RE = re.compile(r"^sm__ops_path_tensor_src_(?P<src>[a-z0-9_]+)\.sum$")
_FP_RE = re.compile(r"^(?P<unit>smsp|sm)__sass_thread_inst_executed_op_(?P<p>[hfd])"
                    r"(?P<op>add|mul|fma)_pred_on\.sum$")
# FLOPs per counted thread instruction; half precision is packed two-wide (see module doc).
_FP_WEIGHT = {("f", "add"): 1, ("f", "mul"): 1, ("f", "fma"): 2,
              ("d", "add"): 1, ("d", "mul"): 1, ("d", "fma"): 2,
              ("h", "add"): 2, ("h", "mul"): 2, ("h", "fma"): 4}
_NVTX_COLUMN_PREFIXES = ("thread Domain:Push/Pop_Range", "Id:Domain:Start/Stop_Range")
# NVTX cells hold one quoted "domain:range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg" per range.
_NVTX_TRAILING_FIELDS = 6
_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
            "s": 1e9, "second": 1e9}
_COUNT_UNIT = re.compile(r"^(?P<prefix>[KMGTP]?)(?P<base>inst|op|ops|flop|byte|sector|cycle|"
                         r"warp|thread|request|)$")


class NcuParseError(ValueError):
    """The text is not an Nsight Compute raw-page CSV."""


@dataclass(frozen=True)
class NcuKernel:
    """One profiled kernel launch. FLOP fields are ``None`` when their counters were not collected."""

    id: int
    name: str
    process_id: int | None
    device: int | None
    nvtx: tuple[str, ...]  # enclosing NVTX range names, outermost first
    duration_ns: float | None  # gpu__time_duration.sum
    tensor_flops: int | None
    fp_flops: int | None
    hw_flops: int | None  # tensor + non-tensor FP; None only when both families are missing
    tensor_by_src: tuple[tuple[str, int], ...]  # e.g. (("bf16_dst_fp32", 137438953472),)


def _number(cell: str) -> float | int | None:
    text = cell.strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _unit_scale(unit: str) -> float:
    """Multiplier to base units: ncu may auto-scale ("Kinst", "Mbyte", "usecond")."""
    unit = unit.strip()
    if unit in _TIME_NS:
        return 1.0  # times are handled by _duration_ns
    m = _COUNT_UNIT.match(unit)
    return _SI[m.group("prefix")] if m else 1.0


def _scaled(cell: str, unit: str) -> float | int | None:
    value = _number(cell)
    if value is None:
        return None
    scale = _unit_scale(unit)
    if scale == 1.0:
        return value
    return value * scale


def _as_count(value: float | int) -> int:
    return int(round(value))


def _nvtx_ranges(cell: str) -> list[str]:
    """Range names from one NVTX cell: ``<tid>  "<domain>:<range>:none:..."  "<domain>:..."``."""
    names: list[str] = []
    for chunk in re.findall(r'"([^"]*)"', cell):
        parts = chunk.split(":")
        if len(parts) >= 2 + _NVTX_TRAILING_FIELDS:
            names.append(":".join(parts[1:len(parts) - _NVTX_TRAILING_FIELDS]))
        elif len(parts) >= 2:
            names.append(parts[1])
        elif chunk:
            names.append(chunk)
    return names


def _find_header(rows: list[list[str]]) -> int:
    for i, row in enumerate(rows):
        if row and row[0].strip() == "ID" and "Kernel Name" in row:
            return i
    raise NcuParseError("no Nsight Compute raw CSV header (a row starting with \"ID\") found")


def parse_raw_csv(text: str) -> list[NcuKernel]:
    """Parse ``ncu --csv --page raw`` output into one ``NcuKernel`` per launch, in file order."""
    rows = list(csv.reader(io.StringIO(text)))
    start = _find_header(rows)
    header = [h.strip() for h in rows[start]]
    col = {name: i for i, name in enumerate(header)}
    units: list[str] = [""] * len(header)
    body = rows[start + 1:]
    if body and body[0] and body[0][0].strip() == "":  # the units row has an empty ID cell
        units = (body[0] + [""] * len(header))[: len(header)]
        body = body[1:]

    tensor_cols: dict[str, int] = {}
    for name, i in col.items():
        m = _TENSOR_RE.match(name)
        if m and not m.group("src").startswith("int"):
            tensor_cols[m.group("src")] = i
    # "fp8" next to "fp8_sparsity_off"/"_on" would count the same work twice: keep the aggregate.
    for src in list(tensor_cols):
        for suffix in ("_sparsity_off", "_sparsity_on"):
            if src.endswith(suffix) and src[: -len(suffix)] in tensor_cols:
                del tensor_cols[src]
    fp_cols: dict[tuple[str, str], tuple[str, int]] = {}
    for name, i in col.items():
        m = _FP_RE.match(name)
        if m:
            key = (m.group("p"), m.group("op"))
            # smsp and sm roll-ups of .sum are the same count; prefer smsp (the documented one)
            if key not in fp_cols or m.group("unit") == "smsp":
                fp_cols[key] = (m.group("unit"), i)
    nvtx_cols = [i for name, i in col.items() if name.startswith(_NVTX_COLUMN_PREFIXES)]
    time_col = col.get("gpu__time_duration.sum")

    kernels: list[NcuKernel] = []
    for row in body:
        if len(row) < len(header) or not row[0].strip().isdigit():
            continue  # trailing tool chatter, blank lines
        tensor_by_src: list[tuple[str, int]] = []
        for src, i in sorted(tensor_cols.items()):
            value = _scaled(row[i], units[i])
            if value is not None:
                tensor_by_src.append((src, _as_count(value)))
        tensor = sum(v for _, v in tensor_by_src) if tensor_by_src else None
        fp: int | None = None
        for key, (_, i) in fp_cols.items():
            value = _scaled(row[i], units[i])
            if value is not None:
                fp = (fp or 0) + _FP_WEIGHT[key] * _as_count(value)
        hw = None if tensor is None and fp is None else (tensor or 0) + (fp or 0)
        duration = None
        if time_col is not None:
            raw = _number(row[time_col])
            if raw is not None:
                duration = float(raw) * _TIME_NS.get(units[time_col].strip(), 1.0)
        nvtx: list[str] = []
        for i in nvtx_cols:
            nvtx.extend(_nvtx_ranges(row[i]))
        pid = _number(row[col["Process ID"]]) if "Process ID" in col else None
        dev = _number(row[col["Device"]]) if "Device" in col else None
        kernels.append(NcuKernel(
            id=int(row[0]), name=row[col["Kernel Name"]], process_id=_int_or_none(pid),
            device=_int_or_none(dev), nvtx=tuple(nvtx), duration_ns=duration,
            tensor_flops=tensor, fp_flops=fp, hw_flops=hw, tensor_by_src=tuple(tensor_by_src)))
    return kernels


def _int_or_none(value: float | int | None) -> int | None:
    return None if value is None else int(value)


_QUERY_NAME = re.compile(r"^([a-z0-9]+__[A-Za-z0-9_]+)\b")


def parse_query_metrics(text: str) -> set[str]:
    """Base metric names (no ``.sum`` rollup) listed by ``ncu --query-metrics`` for this GPU."""
    names: set[str] = set()
    for line in text.splitlines():
        m = _QUERY_NAME.match(line.strip())
        if m:
            names.add(m.group(1))
    return names


def usable_metrics(wanted: tuple[str, ...], available: set[str]) -> tuple[list[str], list[str]]:
    """``wanted`` split into (kept, dropped) by whether the GPU/ncu version knows the base name.

    One unknown metric makes ncu refuse the whole run, and the counter families differ between
    chips and ncu releases; calibrating with fewer counters beats not calibrating."""
    kept: list[str] = []
    dropped: list[str] = []
    for metric in wanted:
        (kept if metric.split(".", 1)[0] in available else dropped).append(metric)
    return kept, dropped
