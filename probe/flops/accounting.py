"""Builds the ``flops`` wire message: counted FLOPs, transformer estimate and the dense peak."""

from __future__ import annotations

from typing import Any

import torch

from probe.flops import dtensor as flops_dtensor, estimate, peaks, precision
from probe.flops.count import FlopCount
from probe.flops.dtensor import ParallelLayout
from probe.flops.padding import MicroBatchKeys
from probe.wire.flops import NO_ATTENTION_FOUND


def _where(source: str) -> str:
    """Where the estimate found the model's shape, in words: "config:config" -> "model.config"."""
    kind, _, path = source.partition(":")
    if kind == "config":
        return f"model.{path}"
    if kind == "blocks":
        return "the model's blocks" if path == "<root>" else f"the blocks of model.{path}"
    if kind == "attention":
        calls, _, batches = path.partition("/")
        return f"the counted step's attention calls ({calls} in {batches} micro-batch{'es' if batches != '1' else ''})"
    return source


def _label(est: estimate.Estimate, attention: str, seq: int | None, masking: str | None = None) -> str:
    """``estimate_source``: the formula, where its shape came from, and its figures."""
    if est.source == "override":
        return "override (flops_per_token)"
    active = "_active" if est.moe else ""  # MoE: N counts top_k experts per token (probe.flops.moe)
    moe_note = f"; {est.moe}" if est.moe else ""
    local = f"/{est.split} (this rank's tensor-parallel share; N local)" if est.split > 1 else ""
    if est.source == estimate.NO_ATTENTION:
        share = "; this rank's tensor-parallel share, N local" if est.split > 1 else ""
        return f"6N{active} ({NO_ATTENTION_FOUND}{share}): N{active}={est.n_params}{moe_note}"
    # the causal convention halves causal attention: the count of a bidirectional model halves nothing
    bidi = " (bidirectional attention: not halved)" if masking == "bidirectional" and attention == "causal" else ""
    attn = 6 if attention == "causal" and not bidi else 12
    # context parallel: T is every key of the sequence, the rank's shard its queries and tokens
    keys = f" (all keys; cp={est.cp}: this rank's {seq} queries)" if est.cp > 1 and seq else ""
    # micro-batches of several lengths, packed documents: T per token, and how it was taken
    t = f"{est.keys:.6g} per token ({est.keys_note})" if est.keys_note else str(est.seq_len)
    return (f"6N{active}+{attn}LdT{local}{bidi}, shape from {_where(est.source)}: N{active}={est.n_params}, "
            f"L={est.n_layers}, d={est.d_model}, T={t}{keys}{moe_note}")


def unwrap(module: Any) -> Any:
    """The user's model inside DDP/FSDP (``.module``) and torch.compile (``._orig_mod``)."""
    for _ in range(4):
        inner = getattr(module, "_orig_mod", None) or getattr(module, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        module = inner
    return module


def cpu_cores_of_rank(local_ranks: int, host: int | None = None, allowed: int | None = None,
                      threads: int | None = None) -> float:
    """Cores a CPU rank computes on: its torch threads, at most its share of the cores it may run
    on. Ranks sharing a host must not each claim all of it: a rank owns its CPU set (taskset,
    numactl, Slurm's binding) up to 1/``local_ranks`` of the host — a fraction of a core when
    there are more ranks than cores (4 ranks on 2 cores each claimed a whole one: the job's peak
    was twice the machine's; a new user's trial). The host's figures can be injected (tests)."""
    import os

    host = host or os.cpu_count() or 1
    if allowed is None:
        try:
            allowed = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            allowed = host
    # Its CPU set, at most its share of the host: pinned sets of their own (Slurm's binding)
    # count whole, and ranks whose sets overlap (more ranks × set than the host holds) never
    # claim more than the host together. (A set the ranks share, a taskset around the whole
    # launch, is not told apart from a set of one's own from inside: each still claims up to
    # its share of the host.)
    share = min(float(allowed), host / max(1, local_ranks))
    return min(share, float(threads if threads is not None else torch.get_num_threads()))


def seq_len_of(signature: tuple[Any, ...]) -> int | None:
    """Sequence length: the last dim of the first integer (token index) input of rank ≥ 2.

    Signature entries are ``(path, shape, dtype)`` (probe.flops.policy.signature_of)."""
    for entry in signature:
        if not isinstance(entry, tuple) or len(entry) != 3:
            continue
        _, shape, dtype = entry
        if isinstance(shape, tuple) and len(shape) >= 2 and "int" in str(dtype):
            return int(shape[-1])
    return None


def flops_message(
    count: FlopCount,
    *,
    step: int,
    tokens: int,
    root: Any,
    signature: tuple[Any, ...],
    device: torch.device | None,
    device_name: str,
    flops_per_token: float | None,
    attention: str,
    local_ranks: int = 1,
    cp: int = 1,
    layout: ParallelLayout | None = None,
    layout_known: bool = False,
    keys: MicroBatchKeys | None = None,
) -> dict[str, Any]:
    """Fields of one ``flops`` message (see probe.wire). ``local_ranks``: training processes
    sharing this host (a CPU rank's peak is its share of the cores); ``cp``: this rank's
    context-parallel degree (its token ids are a shard of each sequence: the estimate's
    attention term takes the whole sequence, probe.flops.estimate); ``layout`` with ``layout_known``:
    the root's DTensor layout as the count's window read it (else read here); ``keys``: the counted
    step's micro-batch lengths (probe.flops.padding: the estimate's T per micro-batch)."""
    estimated = None
    seq = seq_len_of(signature)
    masking = count.attention_calls.masking()  # "causal" | "bidirectional" | "mixed" | None (not read)
    # The causal convention halves causal attention calls; a model whose every call is
    # bidirectional (a ViT, BERT) has nothing halved in its count, nor in its estimate.
    est_attention = "full" if masking == "bidirectional" else attention
    est, reason = None, "the model (root module) is not known yet"
    if not layout_known:  # the counter read it when its window opened: one walk of the parameters
        layout = flops_dtensor.layout_of(unwrap(root)) if root is not None else None
    no_tokens = "no tokens counted (no nn.Embedding fed token ids)"
    if not tokens and not flops_per_token:  # a per-token figure needs tokens: spare the model's walk
        reason = no_tokens
    elif root is not None:
        est, reason = estimate.estimate_with_reason(
            unwrap(root), seq or 0, attention=est_attention, flops_per_token=flops_per_token, layout=layout,
            seen=count.attention_shapes, micro_batches=count.micro_batches, cp=cp,
            ran_attention=estimate.attention_ran(count), ran_batched=estimate.batched_matmuls_ran(count),
            micro_keys=keys, calls=count.attention_calls)
    elif flops_per_token:
        est = estimate.Estimate(flops_per_token, 0, 0, 0, seq or 0, "override")
    if est is not None and tokens:
        estimated = est.flops_per_token * tokens
        source = _label(est, attention, seq, masking)
    else:  # why not, where the estimate would stand (the rank's FLOP panel shows it)
        source = f"none: {reason if est is None else no_tokens}"
    source = source[:256]  # the wire's limit: a long module path must not cost the whole message
    on_cpu = device is None or device.type != "cuda"
    if on_cpu:
        peak, reason = peaks.resolve_peak("cpu", count.dtype)
        if peak is not None and peak.kind != "override":
            peak = peaks.cpu_peak(count.dtype, cores=cpu_cores_of_rank(local_ranks))
    else:
        peak, reason = peaks.resolve_peak(device_name, count.dtype)
    return {
        "step": step,
        "model_flops": float(count.model_flops),
        "executed_flops": float(count.executed_flops),
        "estimated_flops": estimated,
        "estimate_source": source,
        "attention": count.attention_convention,
        # whether the counted step's attention calls were causal: the convention's text says so
        **({"attention_masking": masking} if masking else {}),
        "dtype": count.dtype,
        "peak_flops": peak.flops if peak else None,
        "peak_source": peak.source if peak else f"unknown: {reason}",
        "peak_kind": peak.kind if peak else "none",
        "uncounted": {k[:256]: int(v) for k, v in list(count.uncounted.items())[:200]},
        # FLOP-like size of those ops (a rough bound from shapes): the monitor weighs them by it
        "uncounted_size": {k[:256]: min(int(v), 2**62) for k, v in list(count.uncounted_size.items())[:200]},
        "tokens": int(tokens),
        "signature": str(signature)[:4096],
        "cost_s": float(count.cost_s),
        "model_note": count.model_note[:256],
        # Under DTensor parallelism: the mesh and placements; the figures above are this rank's own
        **({"parallel": layout.describe()} if layout is not None else {}),
        # FLOPs and dense peak per operand dtype: the monitor's MFU against each op's own peak
        **precision.message_fields(count.model_by_dtype, count.executed_by_dtype, on_cpu=on_cpu,
                                   device_name=device_name, cpu_cores=cpu_cores_of_rank(local_ranks)),
    }
