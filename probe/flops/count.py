"""The FLOPs of one counted training step: what the counter (probe.flops.counter) produces and the
policy (probe.flops.policy) carries between counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from probe.flops.opcost import AttentionShape


@dataclass(frozen=True)
class AttentionCalls:
    """The forward attention calls of a counted step that a formula read (probe.flops.opcost
    AttentionPairs, summed): ``pairs`` query-key pairs (before any causal halving) for ``queries``
    queries; ``documents``: calls that revealed packed documents; ``causal`` / ``bidirectional``:
    calls with causal masking / without (calls whose masking was not read are neither)."""

    calls: int = 0
    pairs: int = 0
    queries: int = 0
    documents: int = 0
    causal: int = 0
    bidirectional: int = 0

    def masking(self) -> str | None:
        """"causal", "bidirectional" or "mixed" when every call's masking was read, else None."""
        if self.calls == 0 or self.causal + self.bidirectional != self.calls:
            return None
        return "mixed" if self.causal and self.bidirectional else ("causal" if self.causal else "bidirectional")


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one counted training step (all micro-batches between two optimizer steps).

    ``by_op`` holds executed FLOPs per op name ("aten.mm"); ``uncounted`` maps heavy ops with
    no formula to their call counts; ``cost_s`` is the counter's own bookkeeping time (a lower
    bound of its overhead: the per-op trip into Python is not measurable from inside).
    """

    model_flops: int
    executed_flops: int
    attention_convention: str
    dtype: str
    by_op: dict[str, int] = field(default_factory=dict)
    uncounted: dict[str, int] = field(default_factory=dict)
    #: FLOP-like size per uncounted op, summed over its calls (probe.flops.uncounted: a rough bound).
    uncounted_size: dict[str, int] = field(default_factory=dict)
    micro_batches: int = 0
    cost_s: float = 0.0
    #: How model FLOPs were derived where they are not a plain count ("" when they are).
    model_note: str = ""
    #: Forward attention calls by shape (the estimate reads the model's L, d, T from them).
    attention_shapes: dict[AttentionShape, int] = field(default_factory=dict)
    #: Model and executed FLOPs per operand dtype label (probe.flops.precision): the mix MFU is taken over.
    model_by_dtype: dict[str, int] = field(default_factory=dict)
    executed_by_dtype: dict[str, int] = field(default_factory=dict)
    #: Executed FLOPs of batched matmuls of two activations (probe.flops.counter: attention written
    #: by hand, or a grouped expert's weights; the estimate tells them apart).
    activation_products: int = 0
    #: Forward attention calls: their query-key pairs and masking (the estimate's T, the causal note).
    attention_calls: AttentionCalls = field(default_factory=AttentionCalls)
