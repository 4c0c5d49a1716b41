"""JobHeader: the job's throughput and FLOP figures, conventions spelled out."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from flowtop.monitor.format import attention_shown
from flowtop.monitor.snapshot import FlopsView, JobSnapshot, MonitorSnapshot
from flowtop.tui.widgets._format import (
    NA,
    STATUS_STYLE,
    fmt_int,
    fmt_pct,
    fmt_si,
    fmt_time,
    mfu_style,
)


def _peak_per_gpu(job: JobSnapshot) -> FlopsView | None:
    """A rank's FLOPs view (its peak is per GPU; the job's is a sum over ranks)."""
    return next((r.flops for r in job.ranks if r.flops is not None and r.flops.peak_flops), None)


def convention_note(flops: FlopsView, per_gpu: FlopsView | None) -> str:
    """'model FLOPs, attn full, peak bf16 989TF/rank, datasheet ...' (the MFU line)."""
    source = per_gpu or flops
    peak = fmt_si(source.peak_flops, "F", 0) if source.peak_flops else "peak n/a"
    what = "model FLOPs" if flops.counted else "estimated 6N+12LdT, not counted"
    parts = [what, f"attn {attention_shown(flops)}", f"peak {flops.dtype} {peak}/rank"]
    if source.peak_source:
        parts.append(source.peak_source)
    return ", ".join(parts)


def utilisation_line(kind: str, value: float | None, flops: FlopsView, per_gpu: FlopsView | None,
                     over: str = "") -> Text:
    """One 'MFU 41.2 % (conventions)' line; 'MFU n/a (reason)' without a value. ``over``: what a
    job's figures are over when some of its ranks are unheard (JobSnapshot.over_phrase), said
    first: the figure is not the whole job's (its ``mfu_reason`` says it where there is no value)."""
    line = Text(f"{kind} ", style="bold")
    if value is None:
        reason = flops.mfu_reason or "no FLOP count yet"
        line.append(f"n/a ({reason})", style="dim")
        return line
    line.append(fmt_pct(value).replace("%", " %"), style=mfu_style(value))
    if over:
        line.append(f" {over}", style="yellow")
    if kind == "MFU":
        line.append(f" ({convention_note(flops, per_gpu)})", style="dim")
    else:
        line.append(" (executed: +recompute, flash bwd 2.5x, causal ½; same peak)", style="dim")
    return line


class JobHeader(Static):
    """Header of the main screen: one job's step, throughput, MFU and HFU.

    Rendered lines (80 columns): the job and its ranks; step time, tokens/s and
    FLOP/s; MFU with its conventions; HFU with its conventions.
    """

    _lines = -1  # line count of the text shown

    def show(self, snap: MonitorSnapshot | None, job: JobSnapshot | None, index: int, count: int,
             error: str = "") -> None:
        """Render ``job`` (``index`` of ``count`` jobs in ``snap``)."""
        text = self.render_text(snap, job, index, count, error)
        # A layout pass re-lays and repaints the whole screen (tens of ms beside a 4,096-rank
        # table): only when the header's height may change, i.e. its line count did.
        lines = text.plain.count("\n")
        self.update(text, layout=lines != self._lines)
        self._lines = lines

    @staticmethod
    def render_text(snap: MonitorSnapshot | None, job: JobSnapshot | None, index: int, count: int,
                    error: str = "") -> Text:
        """The header as Rich text (also used by tests)."""
        out = Text(no_wrap=True, overflow="ellipsis")
        if snap is None and error:  # the source never started (a port another monitor holds)
            # "cannot bind ADDR: REASON" first, where 80 columns show it whole; its hint, if any
            # ("(is another flowtop running? ...)"), on the next line.
            head, paren, hint = error.partition(" (")
            out.append("flowtop ", style="bold")
            out.append(head, style="bold red")
            if paren:
                out.append(f"\n({hint}", style="red")
            return out
        if snap is None or job is None:
            where = snap.listen if snap is not None else "…"
            out.append("flowtop ", style="bold")
            out.append(f"waiting for ranks on {where}", style="yellow")
            if error:
                out.append(f"\n{error}", style="red")
            return out
        out.append("job ", style="dim")
        out.append(job.job, style="bold")
        if count > 1:
            out.append(f" [{index + 1}/{count}, n: next]", style="dim")
        out.append(f"  ranks {job.ranks_seen}/{job.world_size}")
        out.append(f"  step {fmt_int(job.step)}  ")
        out.append(job.status_text, style=STATUS_STYLE.get(job.status, "yellow"))  # "stopped (SIGTERM)"
        rejected = f" rej {snap.rejected}" if snap.rejected else ""
        out.append(f"  rx {fmt_int(snap.received)}{rejected}", style="dim")
        lost = sum(r.lost_messages + r.dropped_messages for r in job.ranks)
        if lost:  # gaps in sequence numbers (lost in transit) + the probes' own queue drops
            out.append(f" lost {fmt_int(lost)}", style="red")
        out.append("\n")
        out.append("step time ", style="dim")
        out.append(fmt_time(job.step_time_s))
        out.append("  tokens/s ", style="dim")
        out.append(fmt_si(job.tokens_per_s))
        f = job.flops
        out.append("  model FLOP/s ", style="dim")
        out.append(fmt_si(f.flops_per_s if f else None))
        out.append("  executed ", style="dim")
        out.append(fmt_si(f.executed_flops_per_s if f else None))
        out.append("\n")
        if f is None:
            out.append("MFU ", style="bold")
            out.append(f"n/a ({job.no_count_reason})", style="dim")  # no count, or no rank heard
            out.append("\nHFU ", style="bold")
            out.append(NA, style="dim")
        else:
            per_gpu = _peak_per_gpu(job)
            out.append_text(utilisation_line("MFU", f.mfu, f, per_gpu, job.over_phrase))
            out.append("\n")
            out.append_text(utilisation_line("HFU", f.hfu, f, per_gpu, job.over_phrase))
        if error:
            out.append(f"\n{error}", style="red")
        return out
