"""RankDetailScreen: a rank's history, telemetry and FLOP accounting."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from flowtop.monitor import telemetry as tm
from flowtop.monitor.hints import power_limited, watched_reasons
from flowtop.monitor.snapshot import MonitorSnapshot, RankSnapshot
from flowtop.tui.screens.snapshot_screen import SnapshotScreen, find_job, pick_rank
from flowtop.tui.widgets._format import STATUS_STYLE, fmt_int, fmt_pct, fmt_time
from flowtop.tui.widgets.flops_panel import FlopsPanel
from flowtop.tui.widgets.metric_sparkline import MetricSparkline
from flowtop.tui.widgets.status_footer import StatusFooter
from flowtop.tui.widgets.telemetry_panel import TelemetryPanel


def _pct(v: float | None) -> str:
    return fmt_pct(v)


def _watts(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}W"


def _mhz(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}MHz"


def detail_title(r: RankSnapshot | None, job: str, rank: int, now: float = 0.0) -> Text:
    """Two lines: who the rank is, then its health figures (its age at ``now``, the snapshot's
    ``taken_at``)."""
    out = Text(no_wrap=True, overflow="ellipsis")
    if r is None:
        out.append(f"rank {rank} of {job}: not seen in the latest snapshot", style="yellow")
        return out
    out.append(f"rank {r.rank}", style="bold")
    restart = f" restart {r.incarnation}" if r.incarnation else ""
    out.append(f" · {r.host} pid {r.pid}{restart} · {r.device} · ")
    out.append(r.status, style=STATUS_STYLE.get(r.status, "yellow"))
    out.append(f" · step {fmt_int(r.step)} · {fmt_time(r.age_s(now))} ago")
    if r.bye_reason:
        out.append(f" · bye: {r.bye_reason}", style="dim")
    out.append("\n")
    wait = r.input_wait_frac
    out.append("input wait ", style="dim")
    out.append(fmt_pct(wait), style="red" if wait is not None and wait > 0.05 else "")
    out.append("  probe overhead ", style="dim")
    out.append(fmt_pct(r.probe_overhead_frac, 2))
    out.append("  device/step ", style="dim")
    out.append(fmt_time(r.device_time_s))
    out.append("  lost ", style="dim")
    out.append(str(r.lost_messages), style="red" if r.lost_messages else "")
    out.append(" dropped ", style="dim")
    out.append(str(r.dropped_messages), style="red" if r.dropped_messages else "")
    if r.commands_refused:
        out.append(" commands refused ", style="dim")
        out.append(str(r.commands_refused), style="yellow")
    if r.commands_dropped:
        out.append(" commands dropped ", style="dim")
        out.append(str(r.commands_dropped), style="red")
    coords = coords_text(r)
    if coords.plain:
        out.append("\n")
        out.append_text(coords)
    return out


def coords_text(r: RankSnapshot) -> Text:
    """The rank's parallel coordinates ("dp 0/2 · tp 1/2 · pp 0/2", ranks counted from 0), its
    pipeline stages and their compute time; the reason when the layout is unknown; "" when the
    probe said nothing (before its first step)."""
    out = Text()
    if r.coords:
        out.append("parallel ", style="dim")
        out.append(" · ".join(f"{role} {rk}/{sz}" for role, (rk, sz) in r.coords.items()))
    elif r.coords_source:
        out.append("parallel ", style="dim")
        out.append(r.coords_source[:120], style="yellow")
    if r.pp_stages:
        out.append("  stage" + ("s " if len(r.pp_stages) > 1 else " "), style="dim")
        out.append(", ".join(map(str, r.pp_stages)))
    if r.stage_time_s is not None:
        out.append("  stage compute/step ", style="dim")
        out.append(fmt_time(r.stage_time_s))
    return out


#: What a GPU-only measure of a CPU rank reads: it does not apply, rather than "not yet".
NOT_ON_CPU = "n/a on CPU"


def on_cpu(r: RankSnapshot | None) -> bool:
    """Whether the rank trains on the CPU (the probe names CPU devices "cpu (...)")."""
    return r is not None and r.device.strip().lower().startswith("cpu")


def throttle_text(r: RankSnapshot | None) -> Text:
    """'throttled: …' in red, or a quiet 'clocks: not throttled'; on a CPU rank, which reports
    no clocks or throttle reasons, 'clocks: not measured on CPU'."""
    if on_cpu(r):
        return Text("clocks: not measured on CPU", style="dim")
    tel = r.telemetry if r else None
    reasons = tm.throttle_reasons(tel)
    clock, clock_max = tm.number(tel, tm.SM_CLOCK), tm.number(tel, tm.SM_CLOCK_MAX)
    power, limit = tm.number(tel, tm.POWER_W), tm.number(tel, tm.POWER_LIMIT_W)
    if r is not None and power and limit and power_limited(watched_reasons(r), power, limit):
        # Power-limited, not faulty: dense tensor-core work runs into the cap (seen on an H200
        # at 698 of 700 W and 1695 of 1980 MHz); the throttling hint files it as information.
        clocks = f", SM clock {clock:.0f}/{clock_max:.0f} MHz" if clock and clock_max else ""
        return Text(f"at its power limit ({power:.0f}/{limit:.0f} W){clocks}", style="yellow")
    if reasons and clock and clock_max and clock < 0.9 * clock_max:
        # A low clock alone is idle downclocking; only with a power/thermal reason is it throttling.
        reasons.append(f"SM clock {clock:.0f}/{clock_max:.0f} MHz")
    if reasons:
        return Text("THROTTLED: " + ", ".join(reasons), style="bold red")
    if tel is None:
        return Text("throttling: n/a (no telemetry yet)", style="dim")
    return Text("clocks: not throttled", style="dim green")


class RankDetailScreen(SnapshotScreen):
    """Sparklines of step time, MFU, tensor activity, power and SM clock; telemetry; FLOPs."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("k", "kernels_now", "Capture"),
    ]

    def __init__(self, job: str, rank: int) -> None:
        super().__init__()
        self.job_name = job
        self.rank = rank

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        with Vertical(id="sparks"):
            yield MetricSparkline("step time", fmt_time, higher_is_better=False, id="spark-step")
            yield MetricSparkline("MFU", _pct, id="spark-mfu")
            yield MetricSparkline("tensor active", _pct, id="spark-tensor")
            yield MetricSparkline("power", _watts, id="spark-power")
            yield MetricSparkline("SM clock", _mhz, id="spark-clock")
            yield Static(id="throttle")
        with Horizontal(id="detail-panels"):
            # Scroll boxes take focus, so Tab and the arrows reach long telemetry lists.
            with VerticalScroll(id="flops-box") as box:
                box.border_title = "FLOPs"
                yield FlopsPanel(id="flops")
            with VerticalScroll(id="telemetry-box") as box:
                box.border_title = "telemetry"
                yield TelemetryPanel(id="telemetry")
        yield StatusFooter()

    def show(self, snap: MonitorSnapshot | None) -> None:
        r = pick_rank(find_job(snap, self.job_name), self.rank)
        now = snap.taken_at if snap is not None else 0.0
        self.query_one("#detail-title", Static).update(detail_title(r, self.job_name, self.rank, now))
        h = r.history if r else None
        # Tensor activity, power and SM clock come from NVML/GPM: a CPU rank never has them.
        gpu_only = {"empty": NOT_ON_CPU} if on_cpu(r) else {}
        self.query_one("#spark-step", MetricSparkline).show(h.step_time_s if h else ())
        self.query_one("#spark-mfu", MetricSparkline).show(h.mfu if h else ())
        self.query_one("#spark-tensor", MetricSparkline).show(
            tm.series_fraction(tm.TENSOR, h.tensor_active) if h else (), **gpu_only)
        self.query_one("#spark-power", MetricSparkline).show(h.power_w if h else (), **gpu_only)
        self.query_one("#spark-clock", MetricSparkline).show(h.sm_clock_mhz if h else (), **gpu_only)
        self.query_one("#throttle", Static).update(throttle_text(r))
        job = find_job(snap, self.job_name)
        self.query_one(FlopsPanel).show(r.flops if r else None, job.flops if job is not None else None)
        self.query_one(TelemetryPanel).show(r.telemetry if r else None, now)

    def action_kernels_now(self) -> None:
        """Ask this rank for a kernel window now."""
        self.flowtop.request_kernels(self.job_name, self.rank)
