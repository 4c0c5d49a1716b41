"""UI details found in review: host reasons, throttling vs idle clocks, IP hosts, NaN sparklines."""

from __future__ import annotations

import dataclasses

import pytest
from textual.widgets import Label, Sparkline

from flowtop.monitor.snapshot import History, TelemetryView
from flowtop.tui.app import FlowtopApp
from flowtop.tui.screens.rank_detail_screen import RankDetailScreen, throttle_text
from flowtop.tui.widgets.metric_sparkline import MetricSparkline
from flowtop.tui.widgets.rank_table import _short_host
from flowtop.tui.widgets.telemetry_panel import telemetry_text
from synthetic.replay import ReplaySource, synthetic_snapshot


def test_host_reasons_go_to_the_host_section() -> None:
    tel = TelemetryView(device={"gpu_util": 50}, host={"rss_bytes": 10, "proc_cpu_pct": None},
                        reasons={"host.proc_cpu_pct": "process not readable"}, received_at=0.0)  # fmt: skip
    text = telemetry_text(tel, 0.1).plain
    device_part, host_part = text.split("process and host")
    assert "host.proc_cpu_pct" not in text
    assert "process not readable" in host_part and "process not readable" not in device_part


def test_low_clock_without_a_reason_is_not_throttling() -> None:
    rank = synthetic_snapshot().jobs[0].ranks[0]
    idle = TelemetryView(device={"sm_clock_mhz": 800, "sm_clock_max_mhz": 1980, "throttle": []}, host={},
                         reasons={}, received_at=0.0)  # fmt: skip
    assert "THROTTLED" not in throttle_text(dataclasses.replace(rank, telemetry=idle)).plain
    hot = dataclasses.replace(idle, device={**idle.device, "throttle": ["hw_thermal"]})
    assert "THROTTLED" in throttle_text(dataclasses.replace(rank, telemetry=hot)).plain


def test_power_cap_at_the_limit_is_not_shown_as_a_fault() -> None:
    rank = synthetic_snapshot().jobs[0].ranks[0]
    capped = TelemetryView(device={"sm_clock_mhz": 1695, "sm_clock_max_mhz": 1980, "throttle": ["sw_power_cap"],
                                   "power_w": 698.1, "power_limit_w": 700.0}, host={}, reasons={}, received_at=0.0)
    text = throttle_text(dataclasses.replace(rank, telemetry=capped))
    assert text.plain == "at its power limit (698/700 W), SM clock 1695/1980 MHz" and text.style == "yellow"
    # under the limit, or with another power/thermal reason, it is a slowdown worth a red flag
    low = dataclasses.replace(capped, device={**capped.device, "power_w": 500.0})
    assert throttle_text(dataclasses.replace(rank, telemetry=low)).plain.startswith("THROTTLED: sw_power_cap")
    hot = dataclasses.replace(capped, device={**capped.device, "throttle": ["sw_power_cap", "hw_thermal"]})
    assert throttle_text(dataclasses.replace(rank, telemetry=hot)).plain.startswith("THROTTLED")
    # sync_boost is not a power/thermal reason: the screen and the hint agree it is power-limited
    synced = dataclasses.replace(capped, device={**capped.device, "throttle": ["sw_power_cap", "sync_boost"]})
    assert throttle_text(dataclasses.replace(rank, telemetry=synced)).plain.startswith("at its power limit")


def test_ip_hosts_are_not_cut() -> None:
    assert _short_host("10.0.0.5") == "10.0.0.5"
    assert _short_host("gpu-node-01.cluster.example") == "gpu-node-01"


@pytest.mark.asyncio
async def test_detail_screen_leaves_non_finite_history_points_out() -> None:
    """Textual's Sparkline cannot draw NaN or inf: the detail screen draws the finite points and
    states the latest and range over them only."""
    snap = synthetic_snapshot()
    job = snap.jobs[0]
    bad = dataclasses.replace(job.ranks[0], history=History(steps=(1, 2, 3), step_time_s=(0.1, float("nan"), 0.2),
                                                            mfu=(float("inf"), 0.4, float("-inf"))))  # fmt: skip
    snap = dataclasses.replace(snap, jobs=(dataclasses.replace(job, ranks=(bad, *job.ranks[1:])),))
    app = FlowtopApp(ReplaySource([snap], advance=False), refresh_s=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("down", "d")  # rank 0 is the second row (worst first: rank 1 is behind)
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RankDetailScreen) and screen.rank == 0
        step = screen.query_one("#spark-step", MetricSparkline)
        assert list(step.query_one(Sparkline).data or []) == [0.1, 0.2]
        assert str(step.query_one(".spark-value", Label).render()) == "200ms (100ms–200ms)"
        mfu = screen.query_one("#spark-mfu", MetricSparkline)
        assert list(mfu.query_one(Sparkline).data or []) == [0.4]
        assert str(mfu.query_one(".spark-value", Label).render()) == "40.0% (40.0%–40.0%)"
        assert mfu.query_one(Sparkline).display is True
