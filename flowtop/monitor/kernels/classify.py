"""Kernel and operator categories, and short display names (the names: docs/design.md, "Kernel names and categories").

One ordered rule table maps a GPU kernel name (or a host operator name such as ``aten::mm``) to a
category; the first matching rule wins, so the order encodes precedence: attention before GEMM
(fused attention kernels are often built from CUTLASS/GEMM pieces and carry those words),
optimizer before elementwise (``multi_tensor_apply_kernel`` runs the optimizer math), norms before
elementwise (``vectorized_layer_norm_kernel``).  Patterns match the kernel's *signature head*
(name and template arguments, not the argument list), lower-cased.

Operator names (``aten::*``) are looked up first in an exact table, because short aten names
(``mm``, ``add``) are too short to match as substrings.
"""

from __future__ import annotations

CATEGORIES: tuple[str, ...] = (
    "gemm",
    "attention",
    "communication",
    "memory",
    "optimizer",
    "norm_softmax",
    "elementwise",
    "reduction",
    "other",
)

# (category, substrings) in precedence order; matched against the lower-cased signature head.
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("memory", ("memcpy", "memset")),
    ("communication", (
        "nccl", "c10d::", "gloo", "nvshmem", "record_param_comms", "allreduce", "all_reduce",
        "allgather", "all_gather", "reduce_scatter", "reducescatter", "alltoall", "all_to_all",
    )),
    ("optimizer", ("multi_tensor_apply", "fused_adam", "fusedadam", "fused_sgd", "_foreach_", "optimizer")),
    ("attention", (
        "flash_fwd", "flash_bwd", "flash_attn", "flash_fprop", "flash_bprop", "fmha", "sdpa",
        "attention", "dot_do_o", "convert_dq",
    )),
    ("gemm", (
        "nvjet", "xmma", "cutlass", "gemm", "cublas", "ampere_", "volta_", "turing_", "hopper_",
        "triton_tem", "implicit_convolve", "conv2d", "conv3d", "convolution",
    )),
    ("norm_softmax", (
        "layer_norm", "layernorm", "rms_norm", "rmsnorm", "batch_norm", "batchnorm", "group_norm",
        "groupnorm", "instance_norm", "softmax", "gammabeta",
    )),
    ("reduction", ("reduce", "triton_red", "triton_per", "nll_loss", "cross_entropy", "argmax", "argmin")),
    ("elementwise", (
        "elementwise", "triton_poi", "pointwise", "vectorized", "fill", "copy", "catarray",
        "gather", "scatter", "index", "embedding", "dropout",
    )),
)

# Exact aten operator names (without "aten::", in-place "_" and "_backward" suffixes stripped).
_ATEN: dict[str, str] = {}
for _cat, _names in (
    ("gemm", (
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_mm", "_int_mm",
        "_addmm_activation", "mv", "addmv", "dot", "einsum", "convolution", "_convolution",
        "conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution", "_grouped_mm",
    )),
    ("norm_softmax", (
        "layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "batch_norm",
        "native_batch_norm", "group_norm", "native_group_norm", "softmax", "_softmax",
        "log_softmax", "_log_softmax",
    )),
    ("reduction", (
        "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm", "linalg_vector_norm",
        "nll_loss", "nll_loss_forward", "nll_loss2d_forward", "cross_entropy_loss", "cumsum", "var",
        "std", "prod", "logsumexp",
    )),
    ("elementwise", (
        "add", "sub", "mul", "div", "neg", "exp", "log", "pow", "sqrt", "rsqrt", "tanh", "sigmoid",
        "gelu", "relu", "silu", "threshold", "clamp", "where", "dropout", "native_dropout",
        "fill", "zero", "copy", "_to_copy", "to", "clone", "contiguous", "cat", "stack",
        "embedding", "embedding_dense", "index_select", "gather", "scatter", "masked_fill", "lerp",
        "addcmul", "addcdiv", "abs", "sign", "reciprocal", "maximum", "minimum", "eq", "ne",
    )),
):
    for _n in _names:
        _ATEN[_n] = _cat

_GENERIC_BASES = frozenset({
    "elementwise_kernel", "vectorized_elementwise_kernel", "unrolled_elementwise_kernel",
    "multi_tensor_apply_kernel", "reduce_kernel", "index_elementwise_kernel",
    "elementwise_kernel_with_index", "kernel",
})
_GENERIC_HINTS = frozenset({"gpu_kernel_impl", "gpu_kernel_impl_nocast", "launch_kernel", "gpu_kernel"})
# Identifiers inside template arguments that say nothing about what the kernel computes.
_NOISE = frozenset({
    "TensorListMetadata", "FusedOptimizerTensorListMetadata", "array", "TrivialOffsetCalculator",
    "OffsetCalculator", "ReduceOp", "func_wrapper_t", "lambda", "operator", "LoadWithoutCast",
    "StoreWithoutCast", "LoadWithCast", "StoreWithCast", "TensorIteratorBase", "BFloat16", "Half",
    "unsigned", "float", "double", "long", "char", "bool", "const", "void", "detail",
})


def _strip_op_suffixes(base: str) -> str:
    for suffix in ("_backward_data", "_backward_input", "_backward_weight", "_backward"):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def classify(name: str) -> str:
    """Category of a kernel or operator name: one of :data:`CATEGORIES`."""
    if name.startswith("autograd::") or _is_autograd_node(name):
        return "other"  # engine wrappers: their own time is bookkeeping, the math is in their children
    if name.startswith("aten::"):
        base = name[6:].split(".")[0]
        hit = _ATEN.get(base) or _ATEN.get(base.rstrip("_")) or _ATEN.get(_strip_op_suffixes(base))
        if hit is not None:
            return hit
    head = signature_head(name).lower()
    for category, patterns in _RULES:
        for pattern in patterns:
            if pattern in head:
                return category
    return "other"


def _is_autograd_node(name: str) -> bool:
    """``MmBackward0``, ``torch::autograd::AccumulateGrad`` ..."""
    stem = name.rstrip("0123456789")
    return (stem.endswith("Backward") and stem != name and name.isidentifier()) or name.startswith("torch::autograd::")


def _close(s: str, i: int) -> int:
    """Index just past the bracket group opening at ``s[i]`` (or len(s) when unbalanced)."""
    pairs = {"(": ")", "<": ">", "{": "}", "[": "]"}
    stack = [pairs[s[i]]]
    j = i + 1
    while j < len(s) and stack:
        c = s[j]
        if c in pairs:
            stack.append(pairs[c])
        elif c == stack[-1]:
            stack.pop()
        j += 1
    return j


def signature_head(name: str) -> str:
    """The name without a leading ``void``, ``(anonymous namespace)::`` and the argument list.

    A parenthesis opens an argument list only right after an identifier or a closing ``>``; names
    such as ``Memcpy HtoD (Pageable -> Device)`` keep their parenthesised part.
    """
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    s = s.replace("(anonymous namespace)::", "")
    i = 0
    while i < len(s):
        c = s[i]
        if c in "<{[":
            i = _close(s, i)
            continue
        if c == "(" and i > 0 and (s[i - 1].isalnum() or s[i - 1] in "_>"):
            return s[:i]
        i += 1
    return s


def _identifiers(text: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    for c in text + " ":
        if c.isalnum() or c == "_":
            cur.append(c)
        elif cur:
            out.append("".join(cur))
            cur = []
    return out


def short_name(name: str) -> str:
    """A short display name: no ``void``, namespaces, template arguments or argument list.

    Generic launcher templates (``vectorized_elementwise_kernel``, ``multi_tensor_apply_kernel``,
    ``reduce_kernel`` ...) keep the first telling identifier of their template arguments, e.g.
    ``vectorized_elementwise_kernel<CUDAFunctor_add>``, because otherwise every elementwise
    kernel would share one display name.  Full names stay the key everywhere else.
    """
    head = signature_head(name)
    if "<" not in head and (head == name.strip() or "::" not in head):
        return head  # not a C++ signature: operator names such as aten::mm stay whole
    lt = head.find("<")
    base = head if lt < 0 else head[:lt]
    base = base.rsplit("::", 1)[-1].strip() or base
    if lt < 0 or base not in _GENERIC_BASES:
        return base
    for ident in _identifiers(head[lt:]):
        if ident in _NOISE or ident in _GENERIC_HINTS or ident.isdigit() or len(ident) < 4 or ident[0].isdigit():
            continue
        if ident in ("at", "native", "std", "c10", "cuda", "anonymous", "namespace"):
            continue
        return f"{base}<{ident}>"
    return base
