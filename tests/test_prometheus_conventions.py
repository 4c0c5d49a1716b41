"""The exporter's names, labels, units and help against Prometheus' conventions (docs/design.md "Export conventions",
prometheus.io "Metric and label naming", promtool's lint), on a real scrape of two jobs (one above
the rank cap) over HTTP, in both exposition formats."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from flowtop.export.exporter import ExportPolicy
from flowtop.export.metrics_http import HostPort, MetricsServer
from flowtop.monitor.selfload import LoadMeter
from flowtop.monitor.snapshot import MonitorSnapshot
from synthetic.cluster import cluster_job
from test_prometheus import http_get

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
#: Labels Prometheus sets on every scraped series itself (it renames exported ones exported_*).
TARGET_LABELS = {"job", "instance"}
#: Units a name may end in, and the OpenMetrics UNIT that must come with them.
UNITS = ("seconds", "ratio", "bytes", "cores")


def scrapes() -> tuple[str, str]:
    """Prometheus text and OpenMetrics of one snapshot: a job per rank, a job per node."""
    jobs = (cluster_job(16, job="small"), cluster_job(24, job="big"))
    snap = MonitorSnapshot(taken_at=5000.0, listen="tcp://127.0.0.1:5759", jobs=jobs, received=10, rejected=1)
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: snap, ExportPolicy(max_ranks=20))
    where = server.start()
    try:
        return http_get(where.url()), http_get(where.url(), OPENMETRICS)
    finally:
        server.stop()


def test_labels_names_and_units() -> None:
    text, om = scrapes()
    problems: list[str] = []
    fams = list(parse_openmetrics(om))
    assert {f.name for f in fams} >= {"flowtop_rank_mfu_ratio", "flowtop_node_mfu_min_ratio", "flowtop_job_hints"}
    for fam in fams:
        if not fam.name.startswith("flowtop_"):
            continue
        if not re.fullmatch(r"flowtop_[a-z0-9_]+", fam.name):
            problems.append(f"{fam.name}: not snake_case under the flowtop_ prefix")
        if not fam.documentation:
            problems.append(f"{fam.name}: no help text")
        for unit in UNITS:
            if fam.name.endswith("_" + unit) and fam.unit != unit:
                problems.append(f"{fam.name}: ends in _{unit} without UNIT {unit}")
        if fam.unit and not fam.name.endswith("_" + fam.unit):
            problems.append(f"{fam.name}: UNIT {fam.unit} is not its suffix")
        if fam.type != "counter" and fam.name.endswith("_total"):
            problems.append(f"{fam.name}: a {fam.type} named _total")
        for s in fam.samples:
            if fam.type == "counter" and not s.name.endswith(("_total", "_created")):
                problems.append(f"{s.name}: counter sample without _total")
            for label in s.labels:
                if label in TARGET_LABELS:
                    problems.append(f"{fam.name}: label {label!r} is Prometheus' own (stored as exported_{label})")
                if label.startswith("__"):
                    problems.append(f"{fam.name}: label {label!r} is reserved")
                if label == "quantile" and fam.type != "summary" or label == "le" and "histogram" not in fam.type:
                    problems.append(f"{fam.name}: label {label!r} on a {fam.type}")
            if fam.unit == "ratio" and not 0.0 <= s.value <= 1.0:
                problems.append(f"{s.name}{s.labels}: ratio {s.value} outside 0-1")
    # The text format says the same (it carries no UNIT lines: the names do).
    assert {f.name for f in parse_text(text) if f.name.startswith("flowtop_")} >= {
        f.name for f in fams if f.name.startswith("flowtop_") and f.type != "info"}
    assert not problems, "\n".join(sorted(set(problems)))


def test_the_monitor_cpu_is_in_cores_not_a_ratio() -> None:
    """CPU seconds per second passes 1 with the ZeroMQ I/O thread beside the interpreter: a
    _ratio would promise 0-1."""
    from flowtop.export.exporter import load_families

    clock = iter([0.0, 0.0, 1.0, 1.5])  # wall, cpu; wall, cpu: 1.5 CPU-s in 1 s
    meter = LoadMeter(wall=lambda: next(clock), cpu=lambda: next(clock))
    meter.read()
    cpu: Any = load_families(None, meter)[0]
    assert [s.value for s in cpu.samples] == [1.5]
    assert cpu.unit == "cores" and cpu.name == "flowtop_monitor_cpu_cores"


def test_promtool_lint_passes() -> None:
    """promtool (Prometheus' own linter) where installed: the Debian package prometheus has it."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    text, _ = scrapes()
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_job_tokens_help_says_how_tokens_are_counted() -> None:
    """flowtop_job_tokens_per_second counts a data-parallel replica's tokens once (its tensor-
    parallel ranks see the same tokens, only its first pipeline stage embeds them), as the JSON's
    tokens_per_s_basis says; its HELP said "summed over the ranks", which a TP 2 job's figure is
    not (half of that sum)."""
    from flowtop.export.exporter_metrics import JOB_GAUGES

    help_text = {name: text for name, _, text, _ in JOB_GAUGES}["flowtop_job_tokens_per_second"]
    assert "once per data-parallel replica" in help_text
    assert "summed over the ranks" not in help_text


def test_the_jobs_peak_says_its_kind_and_dtype_in_bounded_labels() -> None:
    """Nothing in the metrics said that a peak (so the MFU) was a CPU estimate, an override or a
    datasheet's: an info series with a one-word source (the source text itself is unbounded),
    the word the probe chose with the peak (probe.flops.peaks), carried by the wire."""
    import dataclasses

    from prometheus_client.openmetrics.exposition import generate_latest

    from flowtop.export.exporter import snapshot_families
    from flowtop.monitor.accounting import job_flops, rank_flops
    from probe.flops.peaks import resolve_peak
    from probe.wire import flops_report

    def view(device: str, environ: dict[str, str] | None = None, said: bool = True) -> Any:
        peak, why = resolve_peak(device, "bf16", environ or {})
        msg = {"model_flops": 1e12, "executed_flops": 1e12, "tokens": 1000, "dtype": "bf16",
               "peak_flops": peak.flops if peak else None, "peak_source": peak.source if peak else f"unknown: {why}",
               **({"peak_kind": peak.kind if peak else "none"} if said else {})}
        return rank_flops(flops_report(msg), step_time_s=0.5)

    def kinds(*views: Any) -> list[dict[str, str]]:
        job = cluster_job(len(views), job="j")
        ranks = tuple(dataclasses.replace(r, flops=v) for r, v in zip(job.ranks, views))
        job = dataclasses.replace(job, ranks=ranks, flops=job_flops(views))
        snap = MonitorSnapshot(taken_at=1.0, listen="tcp://127.0.0.1:5759", jobs=(job,), received=0, rejected=0)

        class Families:
            def collect(self) -> list[Any]:
                return snapshot_families(snap)

        (fam,) = [f for f in parse_openmetrics(generate_latest(Families()).decode()) if f.name == "flowtop_job_peak"]
        assert fam.type == "info"
        return [s.labels for s in fam.samples]

    h200, cpu = view("NVIDIA H200"), view("cpu")
    assert kinds(h200, h200) == [{"train_job": "j", "source": "table", "dtype": "bf16"}]
    assert kinds(cpu, cpu)[0]["source"] == "estimate"
    assert kinds(view("NVIDIA H200", {"FLOWTOP_PEAK_TFLOPS": "500"}))[0]["source"] == "override"
    monitors = rank_flops(flops_report({"model_flops": 1e12, "executed_flops": 1e12, "tokens": 1000, "dtype": "bf16",
                                        "peak_flops": 1e15, "peak_source": "NVIDIA H200 SXM: datasheet",
                                        "peak_kind": "table"}), step_time_s=0.5, peak_override=2e15)
    assert monitors is not None and monitors.peak_kind == "override"  # --peak-tflops on the monitor
    assert kinds(cpu, h200)[0]["source"] == "mixed"
    assert kinds(view("Tesla T4"))[0]["source"] == "none"
    assert kinds(view("NVIDIA H200", said=False))[0]["source"] == "unknown"  # a probe before wire 1.4


def test_a_peak_from_the_precision_mix_says_its_kind_not_the_step_dtypes() -> None:
    """MFU divides by the precision mix's peak (peak_by_dtype) where the probe sends one; the step
    dtype's peak_kind speaks only of peak_flops. A V100 PCIe running a bf16-autocast step whose
    matmuls ran in fp16 has no bf16 peak (peak_kind "none") but a table fp16 peak, 112 TFLOP/s:
    MFU = 1e12 FLOP / 0.5 s / 112e12 FLOP/s = 1/56, of a "table" peak (it said "none")."""
    from flowtop.monitor.accounting import job_flops, rank_flops
    from probe.flops import precision
    from probe.flops.peaks import resolve_peak
    from probe.wire import RankKey, decode, encode, flops_report

    def message(environ: dict[str, str]) -> dict[str, Any]:
        peak, why = resolve_peak("Tesla V100-PCIE-16GB", "bf16", environ)
        assert peak is None  # no bf16 tensor cores: the step dtype has no peak
        by_dtype = {"fp16": 8 * 10**11, "fp32": 2 * 10**11} if environ else {"fp16": 10**12}
        return {"step": 3, "model_flops": 1e12, "executed_flops": 1e12, "tokens": 1000, "dtype": "bf16",
                "attention": "full", "uncounted": {},
                "peak_flops": None, "peak_source": f"unknown: {why}", "peak_kind": "none",
                **precision.message_fields(by_dtype, by_dtype, on_cpu=False, device_name="Tesla V100-PCIE-16GB",
                                           cpu_cores=1.0, environ=environ)}

    msg = message({})
    assert msg["peak_by_dtype"] == {"fp16": 112e12} and msg["peak_by_dtype_kind"] == "table"
    frame = decode(encode("flops", RankKey("j", "h", 1, 0, 0), 1, 1.0, msg))  # the schema lets it through
    view = rank_flops(flops_report(frame.fields), step_time_s=0.5)
    assert view is not None and view.mfu == pytest.approx(1 / 56) and view.peak_flops == pytest.approx(112e12)
    assert view.peak_kind == "table"
    job = job_flops([view, view])
    assert job is not None and job.peak_kind == "table"
    # A per-dtype override for fp16 beside the table's fp32 (14 TFLOP/s): peaks of two kinds.
    # P_mix = 1e12 / (8e11/100e12 + 2e11/14e12) = 1e12 / (0.008 + 1/70) = 44.87... TFLOP/s
    mixed = message({"FLOWTOP_PEAK_TFLOPS": "fp16=100"})
    assert mixed["peak_by_dtype"] == {"fp16": 100e12, "fp32": 14e12} and mixed["peak_by_dtype_kind"] == "mixed"
    view = rank_flops(flops_report(mixed), step_time_s=0.5)
    assert view is not None and view.peak_flops == pytest.approx(1e12 / (0.008 + 1 / 70))
    assert view.mfu == pytest.approx(2e12 / (1e12 / (0.008 + 1 / 70))) and view.peak_kind == "mixed"
    # An older probe (no peak_by_dtype_kind) and a step dtype that said "none": not "none"
    older = {k: v for k, v in msg.items() if k != "peak_by_dtype_kind"}
    view = rank_flops(flops_report(older), step_time_s=0.5)
    assert view is not None and view.mfu == pytest.approx(1 / 56) and view.peak_kind == "unknown"
