"""The tallies of one counting window of the step FLOP counter (probe.flops.counter), and what is
read from them when it closes: the bounded model FLOPs and the :class:`FlopCount`."""

from __future__ import annotations

from collections import defaultdict

from probe.flops.count import AttentionCalls, FlopCount
from probe.flops.opcost import AttentionShape
from probe.flops.precision import scaled_to


class Window:
    """Tallies of one counting window (plain attributes: touched under the GIL only)."""

    def __init__(self) -> None:
        self.model = 0
        self.executed = 0
        self.by_op: defaultdict[str, int] = defaultdict(int)
        self.by_dtype: defaultdict[str, int] = defaultdict(int)  # executed FLOPs per dtype label
        self.model_by_dtype: defaultdict[str, int] = defaultdict(int)
        self.uncounted: defaultdict[str, int] = defaultdict(int)
        self.uncounted_size: defaultdict[str, int] = defaultdict(int)
        self.overhead = 0.0
        self.micro_batches = 0
        self.forward_model = 0  # model FLOPs of ops run outside the autograd engine
        self.backward_model = 0  # ... and inside it (gradients)
        self.attention_shapes: defaultdict[AttentionShape, int] = defaultdict(int)
        self.activation_products = 0  # executed FLOPs of batched matmuls of two activations
        # forward attention calls read by a formula (count.AttentionCalls' fields)
        self.attn_calls = self.attn_pairs = self.attn_queries = 0
        self.attn_documents = self.attn_causal = self.attn_bidirectional = 0


#: Batched matmuls, and where their two operands are among the op's arguments.
BATCHED = {"aten.bmm": 0, "aten.baddbmm": 1}


def of_activations(first: int, args: tuple) -> bool:
    """Whether a batched matmul multiplies two batches of matrices: a batch of 2+ with neither
    operand broadcast over it. Hand-written attention is one (B·heads products); an einsum with a
    weight runs as a batch of 1, a weight expanded over the batch has stride 0."""
    if len(args) < first + 2:
        return False  # operands passed by keyword: not read (the count itself is unaffected)
    a, b = args[first], args[first + 1]
    return a.dim() == 3 and a.shape[0] > 1 and a.stride(0) != 0 and b.stride(0) != 0


def cap_backward(win: Window) -> tuple[int, str]:
    """Model FLOPs of a window, and a note when they had to be bounded.

    No op's gradients cost more than twice its forward (a matmul's input and weight gradients
    are one forward each; attention's model backward is 2x). A backward that counted more ran
    forward ops again where we cannot see it: recomputation inside a torch.compile'd backward
    (activation checkpointing), where grad mode is off. Its excess is not model FLOPs; the
    bound is exact when every matmul input needs a gradient and an upper bound otherwise."""
    excess = win.backward_model - 2 * win.forward_model
    if win.forward_model <= 0 or excess <= 0:
        return win.model, ""
    return win.model - excess, ("backward bounded at 2x the forward: recompute inside a compiled backward "
                                f"({excess / max(1, win.model):.1%} of the counted model FLOPs) cannot be told "
                                "from gradients")


def to_count(win: Window, model: int, note: str, attention: str, dtype: str) -> FlopCount:
    """The window's count, with its (bounded) model FLOPs, their note, the attention convention
    and the compute dtype decided by the counter."""
    return FlopCount(
        model_flops=model,
        executed_flops=win.executed,
        attention_convention=attention,
        dtype=dtype,
        by_op=dict(win.by_op),
        uncounted=dict(win.uncounted),
        uncounted_size=dict(win.uncounted_size),
        micro_batches=win.micro_batches,
        cost_s=win.overhead,
        model_note=note,
        attention_shapes=dict(win.attention_shapes),
        activation_products=win.activation_products,
        attention_calls=AttentionCalls(
            win.attn_calls, win.attn_pairs, win.attn_queries, win.attn_documents, win.attn_causal,
            win.attn_bidirectional),
        model_by_dtype=scaled_to(win.model_by_dtype, model),
        executed_by_dtype=dict(win.by_dtype),
    )
