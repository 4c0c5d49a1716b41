"""Pure helpers of the UI: number formats, colours, bar rounding, adapters (no app run)."""

from __future__ import annotations

import dataclasses

import pytest

from flowtop.monitor import telemetry as tm
from flowtop.monitor.kernels.merge import CumulativeKernels
from flowtop.tui.screens.snapshot_screen import pick_rank
from flowtop.tui.widgets._format import fmt_pct, fmt_si, fmt_time, mfu_style
from flowtop.tui.widgets._kernels import display_name, job_view, window_view
from flowtop.tui.widgets.category_bar import bar_segments
from flowtop.tui.widgets.hints_panel import hint_key, ordered
from synthetic.replay import synthetic_hints, synthetic_snapshot, synthetic_window


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "–"), (0.00083, "830µs"), (0.0042, "4.20ms"), (0.0123, "12.3ms"), (0.236, "236ms"),
     (0.9996, "1.00s"), (12.34, "12.3s"), (123.0, "2.0m"), (5400.0, "1.5h"), (float("nan"), "–")],
)
def test_fmt_time(seconds: float | None, text: str) -> None:
    assert fmt_time(seconds) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (12.3, "12.3"), (999.6, "1.00k"), (1.02e6, "1.02M"), (999_960.0, "1.00M"),
     (4.12e14, "412T"), (2.5e15, "2.50P"), (None, "–")],
)
def test_fmt_si_three_significant_digits(value: float | None, text: str) -> None:
    assert fmt_si(value) == text


def test_fmt_si_fixed_digits_and_pct() -> None:
    assert fmt_si(989.4e12, "F/s", 1) == "989.4TF/s"
    assert fmt_pct(0.4123) == "41.2%"
    assert fmt_pct(None) == "–"


def test_mfu_colours_higher_is_better_and_impossible_is_red() -> None:
    assert [mfu_style(x) for x in (0.55, 0.40, 0.3, 0.19, 1.2, None)] == [
        "green", "green", "yellow", "red", "bold red", "dim"]


def test_bar_segments_add_up_and_round_by_largest_remainder() -> None:
    cats = (("gemm", 1000.0), ("attention", 700.0), ("communication", 650.0))
    cells = bar_segments(cats, 4000.0, 78)
    assert sum(n for _, n in cells) == 78
    # exact: 19.5, 13.65, 12.675, idle 32.175 -> floors 19+13+12+32 = 76; the two cells left
    # go to the largest remainders (.675 communication, .65 attention), not to gemm's .5.
    assert cells == [("gemm", 19), ("attention", 14), ("communication", 13), ("idle", 32)]
    # Concurrent streams can exceed the step: scaled down, no idle cell.
    assert bar_segments((("gemm", 600.0), ("communication", 600.0)), 1000.0, 10) == [("gemm", 5), ("communication", 5)]
    assert bar_segments(cats, 0.0, 10) == []


def test_hints_ordered_by_severity_then_impact() -> None:
    hints = ordered(synthetic_hints())
    assert [h.id for h in hints] == ["gpu-idle", "straggler", "info-attn"]
    more = dataclasses.replace(hints[1], id="w2", impact=0.3)
    assert [h.id for h in ordered((*hints, more))] == ["gpu-idle", "w2", "straggler", "info-attn"]
    assert hint_key(hints[1]) == "straggler|rank|rank 1"


def test_telemetry_percent_keys_become_fractions() -> None:
    tel = synthetic_snapshot(120, with_kernels=False).jobs[0].ranks[0].telemetry
    assert tm.fraction(tel, tm.TENSOR) == pytest.approx(0.5)
    assert tm.fraction(tel, tm.GPU_UTIL) == pytest.approx(1.0)
    assert tm.fraction(tel, "nvlink_tx_bytes_s") is None
    assert tm.reason(tel, "nvlink_tx_bytes_s") == "GPM metric not supported on this device"
    assert tm.fraction(None, tm.TENSOR) is None
    assert tm.series_fraction(tm.TENSOR, (50.0, 25.0)) == (0.5, 0.25)
    assert tm.value_text("power_w", 612.4) == "612W"


def test_display_name_keeps_what_a_cudnn_kernel_does() -> None:
    name = "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0"
    assert display_name(name) == "cudnn_sdpa_sm90_flash_bprop"
    assert display_name("nvjet_sm90_tst_64x48_64x15_2x4_h_bz_TNT") == "nvjet_sm90_tst_64x48_64x15_2x4_h_bz_TNT"


def test_window_view_reads_the_window_and_its_cumulative_rows() -> None:
    from flowtop.monitor.kernels.aggregate import aggregate

    stats = aggregate(synthetic_window(0, 120, 4000.0))
    cum = CumulativeKernels()
    cum.add(stats)
    cum.add(stats)
    view = window_view(stats, cum.rows())  # the rows, as a RankSnapshot holds them
    assert view is not None
    top = view.rows[0]
    assert (top.short, top.calls, top.total_us, top.cum_us, top.cum_calls, top.cum_windows) == (
        "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 8, 720.0, 1440.0, 16, 2)
    assert top.op == stats.kernels[0].op and top.low == top.name.lower()
    bare = window_view(stats)
    assert bare is not None and bare.rows[0].cum_us is None
    assert (bare.busy_us, bare.comm_us, bare.launches) == (stats.anatomy.busy_us, 680.0, 44)
    assert bare.idle_gaps[0][:2] == (stats.anatomy.gaps[0].start_us, stats.anatomy.gaps[0].dur_us)
    assert window_view(None) is None and job_view(None) is None


def test_pick_rank_prefers_live_then_newest_incarnation() -> None:
    job = synthetic_snapshot(120, with_kernels=False).jobs[0]
    r0 = job.ranks[0]
    old = dataclasses.replace(r0, status="done", incarnation=0, pid=1)
    new = dataclasses.replace(r0, status="live", incarnation=1, pid=2)
    later = dataclasses.replace(r0, status="stale", incarnation=2, pid=3)
    j = dataclasses.replace(job, ranks=(old, later, new, job.ranks[1]))
    assert pick_rank(j, 0) is new
    assert pick_rank(dataclasses.replace(j, ranks=(old, later)), 0) is later
    assert pick_rank(j, 7) is None


def test_header_without_flops_says_why() -> None:
    from flowtop.tui.widgets.job_header import JobHeader

    snap = synthetic_snapshot(120, with_kernels=False)
    job = snap.jobs[0]
    none = JobHeader.render_text(snap, dataclasses.replace(job, flops=None), 0, 1).plain.splitlines()
    assert none[2:] == ["MFU n/a (no FLOP count yet)", "HFU –"]
    assert job.flops is not None
    no_peak = dataclasses.replace(job.flops, mfu=None, hfu=None, mfu_reason="unknown GPU: set --peak")
    lines = JobHeader.render_text(snap, dataclasses.replace(job, flops=no_peak), 1, 3).plain.splitlines()
    assert lines[0].startswith("job gpt-demo [2/3, n: next]  ranks 2/2")
    assert lines[2:] == ["MFU n/a (unknown GPU: set --peak)", "HFU n/a (unknown GPU: set --peak)"]
    waiting = JobHeader.render_text(dataclasses.replace(snap, jobs=()), None, 0, 0).plain
    assert waiting == "flowtop waiting for ranks on tcp://127.0.0.1:5759"


def test_job_kernel_title_without_merge() -> None:
    from flowtop.tui.screens.job_kernel_screen import job_kernel_title

    assert job_kernel_title("gpt", None, 1, False).plain == (
        "job kernels · gpt\nneeds kernel windows from 2+ ranks (k on a rank asks for one)")


def test_job_kernel_title_shows_the_order_and_uneven_count_at_80_columns() -> None:
    """A 36-character job id pushed "◆ uneven: N · by max − min" off screen at 80-100 columns."""
    from flowtop.tui.screens.job_kernel_screen import job_kernel_title
    from flowtop.tui.widgets._kernels import JobKernelView

    uuid = "3052fd49-bfe9-4c2a-9d1e-5b1e2c3d4e5f"
    view = JobKernelView(ranks=(0, 1), rows=())
    first, second = job_kernel_title(uuid, view, 2, False).plain.splitlines()
    assert first == "job kernels · 3052fd49-bfe…b1e2c3d4e5f · ◆ uneven: 0 · by max − min"
    assert len(first) <= 80 - 2  # the title's padding
    assert second == "2/2 ranks merged · time per window, mean of all windows"


def test_a_node_rows_mfu_under_half_a_percent_is_not_zero() -> None:
    """A node row gives min/median MFU in whole percents (the column's 6 characters); a CPU or
    launch-bound job's 0.4 % read "0/0%" there, as if nothing ran, beside ranks showing 0.4%."""
    from flowtop.monitor.rankview import NodeGroup
    from flowtop.tui.widgets._rank_cells import COLUMNS, node_cells

    class Row:  # what node_cells reads of a NodeRow
        open = False

        def __init__(self, lo: float, med: float) -> None:
            self.group = NodeGroup("n1", (), "live", lo, med, 0, 10, 0.2, None, None, None)

    mfu = [c.key for c in COLUMNS].index("mfu")
    assert node_cells(Row(0.004, 0.0045))[mfu][0] == "<1/<1%"  # type: ignore[arg-type]
    assert node_cells(Row(0.0, 0.007))[mfu][0] == "0/1%"  # type: ignore[arg-type]
    assert node_cells(Row(0.005, 0.35))[mfu][0] == "<1/35%"  # type: ignore[arg-type]  # 0.5 rounds to even
    assert node_cells(Row(0.35, 0.454))[mfu][0] == "35/45%"  # type: ignore[arg-type]


def test_a_sorted_column_header_fits_its_width_with_the_arrow() -> None:
    from flowtop.tui.widgets._rank_cells import COLUMNS, MFU_BF16, coords_column

    for col in (*COLUMNS, MFU_BF16, coords_column(1)):
        assert col.header() == col.label
        assert len(col.header("▼")) <= col.width, col
    assert [c.header("▼") for c in COLUMNS if c.key in ("step_time", "flops", "mfu")] == ["▼time", "▼FLOPs", "▼MFU"]
