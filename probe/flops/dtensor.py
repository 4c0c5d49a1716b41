"""Local FLOPs under DTensor parallelism (tensor/sequence parallel, FSDP2, FSDP2 + TP).

Convention: every FLOP figure a rank publishes is **local**: what that rank's kernels compute
on its own shards. The job total is the sum over ranks; a job's MFU divides it by the summed
peaks. Nothing is divided by a parallel degree after the fact — but one thing: a Linear left
whole beside tensor-parallel ones (an LM head not parallelized) runs whole, on the same tokens,
on every rank of the group; its model FLOPs are the model's work once per group, so each rank's
model FLOPs count 1/tp of it (probe.flops.replicated), its executed FLOPs all of it.

Why a dispatch mode needs help here: a ``TorchDispatchMode`` is called *before* a tensor
subclass, with the subclass arguments. For a DTensor those carry the logical (global) shapes,
so costing them charges each of t tensor-parallel ranks the whole op (t × over-count). If the
mode returns ``NotImplemented`` instead, DTensor's own ``__torch_dispatch__`` runs: it plans
the sharding and dispatches the op on the *local* shards, and those plain-tensor ops re-enter
the mode (verified on torch 2.13; torch's ``DebugMode`` relies on the same rule). DTensor's
sharding propagation runs each new op once on ``FakeTensor`` copies (its cache misses); those
compute nothing and are run uncosted.

FSDP2 alone computes on all-gathered *plain* tensors, so its ops were local already; with
FSDP2 + TP the all-gathered parameter is a DTensor over the TP mesh again and takes the path
above. ``local_map``-ped attention and ``.to_local()`` run plain tensors: local by construction.

:func:`layout_of` describes the mesh and placements of a model's DTensor parameters for the
``flops`` message (``parallel``) and gives the estimate its compute-shard factor.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from probe.identity import ROLE_OF

#: What the counting mode does with an op, decided from its argument types.
COST, DEFER, RUN = 0, 1, 2

_ROUTES: dict[tuple, int] = {}


def route(types: tuple) -> int:
    """COST (plain tensors, or subclasses whose shapes are their data's), DEFER (a DTensor
    among them: return NotImplemented, cost the local ops it dispatches) or RUN (fake tensors:
    run, never cost). Cached per type tuple: the mode asks once per op of a counted step."""
    found = _ROUTES.get(types)
    if found is None:
        found = _ROUTES[types] = _route(types)
    return found


def _route(types: tuple) -> int:
    # Only look the classes up when their modules are loaded: no DTensor can exist otherwise,
    # and importing torch.distributed.tensor here would cost every probed process.
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    fake = getattr(sys.modules.get("torch._subclasses.fake_tensor"), "FakeTensor", None)
    for t in types:
        if dtensor is not None and isinstance(t, type) and issubclass(t, dtensor):
            return DEFER
    for t in types:
        if fake is not None and isinstance(t, type) and issubclass(t, fake):
            return RUN
    return COST


@dataclass(frozen=True)
class ParallelLayout:
    """Mesh and placements of a model's DTensor parameters.

    ``mesh``: (dim name, size) of the widest mesh seen ("d0", "d1"… for unnamed dims).
    ``fsdp_dims``: dims FSDP2 shards over (gathered before compute: no FLOP split).
    ``compute_degree``: product of the sizes of the other dims some parameter is sharded on
    (the tensor/expert-parallel split of the matmuls). ``splits``: id(parameter) -> how many
    ways its compute-time tensor is split (only parameters split more than once), so that the
    estimate can count the elements this rank computes with (probe.flops.estimate).
    ``placements``: distinct placement tuples, short form, with their parameter counts.
    """

    mesh: tuple[tuple[str, int], ...]
    fsdp_dims: tuple[str, ...]
    compute_degree: int
    placements: tuple[tuple[str, int], ...]
    splits: Mapping[int, int] = field(default_factory=dict, compare=False)
    #: Linear weights not split while others are split over tensor-parallel dims: their names,
    #: and their share of all Linear weights' elements. Every rank of a tensor-parallel group
    #: computes them whole on the same tokens, so the sum over those ranks counts their FLOPs
    #: ``tp_degree`` times (an unsharded LM head). Not over an expert- or context-parallel dim:
    #: its ranks run the unsplit layers on tokens of their own.
    whole: tuple[str, ...] = ()
    whole_frac: float = 0.0
    tp_degree: int = 1
    whole_ids: frozenset[int] = field(default_factory=frozenset, compare=False)  # id() of those weights

    @property
    def shares(self) -> Mapping[int, int]:
        """id(parameter) -> how many ranks share its work (the estimate's N of this rank): the
        split ones as ``splits``, the whole ones over the tensor-parallel group (see ``whole``)."""
        if not self.whole_ids:
            return self.splits
        return {**self.splits, **dict.fromkeys(self.whole_ids, self.tp_degree)}

    def describe(self) -> str:
        """One line for the wire (≤ 256 characters), convention first."""
        mesh = ", ".join(f"{n}={s}" for n, s in self.mesh)
        parts = [f"local FLOPs of this rank; mesh ({mesh})"]
        if self.fsdp_dims:
            parts.append("fsdp over " + "×".join(self.fsdp_dims))
        parts.append(f"matmuls split {self.compute_degree}-way" if self.compute_degree > 1 else "matmuls unsplit")
        if self.whole:
            more = f" +{len(self.whole) - 1} more" if len(self.whole) > 1 else ""
            parts.append(f"whole on every rank of the split: {self.whole[0]}{more} ({100 * self.whole_frac:.0f} % of "
                         f"Linear weights; model FLOPs count 1/{self.tp_degree} of them, executed all)")
        parts.append("params " + " ".join(f"{p}×{n}" for p, n in self.placements))
        text = "; ".join(parts)
        return text if len(text) <= 256 else text[:255] + "…"


def _short(placement: Any) -> str:
    name = type(placement).__name__
    dim = getattr(placement, "dim", None)
    if "Shard" in name and isinstance(dim, int):
        return f"S({dim})"
    return {"Replicate": "R", "Partial": "P"}.get(name, name)


def _is_shard(placement: Any) -> bool:
    return "Shard" in type(placement).__name__  # Shard and FSDP2's _StridedShard


def _dim_names(mesh: Any) -> tuple[str, ...]:
    names = getattr(mesh, "mesh_dim_names", None)
    return tuple(names) if names else tuple(f"d{i}" for i in range(mesh.ndim))


def _fsdp_mesh(model: torch.nn.Module) -> Any:
    """The data-parallel mesh of FSDP2 (``fully_shard``) if any module uses it, else None.

    Reads FSDP2's state (private: guarded, and only on counted steps)."""
    fsdp_module = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    if fsdp_module is None:
        return None
    for module in model.modules():
        if isinstance(module, fsdp_module):
            try:
                group = module._get_fsdp_state()._fsdp_param_group
                if group is not None:
                    return group.mesh_info.mesh
            except Exception:  # noqa: BLE001 - other torch versions: no FSDP dims known
                return None
    return None


def _fsdp_dims_of(param_mesh: Any, fsdp_mesh: Any) -> set[int]:
    """Indices of ``param_mesh``'s dims that FSDP shards over: by name when the meshes are named,
    else the leading ones (FSDP2 puts its dims first when it joins the TP mesh)."""
    if fsdp_mesh is None:
        return set()
    names, fsdp_names = getattr(param_mesh, "mesh_dim_names", None), getattr(fsdp_mesh, "mesh_dim_names", None)
    if names and fsdp_names:
        return {i for i, n in enumerate(names) if n in fsdp_names}
    return set(range(min(param_mesh.ndim, fsdp_mesh.ndim)))


def layout_of(model: torch.nn.Module) -> ParallelLayout | None:
    """The DTensor layout of ``model``'s parameters, or None when it has none. Never raises."""
    try:
        return _layout_of(model)
    except Exception:  # noqa: BLE001 - a description must never hurt training
        return None


def _layout_of(model: torch.nn.Module) -> ParallelLayout | None:
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is None:
        return None
    fsdp_mesh = _fsdp_mesh(model)
    widest: Any = None
    fsdp_names: set[str] = set()
    compute_dims: dict[str, int] = {}
    placements: Counter[str] = Counter()
    splits: dict[int, int] = {}
    for p in model.parameters():
        if not isinstance(p, dtensor):
            continue
        mesh = p.device_mesh
        names = _dim_names(mesh)
        if widest is None or mesh.ndim > widest.ndim:
            widest = mesh
        fsdp = _fsdp_dims_of(mesh, fsdp_mesh)
        split = 1
        for i, placement in enumerate(p.placements):
            if i in fsdp:
                fsdp_names.add(names[i])
            elif _is_shard(placement):
                compute_dims[names[i]] = int(mesh.size(i))
                split *= int(mesh.size(i))
        if split > 1:
            splits[id(p)] = split
        placements["[" + ",".join(_short(pl) for pl in p.placements) + "]"] += 1
    if widest is None:
        return None
    names = _dim_names(widest)
    mesh_dims = tuple((names[i], int(widest.size(i))) for i in range(widest.ndim))
    degree = math.prod(compute_dims.values()) if compute_dims else 1
    tp_degree = math.prod(size for name, size in compute_dims.items() if _tensor_parallel(name))
    whole, whole_frac, whole_ids = _whole_linears(model, splits) if tp_degree > 1 else ((), 0.0, frozenset())
    return ParallelLayout(
        mesh=mesh_dims,
        fsdp_dims=tuple(n for n, _ in mesh_dims if n in fsdp_names),
        compute_degree=degree,
        placements=tuple(placements.most_common()),
        splits=splits,
        whole=whole,
        whole_frac=whole_frac,
        tp_degree=tp_degree,
        whole_ids=whole_ids,
    )


def _tensor_parallel(dim: str) -> bool:
    """Whether a mesh dim some parameter is split on (not FSDP's) splits the matmuls of the same
    tokens: named as tensor parallel (probe.steps.parallel's names), or unnamed ("d0", as the
    coordinates take a sharded unnamed dim). An ep- or cp-named dim gives its ranks tokens of
    their own (a 2-way ep mesh read "Σ over those ranks counts them 2×" of the attention)."""
    role = ROLE_OF.get(dim)
    return role == "tp" or (role is None and dim[:1] == "d" and dim[1:].isdigit())


def _whole_linears(model: torch.nn.Module,
                   splits: Mapping[int, int]) -> tuple[tuple[str, ...], float, frozenset[int]]:
    """Names of the Linear weights not split for compute (plain, or replicated over the split's
    dims), largest first, their share of all Linear weights' elements, and their id()s."""
    seen: set[int] = set()
    whole: list[tuple[int, str]] = []
    ids: set[int] = set()
    total = 0
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if not isinstance(module, torch.nn.Linear) or w is None or id(w) in seen:
            continue
        seen.add(id(w))  # a weight tied to another Linear's counts once
        total += w.numel()
        if id(w) not in splits:
            whole.append((w.numel(), f"{name}.weight" if name else "weight"))
            ids.add(id(w))
    whole.sort(key=lambda e: (-e[0], e[1]))
    return tuple(n for _, n in whole), (sum(e for e, _ in whole) / total if total else 0.0), frozenset(ids)
