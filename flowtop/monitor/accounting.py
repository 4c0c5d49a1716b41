"""FLOP/s, MFU and HFU from the probe's counts and the measured step time. No Textual.

Conventions (also in the JSON ``conventions`` block):

* model FLOP/s  = model FLOPs per token of the counted step × the rank's tokens/s, when the
  count knows its tokens and the rank's tokens/s is known: steps whose batch or sequence
  shape differs from the counted one are scaled by their tokens (a counted step with twice
  the tokens of most steps would otherwise double the rate). Otherwise model FLOPs of the
  counted step ÷ median step wall time. FLOPs per token are taken as constant across shapes
  (attention's growth with sequence length is not rescaled); executed FLOP/s likewise;
* a *stalled* rank (no step for a while, though it still talks; see
  :mod:`flowtop.monitor.model`) has FLOP/s, MFU and HFU of 0, with ``mfu_reason`` saying for how
  long it has made no step: medians of past steps would keep showing full speed;
* a rank *unheard* behind a silent or closed relay (RankSnapshot.cut) may still be training:
  its FLOP/s, MFU, HFU and tokens/s are n/a (None), its counts per step as last heard, and
  ``mfu_reason`` "unheard behind relay HOST (silent)" (:func:`unheard`), never "no step": it is
  not known to have stopped;
* MFU           = model FLOP/s ÷ dense peak of the dtype in use; when the probe sends FLOPs per
  dtype, against each op's own dtype peak: ideal time Σ F_d/peak_d ÷ step time, i.e. model
  FLOP/s ÷ the mix peak F / Σ F_d/peak_d (flowtop.monitor.precision), with the bf16-equivalent MFU
  (model FLOP/s ÷ the bf16 peak) beside it;
* HFU           = executed FLOP/s ÷ the same peak (the executed FLOPs' mix);
* job MFU       = Σ model FLOP/s ÷ Σ peaks of the ranks (the same time window),
  so a job with one idle rank is not flattered; over the ranks that are *heard*: an unheard
  rank is left out of both sums (and of tokens/s, percentiles and lag), and the job says how
  many it left out (JobSnapshot.unheard, its ``mfu_reason``: "over 4 of 6 ranks; 2 unheard
  behind relay node1"): counted at 0 it read as a throughput collapse that never happened.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, cast

from flowtop.monitor import moe_load, precision
from flowtop.monitor.records import Fields
from flowtop.monitor.snapshot import FlopsView, ShownPeakKind
from probe.wire import FlopsReport

OVERRIDE_SOURCE = "override (--peak-tflops / FLOWTOP_PEAK_TFLOPS)"
def job_peak_kind(views: Sequence[FlopsView]) -> ShownPeakKind:
    """The kind of a job's peak (the sum of its ranks'): theirs when they agree, else "mixed"."""
    kinds = {v.peak_kind for v in views}
    return kinds.pop() if len(kinds) == 1 else "mixed" if kinds else "none"


def per_peak(rate: float | None, peak: float | None) -> float | None:
    """A FLOP rate as a share of a peak (MFU, HFU, bf16-equivalent MFU, of a rank or a job):
    None when either is unknown or the peak is 0. The one place these ratios are computed."""
    return rate / peak if (rate is not None and peak) else None


_FLOPS = Fields(FlopsView)
_SINCE = _FLOPS.at("stalled_since")[0]
_RATES = _FLOPS.at("flops_per_s", "executed_flops_per_s", "mfu", "hfu", "mfu_bf16")
_REASON = _FLOPS.at("mfu_reason")[0]


def unheard(view: FlopsView, reason: str) -> FlopsView:
    """``view``, a rank's as last heard, for the rank unheard behind a silent or closed relay
    (``reason``: RelayCut.unheard): rates n/a, not 0 (it may be training on; 0 read as a stop),
    not stalled, counts per step kept (positionally, as :func:`restalled`)."""
    values = list(_FLOPS.read(view))
    for i in _RATES:
        values[i] = None
    values[_SINCE], values[_REASON] = None, reason
    return FlopsView(*values)


def restalled(view: FlopsView, stalled_since: float) -> FlopsView:
    """``view``, the :func:`rank_flops` of a stalled rank, stalled since ``stalled_since`` instead
    (its relay's lag moved): a stalled rank's rates are 0 however long it stalled, so only the
    instant differs (the view copied positionally: 2.3 µs against 5.0 µs for its precision mix
    and rates again)."""
    if view.stalled_since is None:
        raise ValueError("restalled: the view is not a stalled rank's")
    values = list(_FLOPS.read(view))
    values[_SINCE] = stalled_since
    return FlopsView(*values)


def rank_flops(
    msg: FlopsReport | None,
    step_time_s: float | None,
    peak_override: float | None = None,
    tokens_per_s: float | None = None,
    stalled_since: float | None = None,
) -> FlopsView | None:
    """Build a rank's :class:`FlopsView` from its latest ``flops`` message.

    Args:
        msg: The rank's latest ``flops`` message, as its record (None: no count yet).
        step_time_s: Median step wall time of recent steps.
        peak_override: Dense peak per rank (FLOP/s) that replaces the message's.
        tokens_per_s: The rank's recent tokens/s; with the count's tokens it gives FLOP/s.
        stalled_since: Monitor time of the rank's last step when it counts as stalled (FLOP/s,
            MFU and HFU are then 0; FlopsView.stalled_since), else None.
    """
    if msg is None:
        return None
    model, tokens = msg.model_flops, msg.tokens
    source = OVERRIDE_SOURCE if peak_override else msg.peak_source
    stalled = stalled_since is not None
    fps, efps, peak, hpeak, mix = _rates(msg, step_time_s, peak_override, tokens_per_s, stalled)
    reason = ""  # a stall's grows with the clock: said at display (FlopsView.reason_at)
    if not stalled and not peak and mix is not None and mix.missing:
        reason = precision.missing_reason(mix, source)
    elif not stalled and not peak:
        reason = f"no dense peak known ({source or 'device not in the peak table'}); use --peak-tflops"
    elif not stalled and fps is None:
        reason = "no steady step time yet"
    return FlopsView(
        model_flops_per_step=model,
        executed_flops_per_step=msg.executed_flops,
        estimated_flops_per_step=msg.estimated_flops,
        estimate_source=msg.estimate_source,
        flops_per_s=fps,
        executed_flops_per_s=efps,
        # A stalled rank runs at 0 % of any peak, known or not.
        mfu=0.0 if stalled else per_peak(fps, peak),
        hfu=0.0 if stalled else per_peak(efps, hpeak),
        peak_flops=float(peak) if peak else None,
        peak_source=source,
        peak_kind=_shown_kind(msg, peak, peak_override, mix),
        dtype=msg.dtype,
        attention_convention=msg.attention,
        flops_per_token=model / tokens if tokens else None,
        uncounted_ops=dict(msg.uncounted),
        counted_at_step=msg.step,
        mfu_reason=reason,
        stalled_since=stalled_since,
        counted=msg.counted,
        model_note=msg.model_note,
        uncounted_size=dict(msg.uncounted_size),
        parallel=msg.parallel,
        attention_masking=msg.attention_masking,
        **_extras(msg, mix, fps, tokens),
    )


def _shown_kind(msg: FlopsReport, peak: float | None, peak_override: float | None,
                mix: precision.DtypeMix | None) -> ShownPeakKind:
    """Where the peak MFU divides by comes from: the override's, the precision mix's (the probe's
    ``peak_by_dtype_kind``: its peaks may exist where the step dtype's ``peak_kind`` says "none"),
    else the step dtype's ``peak_kind``; "unknown" from a probe that did not say."""
    if not peak:
        return "none"
    if peak_override:
        return "override"
    if mix is not None:  # peak is the mix's (flowtop.monitor.precision)
        if msg.peak_by_dtype_kind is not None:
            return msg.peak_by_dtype_kind
        return msg.peak_kind if msg.peak_kind not in (None, "none") else "unknown"
    return msg.peak_kind or "unknown"


def rank_mfu(msg: FlopsReport | None, step_time_s: float | None, peak_override: float | None = None,
             tokens_per_s: float | None = None, stalled_s: float | None = None) -> float | None:
    """The MFU :func:`rank_flops` gives for the same arguments, without building the view (the
    model samples it for the sparkline at every telemetry frame: thousands a second)."""
    if msg is None:
        return None
    if stalled_s is not None:
        return 0.0
    fps, _, peak, _, _ = _rates(msg, step_time_s, peak_override, tokens_per_s, False)
    return per_peak(fps, peak)


def _rates(msg: FlopsReport, step_time_s: float | None, peak_override: float | None,
           tokens_per_s: float | None, stalled: bool
           ) -> tuple[float | None, float | None, float | None, float | None, precision.DtypeMix | None]:
    """(model FLOP/s, executed FLOP/s, the peak MFU divides by, HFU's, the precision mix)."""
    model, executed, tokens = msg.model_flops, msg.executed_flops, msg.tokens
    peak = peak_override if peak_override else msg.peak_flops
    mix = precision.mix_of(msg, peak_override)
    hpeak = peak
    if mix is not None:  # each dtype against its own dense peak (flowtop.monitor.precision)
        peak, hpeak = mix.peak_flops, mix.executed_peak_flops
    fps: float | None
    efps: float | None
    if stalled:
        fps = efps = 0.0
    elif tokens > 0 and tokens_per_s:
        # Per token of the counted step × tokens/s: a step of another shape counts by its tokens.
        fps = model / tokens * tokens_per_s
        efps = executed / tokens * tokens_per_s
    elif step_time_s:
        fps, efps = model / step_time_s, executed / step_time_s
    else:
        fps = efps = None
    return fps, efps, peak, hpeak, mix


def _extras(msg: FlopsReport, mix: precision.DtypeMix | None, fps: float | None, tokens: int) -> dict[str, Any]:
    """Precision mix, bf16-equivalent MFU, MoE expert load and non-padding tokens of a rank."""
    bf16 = mix.bf16_peak_flops if mix is not None else None
    nonpad = msg.nonpad_tokens
    return {
        "precision": mix,
        "mfu_bf16": per_peak(fps, bf16),
        "expert_load": moe_load.rank_load(msg),
        "nonpad_tokens": nonpad,
        "nonpad_frac": nonpad / tokens if (nonpad is not None and tokens > 0) else None,
    }


def _summed_label(text: str) -> str:
    """A rank's convention label said of the job's sum over its ranks."""
    return text.replace("local FLOPs of this rank", "Σ over the ranks of their local FLOPs").replace(
        "this rank's", "each rank's")


def _why_none(vs: Sequence[FlopsView]) -> str | None:
    """Why a job has no estimate, when every rank says the same ("none: no tokens counted …"); a
    mix (a pipeline's stages) says nothing."""
    reasons = {v.estimate_source for v in vs}
    why = reasons.pop() if len(reasons) == 1 else None
    return why if why is not None and why.startswith("none:") else None


def job_flops(views: Sequence[FlopsView | None], newest_step_at: float | None = None,
              over: str = "") -> FlopsView | None:
    """Aggregate ranks: sums of FLOPs and FLOP/s; MFU as Σ FLOP/s ÷ Σ peaks. ``newest_step_at``:
    monitor time of the ranks' newest step (their relay's lag added), from their state, for the
    stall of a job whose every rank is stalled (a rank's view between its turns holds when it
    had last stepped as of a round ago). ``views``: the heard ranks' only; ``over``: what the
    figures are over when some ranks are unheard (JobSnapshot.over_phrase), added to the job's
    ``mfu_reason``."""
    vs = [v for v in views if v is not None]
    if not vs:
        return None

    # Thousands of ranks, a dozen fields, every tick: a comprehension a field, each reading its
    # attribute by name (the interpreter's specialized slot read: a map of an attrgetter, a generic
    # lookup a value, took 2.3x the instructions; bench/tick_cost.py).
    fps, efps = _total([v.flops_per_s for v in vs]), _total([v.executed_flops_per_s for v in vs])
    peaks = _total([v.peak_flops for v in vs])
    mix = precision.job_mix([v.precision for v in vs])
    hpeaks = mix.executed_peak_flops if mix is not None else peaks
    uncounted = _summed([v.uncounted_ops for v in vs])
    sizes = _summed([v.uncounted_size for v in vs])
    sources = sorted({v.peak_source for v in vs})
    dtypes = sorted({v.dtype for v in vs})
    conventions = sorted({v.attention_convention for v in vs})
    tokens_flops = [v.flops_per_token for v in vs if v.flops_per_token]
    reason = "" if peaks else "peak unknown on at least one rank"
    stalled = [v.stalled_since for v in vs if v.stalled_since is not None and v.flops_per_s == 0.0]
    job_stalled = None
    if stalled and len(stalled) == len(vs):
        # Every rank stalled: the job makes no step either, since the least-stalled rank's last.
        job_stalled = newest_step_at if newest_step_at is not None else max(stalled)
        reason = ""  # said at display (FlopsView.reason_at)
    if over:
        reason = f"{reason}; {over}" if reason else over
    return FlopsView(
        model_flops_per_step=_total([v.model_flops_per_step for v in vs]),
        executed_flops_per_step=_total([v.executed_flops_per_step for v in vs]),
        estimated_flops_per_step=(estimated := _total([v.estimated_flops_per_step for v in vs])),
        # A job's figures are sums: its labels say so (a rank's say "this rank's"), and a job
        # with no estimate (a pipeline stage without one) has no estimate's source either.
        estimate_source=_summed_label(src) if estimated is not None and (src := vs[0].estimate_source) else (
            _why_none(vs) if estimated is None else None),
        flops_per_s=fps,
        executed_flops_per_s=efps,
        mfu=per_peak(fps, peaks) if peaks else (0.0 if fps == 0.0 and stalled else None),
        hfu=per_peak(efps, hpeaks) if hpeaks else (0.0 if efps == 0.0 and stalled else None),
        peak_flops=peaks,
        peak_source="; ".join(sources),
        peak_kind=job_peak_kind(vs),
        dtype="/".join(dtypes),
        attention_convention="/".join(conventions),
        flops_per_token=sum(tokens_flops) / len(tokens_flops) if tokens_flops else None,
        uncounted_ops=uncounted,
        counted_at_step=min((v.counted_at_step for v in vs if v.counted_at_step is not None), default=None),
        mfu_reason=reason,
        stalled_since=job_stalled,
        counted=all([v.counted for v in vs]),  # a list: a generator cost ~2x a value
        model_note="; ".join(sorted({v.model_note for v in vs if v.model_note})),
        uncounted_size=sizes,
        parallel=_summed_label("; ".join(sorted({v.parallel for v in vs if v.parallel}))[:512]),
        attention_masking=_job_masking(vs),
        **_job_extras(vs, mix, fps),
    )


def _total(vals: list[float | None]) -> float | None:
    """The sum of a field over the ranks, None when some rank's is unknown."""
    return None if None in vals else sum(cast("list[float]", vals))


def _job_masking(vs: Sequence[FlopsView]) -> str | None:
    """The ranks' attention masking: theirs when they agree, "mixed" when they differ, None when
    a rank's is unknown."""
    kinds = {v.attention_masking for v in vs}
    if None in kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _summed(maps: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Counts summed over ``maps`` (most of them empty)."""
    out: dict[str, int] = {}
    for m in filter(None, maps):  # the empty ones (most) skipped in C
        for k, n in m.items():
            out[k] = out.get(k, 0) + n
    return out


def _job_extras(vs: Sequence[FlopsView], mix: precision.DtypeMix | None, fps: float | None) -> dict[str, Any]:
    bf16 = mix.bf16_peak_flops if mix is not None else None
    nonpad = [v.nonpad_tokens for v in vs if v.nonpad_tokens is not None]
    fracs = [v.nonpad_frac for v in vs if v.nonpad_frac]
    known = len(nonpad) == len(fracs) == len(vs)  # every rank sent both (and a nonzero fraction)
    return {
        "precision": mix,
        "mfu_bf16": per_peak(fps, bf16),
        "expert_load": moe_load.job_load([v.expert_load for v in vs]),
        "nonpad_tokens": sum(nonpad) if known else None,
        "nonpad_frac": (sum(nonpad) / sum(n / f for n, f in zip(nonpad, fracs))
                        if known else None),
    }
