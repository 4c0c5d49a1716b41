"""FlopsPanel: a rank's FLOP accounting with every convention stated."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from flowtop.monitor import precision
from flowtop.monitor.format import NO_ATTENTION, fmt_ranks, no_attention
from flowtop.monitor.snapshot import FlopsView
from flowtop.tui.widgets._format import NA, fmt_int, fmt_pct, fmt_si, mfu_style


def flops_text(f: FlopsView | None, job: FlopsView | None = None) -> Text:
    """Model vs executed per step, estimate and ratio, FLOPs/token, peak, dtype, attention;
    the dtype mix, MoE expert load (the rank's and, from ``job``, the job's) and padding when
    the probe sent them."""
    out = Text()
    if f is None:
        out.append("no FLOP count yet", style="dim")
        out.append("\n(the probe counts on sampled steps; the first comes after warm-up)", style="dim")
        return out

    def row(label: str, value: str, note: str = "", style: str = "") -> None:
        out.append(f"{label:<12}", style="dim")
        out.append(value, style=style)
        if note:
            out.append(f"  {note}", style="dim")
        out.append("\n")

    row("model/step", fmt_si(f.model_flops_per_step, "F"), "no recompute")
    if f.model_note:
        row("", f.model_note[:120], "", "yellow")
    if f.parallel:  # the figures are this rank's local share: say of which mesh
        row("parallel", f.parallel.removeprefix("local FLOPs of this rank; ")[:160], "local")
    ratio = (
        f"{f.executed_flops_per_step / f.model_flops_per_step:.2f}× model"
        if f.executed_flops_per_step and f.model_flops_per_step
        else ""
    )
    row("exec./step", fmt_si(f.executed_flops_per_step, "F"), ratio)
    est = f.estimate_ratio
    row("estimate", fmt_si(f.estimated_flops_per_step, "F"), f.estimate_source or "")
    row("count/est.", NA if est is None else f"{est:.3f}", "1 = agree")
    row("FLOPs/token", fmt_si(f.flops_per_token, "F"))
    mix = f.precision
    mix_note = "each dtype vs its own peak" if mix is not None else ""
    row("MFU", fmt_pct(f.mfu), f.mfu_reason if f.mfu is None else mix_note, mfu_style(f.mfu))
    if mix is not None:
        row("MFU bf16-eq", fmt_pct(f.mfu_bf16), "every FLOP vs the bf16 peak")
    row("HFU", fmt_pct(f.hfu), "", mfu_style(f.hfu))
    if mix is not None:
        row("peak", fmt_si(f.peak_flops, "F/s", 1), f"dense, mix of {precision.label(mix)}"[:120])
    else:
        row("peak", fmt_si(f.peak_flops, "F/s", 1), f"{f.dtype} dense")
    row("peak source", f.peak_source or NA)
    if no_attention(f):  # a convention's square of nothing read as if the model had attention (a trial)
        row("attention", NO_ATTENTION, "no attention block, none ran")
    else:
        row("attention", f.attention_convention, attention_note(f.attention_convention, f.attention_masking))
    row("counted at", NA if f.counted_at_step is None else f"step {fmt_int(f.counted_at_step)}")
    _moe_rows(row, f, job)
    if f.nonpad_tokens is not None:
        row("non-pad", fmt_pct(f.nonpad_frac), f"{fmt_int(f.nonpad_tokens)} tokens of the counted step; "
            "tokens/s count padding")
    if f.uncounted_ops:
        ops = sorted(f.uncounted_ops.items(), key=lambda kv: (-kv[1], kv[0]))
        listed = ", ".join(f"{name} ×{n}" for name, n in ops[:4])
        more = f" (+{len(ops) - 4} more)" if len(ops) > 4 else ""
        row("uncounted", listed + more, "", "yellow")
    else:
        row("uncounted", "none")
    out.rstrip()
    return out


def attention_note(convention: str, masking: str | None) -> str:
    """What the convention does to this model's attention: causal attention counts the full square
    ("full") or half of it ("causal"); a model with no causal masking (a ViT, BERT: every call
    bidirectional) counts the full square either way. Unknown masking states the convention alone."""
    if masking == "bidirectional":
        return "bidirectional: full square (no causal to halve)"
    causal = "causal calls" if masking == "mixed" else "causal"
    return f"{causal}: {'full' if convention == 'full' else 'half'} square"


def _ratio(v: float | None) -> str:
    return NA if v is None else f"{v:.2f}"


def _moe_rows(row: Any, f: FlopsView, job: FlopsView | None) -> None:
    """Expert load: max/mean tokens per expert (flowtop.monitor.moe_load), rank then job."""
    x = f.expert_load
    if x is None:
        return
    row("experts", f"max/mean {_ratio(x.max_over_mean)}", f"worst layer {x.worst_layer}, mean over "
        f"{x.layers} layers {_ratio(x.mean_max_over_mean)}; {x.experts} local experts, "
        f"{fmt_int(x.routed_tokens)} tokens routed"[:120])
    jx = job.expert_load if job is not None else None
    if jx is not None and jx.ranks > 1:
        row("experts job", f"max/mean {_ratio(jx.max_over_mean)}",
            f"{_where(jx)}; rank max/mean {_ratio(jx.rank_max_over_mean)} (routed tokens)")


def _where(jx: Any) -> str:
    """Which experts the job's max/mean compares (flowtop.monitor.parallelism.job_expert_load)."""
    if not jx.groups:
        return f"{jx.ranks} ranks' experts pooled"
    ranks = fmt_ranks(jx.worst_group, 24)
    if jx.grouping.startswith("per rank"):  # no expert parallelism: every rank holds every expert
        return f"worst rank {ranks} of {jx.groups} (no EP)"
    return f"worst of {jx.groups} EP groups: ranks {ranks}" if jx.groups > 1 else f"one EP group: ranks {ranks}"


class FlopsPanel(Static):
    """FLOP accounting of one rank (``show`` it a :class:`FlopsView`)."""

    def show(self, flops: FlopsView | None, job: FlopsView | None = None) -> None:
        """Render ``flops`` (None: not counted yet); ``job``: the job's view, for its expert load."""
        self.update(flops_text(flops, job))
