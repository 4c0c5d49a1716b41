"""Rows of the hint rules table that read the sampled kernel windows (see flowtop.monitor.hints.rules).

Split from :mod:`flowtop.monitor.hints.rules` for size; the table's order is rules.RULES.
"""

from __future__ import annotations

from flowtop.monitor.hints.schema import Gate, Rule
from flowtop.monitor.kernels.merge import FLAG_SIGMAS

#: uneven_kernel's noise gate: the difference at least FLAG_SIGMAS standard errors (the same test
#: as the job kernel view's mark), as the standard error's share of the difference, %.
NOISE_PCT = 100.0 / FLAG_SIGMAS

# Kernel categories whose time is bound by memory bandwidth rather than math.
# Names follow flowtop.monitor.kernels.classify.CATEGORIES.
MEMORY_CATEGORIES: tuple[str, ...] = ("elementwise", "norm_softmax", "reduction", "memory")

KERNEL_RULES: tuple[Rule, ...] = (
    Rule(
        id="comm_exposed",
        scope="rank",
        severity="warning",
        measure="comm_pct",
        unit="pct",
        direction="above",
        threshold=10.0,
        clear=8.0,
        window_steps=1,
        window_s=0.0,
        summary="{target} spends {comm_pct:.0f} % of the step in communication kernels, only "
        "{overlap_pct:.0f} % of that overlapped with compute",
        action="Overlap gradient all-reduce with backward: DDP with gradient_as_bucket_view=True "
        "and a tuned bucket_cap_mb, FSDP forward/backward prefetch; fewer, larger buckets; "
        "check the interconnect with NCCL_DEBUG=INFO.",
        gates=(Gate("overlap_pct", "<", 50.0, 60.0),),
        critical_at=30.0,
        doc="communication (NCCL) kernel time ÷ step time in the kernel window; gate: share of it "
        "overlapped with compute kernels",
    ),
    Rule(
        id="launch_bound",
        scope="rank",
        severity="warning",
        measure="busy_pct",
        unit="pct",
        direction="below",
        threshold=50.0,
        clear=60.0,
        window_steps=1,
        window_s=0.0,
        summary="{target} GPU is busy only {busy_pct:.0f} % of the step; {short_kernel_pct:.0f} % "
        "of its {launches_per_step:.0f} kernels per step run shorter than a launch takes",
        action="Give the GPU more work per launch: a larger batch per step, torch.compile "
        "(mode=\"reduce-overhead\" uses CUDA graphs) or CUDA graphs directly, fused kernels "
        "instead of chains of small ops.",
        gates=(Gate("short_kernel_pct", ">=", 50.0, 40.0),),
        critical_at=20.0,
        doc="GPU busy time (union of kernel intervals) ÷ step time in the kernel window; gate: "
        "share of kernels whose device time is shorter than their launch call",
    ),
    Rule(
        id="memory_bound",
        scope="rank",
        severity="warning",
        measure="memory_pct",
        unit="pct",
        direction="above",
        threshold=50.0,
        clear=40.0,
        window_steps=1,
        window_s=0.0,
        summary="{target}: {memory_pct:.0f} % of GPU time goes to memory-bound kernels "
        "({top_categories})",
        action="Fuse chains of elementwise/norm ops (torch.compile, fused LayerNorm/RMSNorm, "
        "fused cross-entropy), drop needless dtype casts and copies (.float(), .contiguous()), "
        "keep activations in bf16.",
        params={"categories": MEMORY_CATEGORIES},
        doc="time in kernels of the categories " + ", ".join(MEMORY_CATEGORIES) + " ÷ summed kernel "
        "time (the busy time, when one stream runs at a time)",
    ),
    Rule(
        id="fp32_matmul",
        cost=12,
        scope="rank",
        severity="warning",
        measure="fp32_gemm_pct",
        unit="pct",
        direction="above",
        threshold=10.0,
        clear=5.0,
        window_steps=1,
        window_s=0.0,
        summary="{target} runs matmuls in plain fp32 ({fp32_gemm_pct:.0f} % of matmul time{via}): "
        "the tensor cores sit idle",
        action="Enable TF32 (torch.set_float32_matmul_precision(\"high\")) or train in bf16 "
        "(torch.autocast(\"cuda\", dtype=torch.bfloat16)); on H100/H200 dense fp32 peaks at "
        "66.9 TFLOP/s against 494.7 (TF32) and 989.4 (bf16).",
        params={
            # Substrings (lower case) of fp32 GEMM kernel names that do not use tensor cores ...
            "fp32_patterns": ("sgemm", "gemm_f32f32_f32f32", "gemv2t_kernel_val<float", "simt_sgemm"),
            # ... unless the name also says TF32/half/bf16 tensor-core work.
            "tensor_patterns": ("tf32", "bf16", "f16", "hgemm", "h1688", "h16816", "s1688", "s16816",
                                "tensorop", "hmma"),
            # Time saved when fp32 GEMMs move to TF32: 1 - 66.9 / 494.7 (dense peaks, H100/H200).
            "saving": 0.86,
            # Impact assumed when only FlopsView.dtype says fp32 (no kernel window yet).
            "default_impact": 0.3,
        },
        doc="share of matmul kernel time in fp32 non-tensor-core kernels (names in "
        "params.fp32_patterns); 100 when the FLOP count's dtype is fp32 on a CUDA device",
    ),
    Rule(
        id="attention_unfused",
        scope="rank",
        severity="warning",
        measure="softmax_calls_per_step",
        unit="calls",
        direction="above",
        threshold=1.0,
        clear=1.0,
        window_steps=1,
        window_s=0.0,
        summary="{target} computes attention unfused: {softmax_calls_per_step:.0f} softmax kernels "
        "per step between matmuls and no fused attention kernel",
        action="Use torch.nn.functional.scaled_dot_product_attention (flash / cuDNN / "
        "memory-efficient backends) or flash-attn instead of matmul + softmax + matmul; it "
        "never writes the score matrix to memory.",
        gates=(
            Gate("attention_calls_per_step", "<", 0.5, 0.5),
            Gate("gemm_per_softmax", ">=", 2.0, 2.0),
        ),
        params={
            "softmax_patterns": ("softmax",),
            # The loss's log-softmax is not attention; backward kernels pair with a forward one.
            "exclude_patterns": ("logsoftmax", "log_softmax"),
            "backward_patterns": ("backward", "bwd", "grad"),
            # Rows of these operators (a CPU window's rows are operators) are not counted: plain
            # matmuls are not attention's (its are batched: bmm, baddbmm) — a Linear, e.g. an MoE
            # router's, whose softmax read as unfused attention in a model with none (a new
            # user's trial) — and matmul/einsum only dispatch to mm or bmm, rows of their own.
            "unbatched_ops": ("aten::mm", "aten::addmm", "aten::linear", "aten::_addmm_activation",
                              "aten::mv", "aten::addmv", "aten::_scaled_mm", "aten::matmul", "aten::einsum"),
        },
        doc="forward softmax kernels per step (log-softmax excluded) while no kernel of category "
        "attention ran; gate: at least 2 matmul kernels per softmax, not counting a CPU window's "
        "plain mm/addmm/linear operators (an MoE router's softmax is not attention)",
    ),
    Rule(
        id="optimizer_unfused",
        scope="rank",
        severity="warning",
        measure="optimizer_pct",
        unit="pct",
        direction="above",
        threshold=5.0,
        clear=4.0,
        window_steps=1,
        window_s=0.0,
        summary="{target}: the optimizer takes {optimizer_pct:.0f} % of the step in "
        "{optimizer_calls_per_step:.0f} small kernels (not fused)",
        action="Use a fused or foreach optimizer: torch.optim.AdamW(..., fused=True) (or "
        "foreach=True); apex FusedAdam; fewer, larger parameter tensors.",
        gates=(
            Gate("fused_calls_per_step", "<", 0.5, 0.5),
            Gate("optimizer_calls_per_step", ">=", 10.0, 10.0),
        ),
        params={
            "fused_patterns": ("multi_tensor_apply", "fused", "_foreach_"),
            # Host operators that launch one kernel per parameter tensor in torch.optim's
            # single-tensor Adam/AdamW/SGD paths (distinctive enough not to come from the model).
            "per_tensor_ops": ("aten::addcdiv_", "aten::addcmul_", "aten::lerp_", "aten::sqrt"),
        },
        doc="time in kernels launched by per-tensor optimizer ops (params.per_tensor_ops; a lower "
        "bound of the optimizer's time) ÷ step time; gates: no fused/multi-tensor optimizer kernel "
        "and at least 10 such kernels per step",
    ),
    Rule(
        id="uneven_kernel",
        scope="kernel",
        severity="info",
        measure="spread_pct",
        unit="pct",
        direction="above",
        threshold=20.0,
        clear=15.0,
        window_steps=1,
        window_s=0.0,
        summary="kernel {target} takes {max_us:.0f} µs on rank {slowest_rank} but {min_us:.0f} µs "
        "on rank {fastest_rank} (spread {spread_pct:.0f} % of its mean)",
        action="Look for uneven work between ranks: different sequence lengths or padding per "
        "rank (bucket/pack batches), MoE routing imbalance, or a slower GPU on that rank "
        "(clocks, throttling).",
        # noise_pct < 25: the difference is at least 4 standard errors (merge.FLAG_SIGMAS) of the
        # two ranks' window-to-window scatter, so identical ranks' timing noise (host operators
        # preempted on a shared CPU) does not fire it
        gates=(Gate("step_share_pct", ">=", 1.0, 0.5), Gate("noise_pct", "<", NOISE_PCT, 2 * NOISE_PCT)),
        params={"max_rows": 50, "min_windows": 3},
        doc="(max − min) ÷ mean of the kernel's mean time per window across the ranks (at least "
        "min_windows windows each); gates: max − min as a share of the mean step, and its standard "
        "error (the two ranks' scatter over their windows) as a share of it; the max_rows most "
        "uneven kernels (µs) are examined",
    ),
)
