"""Model FLOPs of Linears a tensor-parallel group runs whole, during one counted step.

A Linear left unsplit beside tensor-parallel ones (an LM head not parallelized: torchtitan's plan
without the output's entry, a hand-written TP) computes the same output from the same tokens on
every rank of the group. What each rank's kernels ran is its executed FLOPs; but the model's work
is that Linear once per group, so a rank's model FLOPs count 1/tp of it, and the sum over the
group is the model's (a new user's trial with a whole head: the job's model FLOPs 13 % above the
model's, MFU with them).

The count cannot tell which matmul belongs to which module (the weight gradient names no weight),
so the recorder hooks those Linears' forwards and derives their model FLOPs as the count does: a
forward of ``rows`` rows costs 2·rows·in·out, and the backward as much again for each gradient
it takes (the input's, when it needs one; the weight's). Forwards the autograd engine runs
(activation-checkpoint recompute) are not model FLOPs, as in the count. Never raises.
"""

from __future__ import annotations

from typing import Any

import torch

from probe._log import warn_once
from probe.flops.dtensor import ParallelLayout
from probe.hookutil import eager


class ReplicatedLinears:
    """Hooks the whole Linears of ``layout`` (ParallelLayout.whole) under ``model`` for one
    counting window; :meth:`take` gives the model FLOPs the rank's count must give back."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self.degree = 1
        self.flops = 0  # model FLOPs of the hooked Linears in the window, whole

    def start(self, model: torch.nn.Module, layout: ParallelLayout | None) -> None:
        """Hook the Linears ``layout`` finds whole over a tensor-parallel group (none: nothing)."""
        self.close()
        self.flops = 0
        if layout is None or layout.tp_degree <= 1 or not layout.whole_ids:
            return
        try:
            self.degree = layout.tp_degree
            hook = eager(self._on_forward)
            for module in model.modules():
                if isinstance(module, torch.nn.Linear) and id(module.weight) in layout.whole_ids:
                    self._handles.append(module.register_forward_hook(hook))
        except Exception as exc:  # noqa: BLE001 - a count without the correction is still a count
            warn_once("flops.replicated", f"whole Linears under TP not told apart: {type(exc).__name__}: {exc}")
            self.close()

    def _on_forward(self, module: torch.nn.Linear, args: tuple[Any, ...], out: Any) -> None:
        try:
            if torch._C._current_graph_task_id() != -1:
                return  # run by the autograd engine: recompute, not model FLOPs
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor) or not module.in_features:
                return
            forward = 2 * (x.numel() // module.in_features) * module.in_features * module.out_features
            grads = int(module.weight.requires_grad) + int(x.requires_grad) if torch.is_grad_enabled() else 0
            self.flops += forward * (1 + grads)
        except Exception as exc:  # noqa: BLE001
            warn_once("flops.replicated", f"whole Linears under TP not told apart: {type(exc).__name__}: {exc}")
            self.close()
            self.flops = 0

    def take(self) -> int:
        """Unhook; the model FLOPs counted for the whole Linears that are not this rank's share:
        (1 − 1/tp) of them."""
        self.close()
        flops, self.flops = self.flops, 0
        return flops - flops // self.degree if self.degree > 1 else 0

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
