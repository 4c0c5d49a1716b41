"""Mixture-of-experts models: active parameters for the estimate, tokens per expert for the load.

**Finding MoE layers.** A module is an MoE layer when it has an ``experts`` child and says how
many experts it routes to and how many each token takes, under the names the common
implementations use, on itself, its ``config``, or its ``router``/``gate`` child:
experts ``num_experts``/``num_local_experts``/``n_routed_experts``/``n_experts``/``moe_num_experts``,
top-k ``top_k``/``num_experts_per_tok``/``topk``/``n_activated_experts``/``moe_top_k``
(HF Mixtral, Qwen-MoE, DeepSeek, torchtitan's ``MoE`` with its ``TokenChoiceTopKRouter``).
Hand-written layers often say less: the expert count is then the ``router``/``gate``
``nn.Linear``'s outputs, else the experts held; top-k and the count may sit on the model's own
``config`` only (HF's ``num_experts_per_tok``/``num_local_experts``); and a layer with a top-k and
a router of E outputs takes its one child ``ModuleList`` of E modules as its experts whatever it
is called (``self.mlps``).

**Active parameters** (the estimate beside the count, torchtitan's convention, docs/formulas.md "MoE"):
``N_active = N − E_params + top_k × E_params / E_local``, where ``E_params`` are the parameters of
the layers' ``experts`` as this rank holds them and ``E_local`` the experts it holds (a
``ModuleList``'s length, else the leading dim of the 3-D expert weights). One expert's parameters
times top_k is what a token costs. That also holds per rank under expert parallelism: a rank
holding E/ep experts serves, on balanced routing, top_k × its own token count through them. The
router and shared experts are dense (every token) and count whole. Capacity factors and dropped
tokens are not modelled (nobody does); the count, not the estimate, follows the real routing.

**Tokens per expert** (the load, during a counted step only): from the grouped GEMMs' offsets
(probe.flops.grouped; the first grouped GEMM of each MoE layer call, as its w1/w3/w2 GEMMs share
them), else from forward pre-hooks on the experts of a ``ModuleList`` (HF-style loops: rows of the
input each expert is called with). Summed over the step's micro-batches, forward only (recomputed
forwards of activation checkpointing run inside the autograd engine and are skipped). Experts that
loop over a 3-D weight without modules or grouped GEMMs (transformers v5 "experts" modules) show
no load. Every figure is local: a rank's experts and the tokens they got.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from probe._log import warn_once

_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "n_experts", "moe_num_experts")
_TOPK_KEYS = ("top_k", "num_experts_per_tok", "topk", "n_activated_experts", "moe_top_k")
#: Wire limits of ``expert_load`` (probe.wire): layers, experts per layer, layer name length.
MAX_LAYERS, MAX_EXPERTS, MAX_NAME = 256, 4096, 128


@dataclass(frozen=True)
class MoeLayer:
    """One MoE layer as found on this rank."""

    path: str
    module: nn.Module
    experts: nn.Module  # the routed experts (a ModuleList, or one module of 3-D weights)
    num_experts: int  # routed experts in the model (the router's choice set)
    top_k: int
    local_experts: int  # experts this rank holds
    expert_params: int  # their parameters (local)


def _int_attr(obj: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _lookup(module: nn.Module, keys: tuple[str, ...]) -> int | None:
    for owner in (module, getattr(module, "router", None), getattr(module, "gate", None),
                  getattr(module, "config", None), getattr(module, "experts", None)):
        if owner is not None and not isinstance(owner, (int, float, str, torch.Tensor)):
            found = _int_attr(owner, keys)
            if found is not None:
                return found
    return None


def _local(p: torch.Tensor) -> torch.Tensor:
    to_local = getattr(p, "to_local", None)  # a DTensor (expert parallel shards dim 0)
    return to_local() if callable(to_local) else p


def _local_experts(experts: nn.Module) -> int | None:
    if isinstance(experts, (nn.ModuleList, nn.Sequential)):
        return len(experts)
    for p in experts.parameters(recurse=False):
        t = _local(p)
        if t.dim() == 3:
            return int(t.shape[0])
    return _int_attr(experts, _EXPERT_KEYS)


def _router_outputs(module: nn.Module) -> int | None:
    """E of a ``router``/``gate`` child that is a plain ``nn.Linear`` (d -> E scores)."""
    for name in ("router", "gate"):
        owner = module._modules.get(name)
        if isinstance(owner, nn.Linear):
            return int(owner.out_features)
    return None


def _expert_list(module: nn.Module, routed: int) -> nn.Module | None:
    """A routing layer's one child ``ModuleList`` of ``routed`` modules, whatever it is called."""
    lists = [m for m in module.children() if isinstance(m, nn.ModuleList) and len(m) == routed]
    return lists[0] if len(lists) == 1 else None


def find_layers(model: nn.Module) -> list[MoeLayer]:
    """Every MoE layer of ``model`` (empty for a dense model). Never raises.

    Children are read from ``_modules``: a failed ``getattr`` on a module raises inside
    ``nn.Module.__getattr__``, and the estimate runs this over every module of the model."""
    found: list[MoeLayer] = []
    try:
        config = getattr(model, "config", None)  # HF: top-k and E on the model's config only
        root = config if isinstance(config, dict) or hasattr(config, "__dict__") else None
        root_num = _int_attr(root, _EXPERT_KEYS) if root is not None else None
        root_k = _int_attr(root, _TOPK_KEYS) if root is not None else None
        for path, module in model.named_modules():
            experts, routed = module._modules.get("experts"), _router_outputs(module)
            if (experts is None and routed is None) or isinstance(module, nn.ModuleList):
                continue
            top_k = _lookup(module, _TOPK_KEYS) or root_k
            if experts is None and top_k and routed:
                experts = _expert_list(module, routed)
            if experts is None:
                continue
            local = _local_experts(experts)
            num = _lookup(module, _EXPERT_KEYS) or routed or root_num or local
            if not (num and top_k and local):
                continue
            params = sum(_local(p).numel() for p in experts.parameters())
            found.append(MoeLayer(path or "<root>", module, experts, num, top_k, local, params))
    except Exception as exc:  # noqa: BLE001 - a plausibility figure must never hurt training
        warn_once("moe.find", f"MoE layers not inspected: {type(exc).__name__}: {exc}")
        return []
    return found


def active_params(model: nn.Module, n_params: int) -> tuple[int, str]:
    """(N_active, note) from the estimate's N: routed experts at top_k experts' worth per token.

    Returns ``(n_params, "")`` for a dense model."""
    layers = find_layers(model)
    if not layers:
        return n_params, ""
    expert = sum(layer.expert_params for layer in layers)
    active = sum(layer.top_k * layer.expert_params // layer.local_experts for layer in layers)
    first = layers[0]
    local = f", {first.local_experts} local" if first.local_experts != first.num_experts else ""
    note = (f"MoE: {len(layers)} layers, top-{first.top_k} of {first.num_experts} experts{local}; "
            f"N_active = N {n_params} - experts {expert} + top_k x one expert {active}")
    return n_params - expert + active, note


class ExpertLoadRecorder:
    """Tokens per local expert of each MoE layer during one counted step (see module docstring).

    ``start`` hooks the layers (and the root, to tell micro-batches apart for unnamed grouped
    GEMMs); the counting window calls :meth:`on_groups` for each forward grouped GEMM over
    tokens; ``stop`` unhooks and returns ``{layer: [tokens per expert]}``. Never raises."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._loads: dict[str, list[int]] = {}
        self._current: list[str] = []  # MoE layers being run (nested calls are not expected)
        self._grouped_seen: set[str] = set()  # layers whose call already gave its grouped offsets
        self._last_offsets: Any = None  # weakref: offsets of the last unnamed grouped GEMM
        self._unnamed = 0  # unnamed grouped GEMM layers seen in this micro-batch
        self._layers: list[MoeLayer] | None = None
        self._root: Any = None

    def start(self, root: nn.Module | None, module_hooks: bool = True) -> None:
        """Hook ``root`` and its MoE layers. ``module_hooks`` False (a torch.compile'd model: a
        hook inside the compiled region would make it recompile, twice per counted step) keeps
        to the grouped GEMMs' offsets, their layers named by order."""
        try:
            self._loads.clear()
            if root is None:
                return
            if self._layers is None or self._root is None or self._root() is not root:
                self._layers = find_layers(root)
                self._root = weakref.ref(root)
            self._handles.append(root.register_forward_pre_hook(self._on_root))
            for layer in self._layers if module_hooks else ():
                name = layer.path[-MAX_NAME:]
                self._handles.append(layer.module.register_forward_pre_hook(self._enter(name)))
                self._handles.append(layer.module.register_forward_hook(self._leave))
                experts = layer.experts
                if isinstance(experts, (nn.ModuleList, nn.Sequential)):
                    for i, expert in enumerate(experts):
                        self._handles.append(expert.register_forward_pre_hook(self._expert(name, i, len(experts))))
        except Exception as exc:  # noqa: BLE001
            warn_once("moe.hooks", f"expert load not recorded: {type(exc).__name__}: {exc}")
            self.stop()

    def stop(self) -> dict[str, list[int]]:
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self._handles.clear()
        self._current.clear()
        self._layers = None  # found again at the next window: kept, they would outlive their model
        loads, self._loads = self._loads, {}
        return {k: v[:MAX_EXPERTS] for k, v in list(loads.items())[:MAX_LAYERS]}

    # --- hooks (forward only: a recomputed forward runs inside the autograd engine) --------

    def _on_root(self, module: Any, args: Any) -> None:
        self._unnamed = 0
        self._last_offsets = None

    def _enter(self, name: str) -> Any:
        def hook(module: Any, args: Any) -> None:
            self._current.append(name)
            self._grouped_seen.discard(name)
        return hook

    def _leave(self, module: Any, args: Any, out: Any) -> None:
        if self._current:
            self._current.pop()

    def _expert(self, name: str, index: int, count: int) -> Any:
        def hook(module: Any, args: Any) -> None:
            try:
                if torch._C._current_graph_task_id() != -1 or not args:
                    return
                x = args[0]
                if isinstance(x, torch.Tensor) and x.dim() >= 1:
                    self._add(name, index, count, x.numel() // max(1, int(x.shape[-1])))
            except Exception:  # noqa: BLE001
                pass
        return hook

    def _add(self, name: str, index: int, count: int, tokens: int) -> None:
        loads = self._loads.get(name)
        if loads is None:
            if len(self._loads) >= MAX_LAYERS:
                return
            loads = self._loads[name] = [0] * min(count, MAX_EXPERTS)
        if index < len(loads):
            loads[index] += tokens

    def on_groups(self, cost: Any) -> None:
        """A forward grouped GEMM with token groups (probe.flops.opcost.OpCost.groups)."""
        try:
            groups, offsets = cost.groups, cost.offsets
            if self._current:
                name = self._current[-1]
                if name in self._grouped_seen:
                    return  # w3/w2 of the same call share w1's offsets
                self._grouped_seen.add(name)
            else:
                last = self._last_offsets() if self._last_offsets is not None else None
                if offsets is not None and last is offsets:
                    return
                self._last_offsets = weakref.ref(offsets) if isinstance(offsets, torch.Tensor) else None
                name = f"grouped_mm#{self._unnamed}"
                self._unnamed += 1
            for i, tokens in enumerate(groups):
                self._add(name, i, len(groups), int(tokens))
        except Exception:  # noqa: BLE001
            pass


def load_field(loads: Mapping[str, list[int]]) -> dict[str, list[int]]:
    """The ``expert_load`` wire field (sizes clipped to the wire's limits)."""
    return {str(k)[-MAX_NAME:]: [max(0, min(int(v), 2**62)) for v in vals[:MAX_EXPERTS]]
            for k, vals in list(loads.items())[:MAX_LAYERS] if vals}
