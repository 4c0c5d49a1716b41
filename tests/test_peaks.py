"""Dense peak table (docs/design.md, "Peaks"), dtype selection, override and CPU estimate."""

from __future__ import annotations

import collections

import pytest

from probe import _log
from probe.flops.peaks import (
    ENV_PEAK,
    cpu_peak,
    lookup_peak,
    normalise_dtype,
    parse_peak_tflops,
    peak_for,
    peak_override,
    resolve_peak,
)

T = 1e12


@pytest.mark.parametrize(
    ("nvml_name", "bf16", "tf32", "fp32", "fp8"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4, 494.7, 66.9, 1978.9),
        ("NVIDIA H200", 989.4, 494.7, 66.9, 1978.9),
        ("NVIDIA H100 PCIe", 756.5, 378.0, 51.2, 1513.0),
        ("NVIDIA H100 NVL", 835.0, 418.0, 60.0, 1670.0),
        ("NVIDIA H200 NVL", 835.0, 418.0, 60.0, 1670.0),
        ("NVIDIA A100-SXM4-40GB", 312.0, 156.0, 19.5, None),
        ("NVIDIA A100-SXM4-80GB", 312.0, 156.0, 19.5, None),
        ("NVIDIA A100-PCIE-40GB", 312.0, 156.0, 19.5, None),
        ("NVIDIA A100 80GB PCIe", 312.0, 156.0, 19.5, None),
        ("NVIDIA L4", 121.0, 60.0, 30.3, 242.5),
        ("NVIDIA L40S", 362.05, 183.0, 91.6, 733.0),
        ("NVIDIA A10", 125.0, 62.5, 31.2, None),
        ("NVIDIA GeForce RTX 4090", 165.2, 82.6, 82.6, 330.3),
        ("NVIDIA B200", 2250.0, 1125.0, 75.0, 4500.0),
    ],
)
def test_table_rows(nvml_name: str, bf16: float, tf32: float, fp32: float, fp8: float | None) -> None:
    for dtype, tflops in (("bf16", bf16), ("fp16", bf16), ("tf32", tf32), ("fp32", fp32), ("fp8", fp8)):
        peak, reason = lookup_peak(nvml_name, dtype)
        if tflops is None:
            assert peak is None and "no dense fp8 peak" in reason
        else:
            assert peak is not None and reason == ""
            assert peak.flops == pytest.approx(tflops * T)
            assert peak.dtype == dtype and peak.source


def test_unknown_devices_return_reason() -> None:
    for name in ("NVIDIA A10G", "NVIDIA L40", "NVIDIA GeForce RTX 4090 D", "NVIDIA H100", "AMD Instinct MI300X", ""):
        peak, reason = lookup_peak(name, "bf16")
        assert peak is None, name
        assert "no peak-table entry" in reason and ENV_PEAK in reason


def test_v100_has_no_bf16_and_tf32_runs_at_fp32_rate() -> None:
    peak, reason = lookup_peak("Tesla V100-SXM2-16GB", "bf16")
    assert peak is None and "V100" in reason
    assert peak_for("Tesla V100-SXM2-32GB", "fp16").flops == pytest.approx(125 * T)
    assert peak_for("Tesla V100-SXM2-32GB", "tf32").flops == peak_for("Tesla V100-SXM2-32GB", "fp32").flops
    assert peak_for("Tesla V100-PCIE-16GB", "fp16").flops == pytest.approx(112 * T)


def test_dtype_aliases() -> None:
    assert normalise_dtype("torch.bfloat16") == "bf16"
    assert normalise_dtype("Float16") == "fp16"
    assert normalise_dtype("float8_e4m3fn") == "fp8"
    assert peak_for("NVIDIA H200", "torch.bfloat16").flops == pytest.approx(989.4 * T)
    assert peak_for("NVIDIA H200", "fp64") is None


def test_sparse_figures_never_appear() -> None:
    # the H100 SXM datasheet's 1979 bf16 / 3958 fp8 are sparse (2×); only dense may come back
    assert peak_for("NVIDIA H100 80GB HBM3", "bf16").flops < 1000 * T
    assert peak_for("NVIDIA H100 80GB HBM3", "fp8").flops < 2000 * T


def test_override_from_environment() -> None:
    assert peak_override({}) is None
    assert peak_override({ENV_PEAK: "  "}) is None
    assert peak_override({ENV_PEAK: "400"}) == pytest.approx(400 * T)
    assert peak_override({ENV_PEAK: "12.5"}) == pytest.approx(12.5 * T)
    for bad, message in (("abc", "number of TFLOP/s"), ("-5", "positive"), ("0", "positive"),
                         ("nan", "positive"), ("inf", "positive"), ("9.894e14", "not FLOP/s")):
        with pytest.raises(ValueError, match=message) as info:
            peak_override({ENV_PEAK: bad})
        assert ENV_PEAK in str(info.value)
    with pytest.raises(ValueError):
        parse_peak_tflops("")


def test_resolve_peak_order(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_log, "_seen", set())
    peak, _ = resolve_peak("NVIDIA H200", "bf16", {ENV_PEAK: "500"})
    assert peak.flops == pytest.approx(500 * T) and "override" in peak.source
    peak, reason = resolve_peak("NVIDIA H200", "bf16", {ENV_PEAK: "fast"})
    assert peak is None and ENV_PEAK in reason
    resolve_peak("NVIDIA H200", "bf16", {ENV_PEAK: "fast"})  # said once, as every bad value
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ENV_PEAK in err and "'fast'" in err and "no MFU" in err, err
    assert resolve_peak("NVIDIA H200", "bf16", {})[0].flops == pytest.approx(989.4 * T)
    assert "estimated" in resolve_peak("cpu", "fp32", {})[0].source


X86_AVX512 = "model name\t: Some Xeon @ 2.00GHz\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16\n"
X86_AVX2 = "model name\t: Desktop CPU\ncpu MHz\t\t: 3000.000\ncpu MHz\t\t: 3500.000\nflags\t\t: sse2 avx avx2 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimdhp\n"


def test_cpu_peak_estimates() -> None:
    avx512 = cpu_peak("fp32", cpuinfo=X86_AVX512, cores=8, mhz=2000.0)
    assert avx512.flops == 8 * 2.0e9 * 64  # cores × clock × 16 lanes × 2 (FMA) × 2 units
    assert avx512.source.startswith("estimated") and avx512.dtype == "fp32"
    assert cpu_peak("bf16", cpuinfo=X86_AVX512, cores=8, mhz=2000.0).flops == 8 * 2.0e9 * 128
    assert cpu_peak("fp64", cpuinfo=X86_AVX512, cores=8, mhz=2000.0).flops == 8 * 2.0e9 * 32

    avx2 = cpu_peak("bf16", cpuinfo=X86_AVX2, cores=4, mhz=3500.0)
    assert avx2.flops == 4 * 3.5e9 * 32  # no avx512_bf16: bf16 at the fp32 rate
    assert "fp32 rate" in avx2.source

    neon = cpu_peak("fp32", cpuinfo=ARM, cores=2, mhz=1000.0)
    assert neon.flops == 2 * 1.0e9 * 16
    assert cpu_peak("fp16", cpuinfo=ARM, cores=2, mhz=1000.0).flops == 2 * 1.0e9 * 32
    assert cpu_peak("fp32", cpuinfo="", cores=1, mhz=1000.0).flops == 1.0e9 * 8  # plain SSE


def test_cpu_clock_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    monkeypatch.setattr(psutil, "cpu_freq", lambda: None)
    named = cpu_peak("fp32", cpuinfo=X86_AVX512, cores=1)
    assert named.flops == 2.0e9 * 64  # "@ 2.00GHz"
    now = cpu_peak("fp32", cpuinfo=X86_AVX2, cores=1)
    assert now.flops == 3.5e9 * 32  # max "cpu MHz"
    # Neither is the maximum clock: the label says the peak is no upper bound (a VM's 2.60 GHz
    # "cpu MHz" made a peak one thread's matmul beat by 20 %: MFU above 100 %).
    assert "base clock: turbo may beat the peak" in named.source
    assert "clock now, not max: turbo may beat the peak" in now.source
    unknown = cpu_peak("fp32", cpuinfo="flags : avx2 fma", cores=1)
    assert unknown.flops == 2.0e9 * 32 and "assumed" in unknown.source


def test_a_cpu_peak_from_the_maximum_clock_says_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    freq = collections.namedtuple("freq", "current min max")(2000.0, 1000.0, 4000.0)  # psutil's fields
    monkeypatch.setattr(psutil, "cpu_freq", lambda: freq)
    peak = cpu_peak("fp32", cpuinfo=X86_AVX2, cores=1)
    assert peak.flops == 4.0e9 * 32
    assert "turbo" not in peak.source and "×" in peak.source


def test_cpu_peak_on_this_machine_is_labelled() -> None:
    peak = cpu_peak("fp32")
    assert peak.flops > 0 and "estimated" in peak.source


def _amd(family: int, model: int, name: str, flags: str = "fpu sse2 avx2 fma avx512f avx512_bf16") -> str:
    """/proc/cpuinfo of one AMD logical CPU (the fields the estimate reads)."""
    return (f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: {name}\ncpu MHz\t\t: 2400.000\nflags\t\t: {flags}\n")


ZEN4_GENOA = _amd(25, 17, "AMD EPYC 9654 96-Core Processor")
ZEN4_RAPHAEL = _amd(25, 97, "AMD Ryzen 9 7950X 16-Core Processor")
ZEN3_MILAN = _amd(25, 1, "AMD EPYC 7763 64-Core Processor", flags="fpu sse2 avx avx2 fma")
ZEN5_TURIN = _amd(26, 2, "AMD EPYC 9575F 64-Core Processor")
ZEN5_STRIX = _amd(26, 36, "AMD Ryzen AI 9 HX 370 w/ Radeon 890M")
ZEN5_STRIX_HALO = _amd(26, 112, "AMD RYZEN AI MAX+ 395 w/ Radeon 8060S")


@pytest.mark.parametrize(("cpuinfo", "fp32_per_cycle"), [
    # Zen 4: AVX-512 on 2 × 256-bit FMA units = 2 units × 8 lanes × 2 (FMA), not 64.
    (ZEN4_GENOA, 32), (ZEN4_RAPHAEL, 32),
    (ZEN3_MILAN, 32),  # family 0x19 too, but AVX2 only: 2 × 8 × 2
    (ZEN5_TURIN, 64),  # full 512-bit datapath: 2 × 16 × 2
    (ZEN5_STRIX, 32),  # mobile Zen 5 keeps 256-bit units
])
def test_amd_cpu_peaks_by_generation(cpuinfo: str, fp32_per_cycle: int) -> None:
    # Hand-derived: cores × GHz × FLOPs/cycle. 96 cores × 2.4 GHz × 32 = 7.3728 TFLOP/s on Genoa.
    fp32 = cpu_peak("fp32", cpuinfo=cpuinfo, cores=96, mhz=2400.0)
    assert fp32.flops == 96 * 2.4e9 * fp32_per_cycle
    assert f"× {fp32_per_cycle} FLOPs/cycle" in fp32.source
    # fp64 at half the fp32 rate; bf16 dot products (avx512_bf16) at twice it, where present.
    assert cpu_peak("fp64", cpuinfo=cpuinfo, cores=96, mhz=2400.0).flops == 96 * 2.4e9 * fp32_per_cycle // 2
    bf16 = cpu_peak("bf16", cpuinfo=cpuinfo, cores=96, mhz=2400.0).flops
    assert bf16 == 96 * 2.4e9 * fp32_per_cycle * (2 if "avx512_bf16" in cpuinfo else 1)


def test_zen4_peak_figures_and_label() -> None:
    genoa = cpu_peak("fp32", cpuinfo=ZEN4_GENOA, cores=96, mhz=2400.0)
    assert genoa.flops == pytest.approx(7.3728e12)  # 96 × 2.4e9 × 32
    assert "Zen 4 AVX-512 on 256-bit units" in genoa.source
    assert cpu_peak("bf16", cpuinfo=ZEN4_GENOA, cores=96, mhz=2400.0).flops == pytest.approx(14.7456e12)
    assert cpu_peak("fp64", cpuinfo=ZEN4_GENOA, cores=96, mhz=2400.0).flops == pytest.approx(3.6864e12)
    # Strix Halo (Ryzen AI Max) has the desktop 512-bit FPU: the mobile exception does not apply.
    assert cpu_peak("fp32", cpuinfo=ZEN5_STRIX_HALO, cores=16, mhz=5100.0).flops == 16 * 5.1e9 * 64
    # An Intel AVX-512 part keeps the full width whatever its family number.
    intel = X86_AVX512.replace("model name", "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name")
    assert cpu_peak("fp32", cpuinfo=intel, cores=8, mhz=2000.0).flops == 8 * 2.0e9 * 64


def test_ranks_sharing_fewer_cores_share_their_peak() -> None:
    """4 unpinned ranks on a 2-core host each claimed a whole core (the share was floored at 1):
    the job's peak was twice the machine's and its MFU half the truth (a new user's trial). A
    rank's share may be a fraction of a core; a pinned rank owns its CPU set; threads cap it."""
    from probe.flops.accounting import cpu_cores_of_rank

    assert cpu_cores_of_rank(4, host=2, allowed=2, threads=1) == 0.5
    assert cpu_cores_of_rank(2, host=2, allowed=2, threads=1) == 1.0
    assert cpu_cores_of_rank(4, host=16, allowed=2, threads=4) == 2.0  # pinned to 2 CPUs of its own
    # a CPU set larger than a rank's share of the host (one taskset of 8 around a 4-rank launch on
    # 16, a review): its share of the host, 4, not 8 (the set's 2 each is not known from inside)
    assert cpu_cores_of_rank(4, host=16, allowed=8, threads=8) == 4.0
    assert cpu_cores_of_rank(4, host=16, allowed=4, threads=8) == 4.0  # a set of its own
    assert cpu_cores_of_rank(2, host=16, allowed=16, threads=4) == 4.0  # its threads, under its share of 8
    half = cpu_peak("fp32", cpuinfo=X86_AVX2, cores=0.5, mhz=2000.0)
    assert half.flops == 0.5 * cpu_peak("fp32", cpuinfo=X86_AVX2, cores=1, mhz=2000.0).flops
    assert half.source.startswith("estimated: 0.5 cores × 2.00 GHz")
