"""Pilot tests of the Textual UI over a synthetic 2-rank stream (ReplaySource), its FLOP figures
from flowtop.monitor.accounting (see _accounted) and checked against hand formulas."""

from __future__ import annotations

import dataclasses
from typing import Any
from pathlib import Path

import pytest

from flowtop.monitor import accounting
from flowtop.tui.app import FlowtopApp, SnapshotSource
from synthetic.replay import ReplaySource, synthetic_snapshot, synthetic_stream
from flowtop.monitor.snapshot import History, MonitorSnapshot
from textual.widgets import Label, Sparkline, Static

from flowtop.tui.screens.help_screen import HelpScreen
from flowtop.tui.screens.job_kernel_screen import JobKernelScreen
from flowtop.tui.screens.kernel_screen import KernelScreen
from flowtop.tui.screens.main_screen import MainScreen
from flowtop.tui.screens.rank_detail_screen import RankDetailScreen
from flowtop.tui.widgets.category_bar import CategoryBar
from flowtop.tui.widgets.flops_panel import FlopsPanel
from flowtop.tui.widgets.hints_panel import HintsPanel
from flowtop.tui.widgets.job_header import JobHeader
from flowtop.tui.widgets.job_kernel_table import JobKernelTable
from flowtop.tui.widgets.kernel_anatomy import KernelAnatomy
from flowtop.tui.widgets.kernel_table import KernelTable
from flowtop.tui.widgets.metric_sparkline import MetricSparkline
from flowtop.tui.widgets.rank_table import RankTable
from flowtop.tui.widgets.telemetry_panel import TelemetryPanel
from probe.wire import flops_report

SIZE = (80, 24)

# The synthetic job's inputs (tests/synthetic/replay.py): per rank and step, 2.0e12 model FLOPs and
# 1.12 x that executed over 4,096 tokens, bf16 against the H200's 989.4 TF/s dense peak; rank 0
# steps in 4.0 ms, rank 1 in 4.6 ms. Its FLOP views are rebuilt below by flowtop.monitor.accounting from
# a flops message with these figures (what the live monitor does), so the figures on screen are
# the real accounting's; the expected ones are worked out by hand next to each assertion.
MODEL, EXECUTED, PEAK, TOKENS = 2.0e12, 2.24e12, 989.4e12, 4096


def _flops_message() -> dict[str, object]:
    return {"step": 20, "model_flops": MODEL, "executed_flops": EXECUTED, "tokens": TOKENS,
            "peak_flops": PEAK, "peak_source": "datasheet H200 SXM", "dtype": "bf16", "attention": "full",
            "estimated_flops": MODEL * 0.97, "estimate_source": "6N+12LdT (PaLM)",
            "uncounted": {"aten::_fused_rms_norm": 8}}  # fmt: skip


COUNT = flops_report(_flops_message())  # as the monitor keeps it


def _accounted(snap: MonitorSnapshot) -> MonitorSnapshot:
    """``snap`` with every rank's and job's FlopsView from flowtop.monitor.accounting, not replay's math."""
    jobs = []
    for job in snap.jobs:
        ranks = tuple(
            r if r.flops is None else dataclasses.replace(
                r, flops=accounting.rank_flops(COUNT, r.step_time_s, tokens_per_s=r.tokens_per_s))
            for r in job.ranks
        )  # fmt: skip
        jobs.append(dataclasses.replace(job, ranks=ranks, flops=accounting.job_flops([r.flops for r in ranks])))
    return dataclasses.replace(snap, jobs=tuple(jobs))


def _app(snaps: list | None = None) -> tuple[FlowtopApp, ReplaySource]:
    source = ReplaySource([_accounted(s) for s in (snaps or synthetic_stream())], advance=False)
    return FlowtopApp(source, refresh_s=0), source


def _cells(table: RankTable, row: int) -> list[str]:
    return table.row_text(row)


def test_replay_source_is_a_snapshot_source() -> None:
    assert isinstance(ReplaySource(synthetic_stream()), SnapshotSource)


def test_replay_source_advances_then_stays_on_last() -> None:
    stream = synthetic_stream()
    src = ReplaySource(stream)
    served = [src.snapshot() for _ in range(5)]
    assert served == [stream[0], stream[1], stream[2], stream[2], stream[2]]
    with pytest.raises(ValueError):
        ReplaySource([])


@pytest.mark.asyncio
async def test_rows_appear_for_two_ranks_and_update() -> None:
    app, source = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert source.started
        table = app.screen.query_one(RankTable)
        assert table.row_count == 2
        # Worst first: rank 1 (one step behind, lower MFU) above rank 0. By hand: tokens/s
        # 4,096/4.6 ms = 890.4k and 4,096/4.0 ms = 1.024M; model FLOP/s 2e12/4,096 x tokens/s =
        # 434.8T and 500.0T; MFU 434.8T/989.4T = 43.94 % and 500T/989.4T = 50.54 %; input wait
        # 1.2 % and tensor activity 50 - 8 x rank are the replay's inputs.
        assert _cells(table, 0) == ["1", "gpu-node-00", "119", "1", "4.60ms", "1.2%", "890k", "435T", "43.9%", "42", "live"]
        assert _cells(table, 1) == ["0", "gpu-node-00", "120", "0", "4.00ms", "1.2%", "1.02M", "500T", "50.5%", "50", "live"]
        shown = {r.rank: r.flops for r in app.latest.jobs[0].ranks}
        assert shown[0].flops_per_s == pytest.approx(MODEL / 0.0040) and shown[0].mfu == pytest.approx(0.505357, abs=1e-6)
        assert shown[1].flops_per_s == pytest.approx(MODEL / 0.0046) and shown[1].mfu == pytest.approx(0.439441, abs=1e-6)
        table.move_cursor(row=1)
        source.advance()
        app.refresh_snapshot()
        await pilot.pause()
        # Next snapshot: values change in place, the cursor stays on rank 0.
        assert _cells(table, 1)[2:5] == ["121", "0", "3.90ms"]
        assert _cells(table, 0)[2:5] == ["120", "1", "4.80ms"]
        assert table.cursor_row == 1 and table.selected is not None and table.selected.rank == 0
        source.advance()
        app.refresh_snapshot()
        await pilot.pause()
        assert _cells(table, 0)[0] == "1" and _cells(table, 0)[-1] == "stale"
    # Leaving the app any way (not only q) closes the source once.
    assert source.stopped


@pytest.mark.asyncio
async def test_header_states_mfu_conventions() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        snap = app.latest
        assert snap is not None
        text = JobHeader.render_text(snap, snap.jobs[0], 0, 1).plain.splitlines()
        # By hand (the job is the sum of its ranks, flowtop.monitor.accounting's convention): tokens/s
        # 1.024M + 0.8904M = 1.914M; model FLOP/s 500.0T + 434.8T = 934.8T; executed x 1.12 =
        # 1,047T; MFU 934.8T / (2 x 989.4T) = 47.24 %; HFU 1,047T / 1,978.8T = 52.91 %.
        assert text[0] == "job gpt-demo  ranks 2/2  step 119  running  rx 4,120"
        assert text[1] == "step time 4.60ms  tokens/s 1.91M  model FLOP/s 935T  executed 1.05P"
        assert text[2] == "MFU 47.2 % (model FLOPs, attn full, peak bf16 989TF/rank, datasheet H200 SXM)"
        assert text[3].startswith("HFU 52.9 % (executed: +recompute, flash bwd 2.5x, causal ½; same peak)")
        job = snap.jobs[0].flops
        assert job.flops_per_s == pytest.approx(MODEL / 0.0040 + MODEL / 0.0046)
        assert job.mfu == pytest.approx(0.472399, abs=1e-6) and job.hfu == pytest.approx(0.529087, abs=1e-6)


@pytest.mark.asyncio
async def test_q_quits_and_stops_the_source() -> None:
    app, source = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
        assert source.stopped
    assert app.return_code == 0


@pytest.mark.asyncio
async def test_help_opens_and_closes() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)


@pytest.mark.asyncio
async def test_k_requests_kernels_of_selected_rank() -> None:
    app, source = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down", "k")  # worst first: rank 1, then rank 0
        await pilot.pause()
        app.data.flush()  # the request runs on the data thread
        assert source.kernel_requests == [("gpt-demo", 0)]
        await pilot.press("up", "k")
        app.data.flush()
        assert source.kernel_requests == [("gpt-demo", 0), ("gpt-demo", 1)]


@pytest.mark.asyncio
async def test_enter_opens_kernel_screen_and_escape_returns() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("enter")  # the first row: rank 1 (worst first)
        await pilot.pause()
        assert isinstance(app.screen, KernelScreen)
        assert (app.screen.job_name, app.screen.rank) == ("gpt-demo", 1)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)


@pytest.mark.asyncio
async def test_d_opens_rank_detail() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down", "d")  # the second row: rank 0 (worst first)
        await pilot.pause()
        assert isinstance(app.screen, RankDetailScreen)
        assert app.screen.rank == 0
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)


@pytest.mark.asyncio
async def test_hint_expands_with_enter() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        hints = app.screen.query_one(HintsPanel)
        # Ordered by severity, then impact: critical idle GPU first.
        assert [o.id for o in hints.options] == ["gpu-idle|job|", "straggler|rank|rank 1", "info-attn|kernel|flash_bwd"]
        await pilot.press("tab", "down", "enter")
        await pilot.pause()
        assert hints.expanded == {"straggler|rank|rank 1"}
        prompt = str(hints.get_option("straggler|rank|rank 1").prompt)
        assert ("evidence: slower_pct=15, basis=step_time, step_time_s=0.0046, others_step_time_s=0.004, "
                "window_steps=20, since_step=12") in prompt
        assert "fix: check rank 1's input pipeline" in prompt
        # Expansion survives the next snapshot; Enter again collapses.
        app.refresh_snapshot()
        await pilot.pause()
        assert hints.expanded == {"straggler|rank|rank 1"}
        await pilot.press("enter")
        await pilot.pause()
        assert hints.expanded == set()


@pytest.mark.asyncio
async def test_no_snapshot_yet_and_broken_source() -> None:
    class Broken(ReplaySource):
        def snapshot(self):  # type: ignore[override]
            raise RuntimeError("socket gone")

    app = FlowtopApp(Broken(synthetic_stream()), refresh_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.latest is None
        assert app.source_error == "RuntimeError: socket gone"
        assert app.screen.query_one(RankTable).row_count == 0


@pytest.mark.asyncio
async def test_next_job_cycles() -> None:
    a = synthetic_snapshot(120)
    b = synthetic_snapshot(50, (0.1,), statuses=("live",), with_kernels=False, job="bert")
    both = dataclasses.replace(a, jobs=a.jobs + b.jobs)
    app, _ = _app([both])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.screen.query_one(RankTable).row_count == 2
        await pilot.press("n")
        await pilot.pause()
        assert app.screen.job_name == "bert"
        assert app.screen.query_one(RankTable).row_count == 1


def _kernel_names(screen: KernelScreen) -> list[str]:
    return [r.short for r in screen.query_one(KernelTable).order]


@pytest.mark.asyncio
async def test_kernel_screen_sorts_and_shows_window() -> None:
    app, source = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("enter")  # rank 1, first worst first
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, KernelScreen)
        view = screen.view
        assert view is not None and view.device == "cuda" and view.window == 12
        # Default: window time, largest first, from flowtop.monitor.kernels.aggregate over the synthetic
        # rank-1 window: the big GEMM 4 x 62 + 4 x 118 = 720 µs, two all-reduces 2 x 340 = 680 µs,
        # flash backward (1.5x slower on rank 1) 4 x 96 x 1.5 = 576 µs.
        assert [r.total_us for r in screen.query_one(KernelTable).order][:3] == [720.0, 680.0, 576.0]
        await pilot.press("2")  # calls
        await pilot.pause()
        assert [r.calls for r in screen.query_one(KernelTable).order] == [8, 8, 8, 8, 4, 4, 2, 1, 1]
        await pilot.press("2")  # same key again: reversed
        await pilot.pause()
        assert [r.calls for r in screen.query_one(KernelTable).order][0] == 1
        await pilot.press("6")  # name
        await pilot.pause()
        names = _kernel_names(screen)
        assert names == sorted(names, key=str.lower)
        await pilot.press("s")  # cycles from name back to time
        await pilot.pause()
        assert screen.query_one(KernelTable).sort_index == 0
        await pilot.press("k")
        assert source.kernel_requests == [("gpt-demo", 1)]
        full = str(screen.query_one("#kernel-full", Static).render())
        assert full.startswith("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT  · 96 calls in 12 windows")


@pytest.mark.asyncio
async def test_job_kernel_view_marks_uneven_kernel() -> None:
    app, _ = _app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("j")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, JobKernelScreen)
        order = screen.query_one(JobKernelTable).order
        # Rank 1's flash backward is 1.5x rank 0's: first, flagged, max on rank 1.
        assert order[0].short.startswith("cudnn_generated_fort_native_sdpa_sm90_flash_bprop")
        assert (order[0].min_us, order[0].max_us, order[0].max_rank, order[0].flagged) == (384.0, 576.0, 1, True)
        assert [r.flagged for r in order[1:]] == [False] * (len(order) - 1)
        await pilot.press("s")
        await pilot.pause()
        assert [r.mean_us for r in screen.query_one(JobKernelTable).order][:2] == [720.0, 680.0]
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)


@pytest.mark.asyncio
async def test_rank_detail_sparklines_and_throttle() -> None:
    snap = synthetic_snapshot(120)
    job = snap.jobs[0]
    r1 = job.ranks[1]
    assert r1.telemetry is not None
    hot = dataclasses.replace(
        r1.telemetry,
        device={**r1.telemetry.device, "throttle": ["hw_thermal"], "sm_clock_mhz": 1410},
    )
    ranks = (job.ranks[0], dataclasses.replace(r1, telemetry=hot))
    snap = dataclasses.replace(snap, jobs=(dataclasses.replace(job, ranks=ranks),))
    app, _ = _app([snap])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("d")  # rank 1, first worst first
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RankDetailScreen) and screen.rank == 1
        spark = screen.query_one("#spark-tensor", MetricSparkline).query_one(Sparkline)
        # History keeps NVML's percent; the sparkline gets fractions.
        assert list(spark.data or []) == pytest.approx([v / 100 for v in r1.history.tensor_active])
        assert len(spark.data or []) == 16
        throttle = str(screen.query_one("#throttle", Static).render())
        assert throttle == "THROTTLED: hw_thermal, SM clock 1410/1980 MHz"
        telemetry = str(screen.query_one(TelemetryPanel).render())
        assert "nvlink_tx_bytes_s n/a (GPM metric not supported on this device)" in telemetry
        assert "tensor_active     42%" in telemetry
        flops = str(screen.query_one(FlopsPanel).render())
        assert "count/est.  1.031" in flops  # counted 2e12 / estimated 0.97 x 2e12 = 1/0.97
        assert "uncounted   aten::_fused_rms_norm ×8" in flops


@pytest.mark.asyncio
async def test_rank_detail_without_history_or_flops() -> None:
    snap = synthetic_snapshot(120, with_kernels=False)
    job = snap.jobs[0]
    bare = dataclasses.replace(job.ranks[0], history=History(), flops=None, telemetry=None)
    snap = dataclasses.replace(snap, jobs=(dataclasses.replace(job, ranks=(bare,)),))
    app, _ = _app([snap])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("d")
        await pilot.pause()
        spark = app.screen.query_one("#spark-power", MetricSparkline)
        assert str(spark.query_one(".spark-value", Label).render()) == "n/a (no samples yet)"
        assert spark.query_one(Sparkline).display is False
        assert str(app.screen.query_one("#throttle", Static).render()) == "throttling: n/a (no telemetry yet)"
        assert str(app.screen.query_one(FlopsPanel).render()).startswith("no FLOP count yet")
        assert str(app.screen.query_one(TelemetryPanel).render()) == "no telemetry yet"


@pytest.mark.asyncio
async def test_rank_detail_of_a_cpu_rank_says_gpu_measures_do_not_apply() -> None:
    """A CPU rank has no tensor activity, power or SM clock, and nothing says whether its clocks
    are throttled: 'n/a on CPU', not 'no samples yet' (which would wait for ever) nor 'not
    throttled' (which it cannot know). A GPU rank without samples yet still says so."""
    from flowtop.monitor.snapshot import TelemetryView

    snap = synthetic_snapshot(120, with_kernels=False)
    job = snap.jobs[0]
    cpu_tel = TelemetryView(device={}, host={"proc_cpu_pct": 99.0, "rss_bytes": 2 << 30},
                            reasons={"device": "no CUDA device in this rank"}, received_at=snap.taken_at - 0.4)
    cpu = dataclasses.replace(job.ranks[0], device="cpu (2 threads)", telemetry=cpu_tel,
                              history=dataclasses.replace(job.ranks[0].history, tensor_active=(), power_w=(),
                                                          sm_clock_mhz=()))
    gpu = dataclasses.replace(job.ranks[1], history=History(), telemetry=TelemetryView(
        device={"gpu_util": 97.0, "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0, "throttle": []},
        host={}, reasons={}, received_at=snap.taken_at - 0.4))
    snap = dataclasses.replace(snap, jobs=(dataclasses.replace(job, ranks=(cpu, gpu)),))
    app, _ = _app([snap])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down", "d")  # rank 0 (second, worst first): the CPU rank
        await pilot.pause()
        screen = app.screen
        for spark_id in ("#spark-tensor", "#spark-power", "#spark-clock"):
            spark = screen.query_one(spark_id, MetricSparkline)
            assert str(spark.query_one(".spark-value", Label).render()) == "n/a on CPU", spark_id
            assert spark.query_one(Sparkline).display is False
        mfu = screen.query_one("#spark-mfu", MetricSparkline)  # MFU applies on a CPU
        assert str(mfu.query_one(".spark-value", Label).render()) != "n/a on CPU"
        throttle = str(screen.query_one("#throttle", Static).render())
        assert throttle == "clocks: not measured on CPU"
        assert "not throttled" not in throttle
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("up", "d")  # rank 1: a GPU rank with no samples yet
        await pilot.pause()
        screen = app.screen
        assert str(screen.query_one("#detail-title", Static).render()).startswith("rank 1 · gpu-node-00 pid 4101 · cuda")
        for spark_id in ("#spark-tensor", "#spark-power", "#spark-clock"):
            spark = screen.query_one(spark_id, MetricSparkline)
            assert str(spark.query_one(".spark-value", Label).render()) == "n/a (no samples yet)", spark_id
        assert str(screen.query_one("#throttle", Static).render()) == "clocks: not throttled"


def _cpu_window() -> object:
    from flowtop.monitor.kernels.aggregate import aggregate
    from flowtop.monitor.kernels.trace import KernelEvent, KernelWindow

    names = ("aten::mm", "aten::add", "aten::linear")
    events = (
        KernelEvent(0, 0, 10.0, 300.0, -1, -1, 2.0e9),
        KernelEvent(1, 0, 320.0, 50.0, -1, -1, -1.0),
        KernelEvent(2, 3, 5.0, 310.0, -1, -1, -1.0),
        KernelEvent(1, 3, 320.0, 50.0, -1, -1, -1.0),
    )
    return aggregate(KernelWindow(names, events, 1000.0, "cpu", step=7, window=1))


@pytest.mark.asyncio
async def test_cpu_window_is_labelled_as_cpu_operators() -> None:
    snap = synthetic_snapshot(120, (0.004,), statuses=("live",), with_kernels=False)
    job = snap.jobs[0]
    # A rank's device string may carry detail; the window's device is plain "cpu".
    rank = dataclasses.replace(job.ranks[0], device="cpu (x86_64)", kernels=_cpu_window())
    snap = dataclasses.replace(snap, jobs=(dataclasses.replace(job, ranks=(rank,)),))
    no_window = dataclasses.replace(snap, jobs=(dataclasses.replace(job, ranks=(dataclasses.replace(rank, kernels=None),)),))
    app, source = _app([no_window, snap])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        title = str(app.screen.query_one("#kernel-title", Static).render())
        assert title == "CPU operators · rank 0 gpu-node-00 · device cpu (no GPU: host operator times) · no window yet"
        assert str(app.screen.query_one(CategoryBar).render()) == "no kernel window yet (k asks the rank for one)"
        source.advance()
        app.refresh_snapshot()
        await pilot.pause()
        title = str(app.screen.query_one("#kernel-title", Static).render())
        assert title.startswith("CPU operators · rank 0 gpu-node-00 · device cpu")
        assert title.endswith("· window 1 @ step 7 · step 1.00ms")
        assert [r.name for r in app.screen.query_one(KernelTable).order] == ["aten::mm", "aten::add"]
        anatomy = str(app.screen.query_one(KernelAnatomy).render())
        assert anatomy.splitlines()[0] == "busy 360µs 36%  idle 640µs 64%  comm none"


@pytest.mark.asyncio
async def test_an_app_that_quit_on_a_signal_in_time_leaves_the_process_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The grace after a quit signal (QUIT_GRACE_S) is for a UI that hangs: an app that stopped in
    # time, in a process that goes on (an embedding), must not have the signal raised later.
    import os
    import signal
    import time

    from flowtop.tui import app as app_module

    monkeypatch.setattr(app_module, "QUIT_GRACE_S", 0.3)
    raised: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda sig, frame: raised.append(sig))
    try:
        app = FlowtopApp(ReplaySource(synthetic_stream()), quit_on=(signal.SIGUSR1,))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            os.kill(os.getpid(), signal.SIGUSR1)  # quits as q does
            for _ in range(50):
                await pilot.pause(0.05)
                if not app.is_running:
                    break
        assert not raised  # taken by the app, not the handler it had before
        time.sleep(0.6)  # past the grace
        assert not raised and signal.getsignal(signal.SIGUSR1) is not None
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_quit_signals_grace_lasts_until_the_terminal_is_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """An SSH session dropped while ranks talked: the terminal's SIGHUP quit the app, whose
    grace timer was cancelled at unmount, and then Textual's writer blocked on the dead terminal
    for good — the monitor never exited (a new user's trial in tmux). The grace now lasts until
    run_async returns: a teardown that outlasts it is ended by the signal's default action."""
    import asyncio
    import os
    import signal
    import time

    from flowtop.tui import app as app_module

    monkeypatch.setattr(app_module, "QUIT_GRACE_S", 0.3)

    class StuckTeardown(FlowtopApp):
        CSS_PATH = str(Path(app_module.__file__).parent / "flowtop.tcss")  # relative: to this file

        @property
        def is_headless(self) -> bool:  # a real terminal's app, though the test's driver is headless
            return False

        async def on_unmount(self) -> None:
            await super().on_unmount()
            time.sleep(0.8)  # the terminal's teardown, blocked past the grace

    raised: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda sig, frame: raised.append(sig))
    try:
        app = StuckTeardown(ReplaySource(synthetic_stream()), quit_on=(signal.SIGUSR1,))

        async def run() -> None:
            async def quit_soon(pilot: Any) -> None:
                await pilot.pause(0.2)
                os.kill(os.getpid(), signal.SIGUSR1)

            await app.run_async(headless=True, size=SIZE, auto_pilot=quit_soon)

        asyncio.run(run())
        time.sleep(0.1)
        assert raised == [signal.SIGUSR1]  # the signal's own handling came back after the grace
    finally:
        signal.signal(signal.SIGUSR1, previous)
