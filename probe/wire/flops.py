"""A ``flops`` message as a typed record: what the monitor reads of a rank's latest FLOP count.
Standard library only.

The message's fields are validated where the frame is decoded (probe.wire's schema refuses a bad
value with a WireError); :func:`flops_report` only reads them, with the defaults the monitor has
always read a missing optional field as. The fields nobody reads (``signature``, ``cost_s``) are
left out: a rank keeps its record until its next count, thousands of ranks at once.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Literal, Mapping, NoReturn, TypeVar

T = TypeVar("T")

#: Where a rank's dense peak comes from, in one word (the message's ``peak_kind``, wire 1.4): a
#: datasheet table row, the CPU estimate (cores × clock × FLOPs/cycle), the user's override, or no
#: peak (no MFU). The words are the probe's, set where it picks the peak (probe.flops.peaks).
PeakKind = Literal["table", "estimate", "override", "none"]
PEAK_KINDS: tuple[PeakKind, ...] = ("table", "estimate", "override", "none")
#: Where the peaks of a precision mix (``peak_by_dtype``) come from (``peak_by_dtype_kind``, wire
#: 1.4): one kind for them all, or "mixed" (a per-dtype override beside table rows).
MixPeakKind = Literal["table", "estimate", "override", "mixed"]
MIX_PEAK_KINDS: tuple[MixPeakKind, ...] = ("table", "estimate", "override", "mixed")

#: One shared empty map for the maps most counts leave out (an MoE load, a precision mix, ...).
_NONE: Mapping[str, NoReturn] = MappingProxyType({})  # NoReturn: it holds no value, of any type


def _none() -> Mapping[str, NoReturn]:
    """The shared empty map (a dataclass default cannot be a map itself)."""
    return _NONE


#: Text at most this long is interned (as the monitor interns its other remote names).
INTERN_MAX = 256


@dataclass(frozen=True, slots=True)
class DtypeFlops:
    """The FLOPs of one operand dtype label in the counted step (``flops_by_dtype``'s [model, executed])."""

    model: float  # model FLOPs of the ops that ran in this dtype
    executed: float  # executed FLOPs of those ops (recompute included)


#: In ``estimate_source`` where no attention block was found and none ran (a CNN, an MLP): the
#: monitor then says the model has no attention rather than what a convention does to it.
NO_ATTENTION_FOUND = "no attention blocks found, none ran"


@dataclass(frozen=True, slots=True)
class FlopsReport:
    """A rank's FLOP count of one step and its conventions (the ``flops`` message, probe.flops)."""

    model_flops: float
    executed_flops: float
    #: The counted step (None: not said, a message built by hand).
    step: int | None = None
    tokens: int = 0  # tokens of the counted step (0: not known)
    estimated_flops: float | None = None  # the transformer estimate (6N+12LdT), when there is one
    estimate_source: str | None = None  # where the estimate came from, or why there is none
    attention: str = "full"  # the attention FLOP convention: "full" or "causal"
    #: The counted step's attention calls: "causal", "bidirectional" or "mixed" (None: not read).
    attention_masking: str | None = None
    dtype: str = "?"
    peak_flops: float | None = None  # the rank's dense peak, FLOP/s (None: not known)
    peak_source: str = ""
    #: ``peak_source`` in one word (None: an older probe, which did not say).
    peak_kind: PeakKind | None = None
    #: Calls per op the counter could not count, and the FLOP-like size of each such op.
    uncounted: Mapping[str, int] = field(default_factory=_none)
    uncounted_size: Mapping[str, int] = field(default_factory=_none)
    counted: bool = True  # False: the figures are the model-shape estimate, not a count
    model_note: str = ""  # how model FLOPs were derived where not a plain count
    parallel: str = ""  # mesh and placements under DTensor parallelism (figures are local)
    #: Model and executed FLOPs per operand dtype label (empty: an older probe, or none named).
    flops_by_dtype: Mapping[str, DtypeFlops] = field(default_factory=_none)
    #: The dense peak, FLOP/s, of each dtype label on this device (a label without one is absent).
    peak_by_dtype: Mapping[str, float] = field(default_factory=_none)
    #: Where the peaks of ``peak_by_dtype`` come from (None: an older probe, or no peak there).
    peak_by_dtype_kind: MixPeakKind | None = None
    #: Tokens per local expert of each MoE layer in the counted step (empty: not an MoE model).
    expert_load: Mapping[str, tuple[int, ...]] = field(default_factory=_none)
    nonpad_tokens: int | None = None  # non-padding tokens of the counted step


def flops_report(fields: Mapping[str, Any]) -> FlopsReport:
    """The record of a ``flops`` message's (validated) fields; its text interned (every rank of a
    job names the same dtype, peak source and ops). Unknown fields are ignored."""
    get = fields.get
    estimated, peak, nonpad, step = get("estimated_flops"), get("peak_flops"), get("nonpad_tokens"), get("step")
    return FlopsReport(
        model_flops=float(fields["model_flops"]),
        executed_flops=float(fields["executed_flops"]),
        step=int(step) if step is not None else None,
        tokens=int(get("tokens", 0)),
        estimated_flops=float(estimated) if estimated is not None else None,
        estimate_source=_opt_text(get("estimate_source")),
        attention=_text(get("attention", "full")),
        attention_masking=_opt_text(get("attention_masking")),
        dtype=_text(get("dtype", "?")),
        peak_flops=float(peak) if peak is not None else None,
        peak_source=_text(get("peak_source", "")),
        peak_kind=_peak_kind(get("peak_kind")),
        uncounted=_counts(get("uncounted")),
        uncounted_size=_counts(get("uncounted_size")),
        counted=get("counted", True) is not False,
        model_note=_text(get("model_note", "")),
        parallel=_text(get("parallel", "")),
        flops_by_dtype=_named(get("flops_by_dtype"), _dtype_flops),
        peak_by_dtype=_named(get("peak_by_dtype"), float),
        peak_by_dtype_kind=_mix_peak_kind(get("peak_by_dtype_kind")),
        expert_load=_named(get("expert_load"), lambda v: tuple(int(n) for n in v)),
        nonpad_tokens=int(nonpad) if nonpad is not None else None,
    )


def _text(s: Any) -> str:
    s = str(s)
    return sys.intern(s) if len(s) <= INTERN_MAX else s


def _opt_text(s: Any) -> str | None:
    return None if s is None else _text(s)


def _counts(m: Any) -> Mapping[str, int]:
    return _named(m, int)


def _named(m: Any, value: Callable[[Any], T]) -> Mapping[str, T]:
    """A map of names to ``value`` of each (its names interned); the shared empty map for none."""
    if not m:
        return _NONE
    return {_text(k): value(v) for k, v in m.items()}


def _dtype_flops(pair: Any) -> DtypeFlops:
    """A ``flops_by_dtype`` value, [model, executed] on the wire (the schema checked its width), as its record."""
    model, executed = pair
    return DtypeFlops(model=float(model), executed=float(executed))


def _peak_kind(value: object) -> PeakKind | None:
    """The message's ``peak_kind`` as its type (the schema let only PEAK_KINDS through)."""
    for kind in PEAK_KINDS:
        if value == kind:
            return kind
    return None


def _mix_peak_kind(value: object) -> MixPeakKind | None:
    """The message's ``peak_by_dtype_kind`` as its type (the schema let only MIX_PEAK_KINDS through)."""
    for kind in MIX_PEAK_KINDS:
        if value == kind:
            return kind
    return None
