"""Dense peak FLOP/s per device and compute dtype, for MFU/HFU (docs/design.md, "Peaks").

All figures are *dense* tensor-core (or, for fp32, CUDA-core) rates from the vendors'
datasheets, per GPU.  Datasheets print sparse figures (2× dense) with an asterisk: they are
never used here.  Device names are matched explicitly against the name NVML reports (the H200
reports a plain "NVIDIA H200", which loose substring tables miss).  A CPU peak is estimated
from cores × clock × FLOPs per cycle and labelled "estimated".  An override in TFLOP/s comes
from ``FLOWTOP_PEAK_TFLOPS`` (or a CLI flag, via :func:`parse_peak_tflops`): one number for
every dtype, or per dtype (``bf16=989.4,fp8=1978.9``; dtypes it does not name keep the table's
or the CPU estimate's figure).

Pure Python: no torch, importable anywhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from probe import config
from probe._log import warn_once
from probe.wire.flops import PeakKind

ENV_PEAK = config.PEAK_TFLOPS.name
_MAX_PLAUSIBLE_TFLOPS = 100_000.0  # above this the user almost surely gave FLOP/s


@dataclass(frozen=True)
class Peak:
    """A peak rate in FLOP/s (not TFLOP/s), the dtype it is for, and where it came from: ``source``
    in words, ``kind`` in one (the wire's ``peak_kind``, a bounded Prometheus label)."""

    flops: float
    source: str
    dtype: str
    kind: PeakKind = "table"


@dataclass(frozen=True)
class _Row:
    device: str
    patterns: tuple[str, ...]  # full matches on the normalised name (see _normalise)
    tflops: dict[str, float]  # dtype -> dense TFLOP/s; a missing dtype has no tensor-core path
    source: str


_HOPPER_SXM = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9}
_HOPPER_NVL = {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0, "fp8": 1670.0}

_TABLE: tuple[_Row, ...] = (
    _Row("H200 NVL", (r"H200 NVL",), _HOPPER_NVL,
         "NVIDIA H200 NVL datasheet, sparse ÷ 2 (same tensor rates as H100 NVL)"),
    _Row("H200 SXM", (r"H200(?: SXM5?)?(?: \d+ ?GB(?: HBM3E?)?)?",), _HOPPER_SXM,
         "NVIDIA H200 SXM datasheet, sparse ÷ 2; 132 SMs × 1.83 GHz × 4096 FLOP/clk/SM"),
    _Row("GH200", (r"GH200(?: \d+ ?GB)?",), _HOPPER_SXM,
         "NVIDIA GH200 datasheet (H100 SXM-class GPU), sparse ÷ 2"),
    _Row("H100 NVL", (r"H100 NVL",), _HOPPER_NVL, "NVIDIA H100 NVL datasheet (per GPU), sparse ÷ 2"),
    _Row("H100 PCIe", (r"H100 PCIE(?: \d+ ?GB)?",),
         {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2, "fp8": 1513.0},
         "NVIDIA H100 PCIe datasheet, sparse ÷ 2"),
    _Row("H100 SXM", (r"H100 80GB HBM3", r"H100 SXM5?(?: \d+ ?GB)?(?: HBM3)?"), _HOPPER_SXM,
         "NVIDIA H100 SXM5 datasheet, sparse ÷ 2; 132 SMs × 1.83 GHz × 4096 FLOP/clk/SM"),
    _Row("A100", (r"A100(?:[- ](?:SXM4?|PCIE)[- ]\d+GB|[- ]\d+GB(?: PCIE)?)?",),
         {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
         "NVIDIA A100 datasheet (SXM and PCIe, 40 and 80 GB), sparse ÷ 2; no fp8"),
    _Row("H800 SXM", (r"H800(?: SXM5?)?(?: \d+ ?GB(?: HBM3)?)?",), _HOPPER_SXM,
         "NVIDIA H800 SXM5 datasheet, sparse ÷ 2 (the H100 SXM5's tensor rates; NVLink and FP64 cut)"),
    _Row("GB200", (r"GB200(?: \d+ ?GB)?",),
         {"bf16": 2500.0, "fp16": 2500.0, "tf32": 1250.0, "fp32": 80.0, "fp8": 5000.0},
         "NVIDIA GB200 NVL72 datasheet, 72-GPU figures ÷ 72, sparse ÷ 2"),
    _Row("B100", (r"B100(?: \d+ ?GB)?",),
         {"bf16": 1750.0, "fp16": 1750.0, "tf32": 875.0, "fp32": 60.0, "fp8": 3500.0},
         "NVIDIA HGX B100 datasheet (Blackwell architecture brief), 8-GPU figures ÷ 8, sparse ÷ 2"),
    _Row("B200", (r"B200(?: \d+ ?GB)?",),
         {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1125.0, "fp32": 75.0, "fp8": 4500.0},
         "NVIDIA HGX B200 datasheet, 8-GPU figures ÷ 8, sparse ÷ 2"),
    _Row("L40S", (r"L40S",),
         {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6, "fp8": 733.0},
         "NVIDIA L40S datasheet, sparse ÷ 2"),
    _Row("L4", (r"L4",),
         {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3, "fp8": 242.5},
         "NVIDIA L4 datasheet, sparse ÷ 2"),
    _Row("A10", (r"A10",),
         {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
         "NVIDIA A10 datasheet, sparse ÷ 2; no fp8 (the A10G is a different part: not matched)"),
    _Row("RTX 4090", (r"(?:GEFORCE )?RTX 4090",),
         {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6, "fp8": 330.3},
         "NVIDIA Ada (AD102) whitepaper, RTX 4090, dense, FP32 accumulate (PyTorch's)"),
    _Row("V100 SXM2", (r"V100-SXM2-(?:16|32)GB", r"V100 SXM2(?: \d+GB)?"),
         {"fp16": 125.0, "fp32": 15.7, "tf32": 15.7},
         "NVIDIA V100 datasheet (SXM2); no bf16/tf32 tensor cores: fp32 matmuls run at the fp32 rate"),
    _Row("V100S PCIe", (r"V100S-PCIE-32GB",),
         {"fp16": 130.0, "fp32": 16.4, "tf32": 16.4},
         "NVIDIA V100S datasheet (PCIe); no bf16/tf32 tensor cores: fp32 matmuls run at the fp32 rate"),
    _Row("V100 PCIe", (r"V100-PCIE-(?:16|32)GB", r"V100 PCIE(?: \d+GB)?"),
         {"fp16": 112.0, "fp32": 14.0, "tf32": 14.0},
         "NVIDIA V100 datasheet (PCIe); no bf16/tf32 tensor cores: fp32 matmuls run at the fp32 rate"),
)
_COMPILED = tuple((row, tuple(re.compile(p) for p in row.patterns)) for row in _TABLE)

_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "tf32": "tf32", "fp8": "fp8", "float8": "fp8",
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
}


def normalise_dtype(dtype: str) -> str:
    """"torch.bfloat16"/"bfloat16"/"BF16" -> "bf16"; float8 variants and the probe's labels
    "fp8_e4m3"/"fp8_e5m2" -> "fp8" (both formats run at the one fp8 tensor rate)."""
    text = dtype.strip().lower().replace("torch.", "")
    if text.startswith(("float8", "fp8")):
        return "fp8"
    return _DTYPE_ALIASES.get(text, text)


def _normalise(device_name: str) -> str:
    text = " ".join(device_name.upper().split())
    for prefix in ("NVIDIA ", "TESLA "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def lookup_peak(device_name: str, dtype: str) -> tuple[Peak | None, str]:
    """Dense peak of a GPU for a dtype, and a reason when there is none."""
    name, want = _normalise(device_name), normalise_dtype(dtype)
    for row, patterns in _COMPILED:
        if any(p.fullmatch(name) for p in patterns):
            tflops = row.tflops.get(want)
            if tflops is None:
                return None, (f"{row.device} has no dense {want} peak in the table "
                              f"(known: {', '.join(sorted(row.tflops))}); set {ENV_PEAK}")
            return Peak(tflops * 1e12, f"{row.device}: {row.source}", want), ""
    return None, f"no peak-table entry for device {device_name!r}; set {ENV_PEAK} (TFLOP/s)"


def peak_for(device_name: str, dtype: str) -> Peak | None:
    """:func:`lookup_peak` without the reason."""
    return lookup_peak(device_name, dtype)[0]


def parse_peak_tflops(text: str) -> float:
    """Parse a user-given peak in TFLOP/s; returns FLOP/s.  ValueError with a clear message."""
    try:
        tflops = float(text.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"peak must be a number of TFLOP/s (e.g. 989.4), got {text!r}") from None
    if not tflops > 0 or tflops == float("inf"):  # `not >` also rejects NaN
        raise ValueError(f"peak must be a positive, finite number of TFLOP/s, got {text!r}")
    if tflops > _MAX_PLAUSIBLE_TFLOPS:
        raise ValueError(f"peak {text!r} TFLOP/s is implausibly large; the unit is TFLOP/s, not FLOP/s")
    return tflops * 1e12


def peak_override(environ: dict[str, str] | None = None, dtype: str | None = None) -> float | None:
    """Peak in FLOP/s from ``FLOWTOP_PEAK_TFLOPS`` (TFLOP/s), or None when unset/empty.

    The value is one number (every dtype) or ``dtype=TFLOPS`` pairs separated by commas
    (``bf16=989.4,fp32=66.9``): ``dtype`` picks its pair (None when the list does not name
    it). Raises ValueError for a malformed value (a configuration error, reported at start-up)."""
    value = config.PEAK_TFLOPS.read(environ)
    if value is None or not value.strip():
        return None
    try:
        if "=" not in value:
            return parse_peak_tflops(value)
        per_dtype: dict[str, float] = {}
        for item in value.split(","):
            name, sep, number = item.partition("=")
            if not sep or not name.strip():
                raise ValueError(f"expected dtype=TFLOPS pairs separated by commas, got {item.strip()!r}")
            per_dtype[normalise_dtype(name)] = parse_peak_tflops(number)
    except ValueError as exc:
        raise ValueError(f"{ENV_PEAK}: {exc}") from None
    return per_dtype.get(normalise_dtype(dtype)) if dtype is not None else None


# --- CPU estimate ---------------------------------------------------------------------------

def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):  # x86 / aarch64
            return set(value.split())
    return set()


#: What the clock of a CPU peak is, where it is not the maximum (cpufreq's): the peak is then
#: no upper bound, and a step may run faster than it (a VM without cpufreq read 2.60 GHz, and one
#: thread multiplied 99 GFLOP/s against an 83 GFLOP/s "peak" a core: MFU above 100 %).
BASE_CLOCK = " (base clock: turbo may beat the peak)"
CURRENT_CLOCK = " (clock now, not max: turbo may beat the peak)"


def _cpu_mhz(cpuinfo: str) -> tuple[float | None, str]:
    """The CPU's clock in MHz, and a note when it is not its maximum (see BASE_CLOCK)."""
    try:
        import psutil

        freq = psutil.cpu_freq()
        if freq is not None and freq.max and freq.max > 0:
            return float(freq.max), ""
    except Exception:  # noqa: BLE001 - psutil is optional here
        pass
    match = re.search(r"model name\s*:.*@\s*([\d.]+)\s*GHz", cpuinfo)
    if match:
        return float(match.group(1)) * 1000.0, BASE_CLOCK
    mhz = [float(v) for v in re.findall(r"cpu MHz\s*:\s*([\d.]+)", cpuinfo)]
    return (max(mhz), CURRENT_CLOCK) if mhz else (None, "")


def _cpu_cores() -> int:
    logical = os.cpu_count() or 1
    physical = logical
    try:
        import psutil

        physical = psutil.cpu_count(logical=False) or logical
    except Exception:  # noqa: BLE001
        pass
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = logical
    # FMA units belong to physical cores; scale them by the share of CPUs we may run on
    return max(1, round(physical * min(allowed, logical) / logical))


def _cpuinfo_field(cpuinfo: str, name: str) -> str:
    """The first value of ``name`` in /proc/cpuinfo text ("" when absent)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return ""


def _avx512_halved(cpuinfo: str) -> str:
    """Why this CPU executes AVX-512 on 256-bit FMA units ("" when it has the full width).

    AMD Zen 4 (family 0x19; its Zen 3 parts have no AVX-512 at all) splits each 512-bit FMA
    over two 256-bit units: 2 units × 8 fp32 lanes × 2 = 32 FLOPs/cycle, as AVX2. Zen 5
    (family 0x1A) has the full 512-bit datapath on desktop and server parts (EPYC 9xx5,
    Ryzen 9000) but not on the mobile Ryzen AI 300 series (Strix Point, Krackan Point),
    which keep 256-bit units; the Ryzen AI Max (Strix Halo) has the full width."""
    if _cpuinfo_field(cpuinfo, "vendor_id") != "AuthenticAMD":
        return ""
    try:
        family = int(_cpuinfo_field(cpuinfo, "cpu family"))
    except ValueError:
        return ""
    name = _cpuinfo_field(cpuinfo, "model name").upper()  # "Ryzen AI 9 HX 370", "RYZEN AI MAX+ 395"
    if family == 0x19:
        return "Zen 4"
    if family == 0x1A and "RYZEN AI" in name and "MAX" not in name:
        return "Zen 5 mobile"
    return ""


def _flops_per_cycle(flags: set[str], dtype: str, cpuinfo: str = "") -> tuple[int, str]:
    halved = _avx512_halved(cpuinfo) if "avx512f" in flags else ""
    if halved:
        fp32, isa = 8 * 2 * 2, f"{halved} AVX-512 on 256-bit units: 8 fp32 lanes × FMA(2) × 2 units"
    elif "avx512f" in flags:
        fp32, isa = 16 * 2 * 2, "AVX-512: 16 fp32 lanes × FMA(2) × 2 units"
    elif "avx2" in flags and "fma" in flags:
        fp32, isa = 8 * 2 * 2, "AVX2: 8 fp32 lanes × FMA(2) × 2 units"
    elif "asimd" in flags or "neon" in flags:
        fp32, isa = 4 * 2 * 2, "NEON: 4 fp32 lanes × FMA(2) × 2 units"
    else:
        fp32, isa = 8, "SSE: 4 fp32 lanes × (add + mul)"
    if dtype == "fp64":
        return fp32 // 2, isa + ", fp64 half rate"
    if dtype == "bf16":
        if "amx_bf16" in flags:
            return 1024, "AMX-BF16: 1024 FLOPs/cycle/core"
        if "avx512_bf16" in flags:
            return fp32 * 2, isa + ", AVX512-BF16 dot products at 2× fp32"
    if dtype == "fp16":
        if "amx_fp16" in flags:
            return 1024, "AMX-FP16: 1024 FLOPs/cycle/core"
        if "avx512_fp16" in flags or "asimdhp" in flags:
            return fp32 * 2, isa + ", native fp16 FMA at 2× fp32"
    return fp32, isa + (f", {dtype} at the fp32 rate" if dtype != "fp32" else "")


def cpu_peak(
    dtype: str = "fp32", *, cpuinfo: str | None = None, cores: float | None = None, mhz: float | None = None
) -> Peak:
    """Estimated CPU peak: cores × clock × FLOPs/cycle for the ISA found in /proc/cpuinfo.

    Assumes two FMA units per core at full vector width — except where AVX-512 runs on
    256-bit units (AMD Zen 4, mobile Zen 5: half the AVX-512 figure, see
    :func:`_avx512_halved`) — and the maximum clock (all-core AVX clocks are lower): an upper
    bound, labelled "estimated", where the maximum clock is known (cpufreq); else the label
    says which clock it took (see BASE_CLOCK).  Inputs can be injected for tests."""
    want = normalise_dtype(dtype)
    info = _read_cpuinfo() if cpuinfo is None else cpuinfo
    n_cores = _cpu_cores() if cores is None else cores
    clock, clock_note = (mhz, "") if mhz is not None else _cpu_mhz(info)
    if clock is None or clock <= 0:
        clock, clock_note = 2000.0, " (clock unknown: 2.0 GHz assumed)"
    per_cycle, isa = _flops_per_cycle(_cpu_flags(info), want, info)
    flops = n_cores * clock * 1e6 * per_cycle
    source = (f"estimated: {n_cores:.3g} core{'' if n_cores == 1 else 's'} × {clock / 1000:.2f} GHz{clock_note} × "
              f"{per_cycle} FLOPs/cycle ({isa})")
    return Peak(flops, source, want, "estimate")


def resolve_peak(device_name: str, dtype: str, environ: dict[str, str] | None = None) -> tuple[Peak | None, str]:
    """Override first, then CPU estimate for "cpu" devices, then the GPU table.

    A malformed override is reported as the reason (never raised from here), and once on stderr,
    as every bad FLOWTOP_* value is: the snapshot's MFU reason alone was easy to miss."""
    try:
        override = peak_override(environ, dtype)
    except ValueError as exc:
        warn_once("peak-override", f"{exc}; no peak, so no MFU (fix or unset {ENV_PEAK})")
        return None, str(exc)
    if override is not None:
        return Peak(override, f"override ({ENV_PEAK})", normalise_dtype(dtype), "override"), ""
    if device_name.strip().lower().startswith("cpu"):
        return cpu_peak(dtype), ""
    return lookup_peak(device_name, dtype)


def markdown_table() -> str:
    """The GPU peak table as Markdown (docs/design.md, "Peaks", holds it; a test compares them)."""
    lines = ["| device | bf16 / fp16 | tf32 | fp32 | fp8 | source |", "|---|---|---|---|---|---|"]
    for row in _TABLE:
        t = row.tflops
        cells = [f"{t[d]:g}" if d in t else "—" for d in ("bf16", "tf32", "fp32", "fp8")]
        if "bf16" not in t and "fp16" in t:
            cells[0] = f"{t['fp16']:g} (fp16 only)"
        lines.append(f"| {row.device} | {' | '.join(cells)} | {row.source} |")
    return "\n".join(lines) + "\n"
