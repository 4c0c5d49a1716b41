"""When and how the probe counts FLOPs on the training thread (sampled steps only).

:class:`FlopSampler` owns the sampling policy (:class:`probe.flops.counter.CountPolicy`),
the open counting window, the counts carried per input signature, and the cost
budget: after each count, the extra time of the counted step sets how many steps
must pass before a *new* signature may be counted again, so jobs whose shapes
change every step (padding to the longest sequence) stay inside the same budget
as the kernel windows (0.5 % of large steps, 2 % of small ones: docs/design.md, "Overheads").
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

from probe._log import warn_once
from probe.flops import accounting, counter as flops, moe, padding
from probe.flops.dtensor import ParallelLayout
from probe.hookutil import in_compiled_call

#: Amortized budget of the FLOP counts: large steps (>= 100 ms) and small ones.
BUDGET_LARGE, BUDGET_SMALL, LARGE_STEP_S = 0.005, 0.02, 0.1
#: Steps after a count before the runtime charges its cost (against the median of the last five
#: unsampled steps, which then include these); until then no new count may start.
CHARGE_AFTER_STEPS = 3
CHARGE_GAP = CHARGE_AFTER_STEPS + 1


@dataclass(frozen=True)
class _Counted:
    """What a carried count's message repeats of the step that counted its signature."""

    step: int  # 1-based, as the step messages number them
    tokens: int
    extras: dict[str, Any]  # expert load, non-padding tokens (probe.flops.moe, .padding)
    keys: padding.MicroBatchKeys | None = None  # each micro-batch's T (the estimate's attention term)


class FlopSampler:
    """Opens a counting window on the first training forward of a due step, closes it
    before the optimizer runs, and publishes ``flops`` messages."""

    # What the step tracker reads at every forward (the gate), in the object itself rather than
    # in its dict: fewer cold cache lines after a long step.
    __slots__ = ("quiet_signature", "quiet_until", "__dict__")

    def __init__(
        self,
        publish: Callable[[dict[str, Any]], None],
        attention: str,
        recheck_steps: int,
        budget: float | None = None,
    ) -> None:
        self.policy = flops.CountPolicy(recheck_every=recheck_steps)
        self.budget = budget  # one budget for all step sizes (FLOWTOP_FLOPS_BUDGET), else the defaults
        self.attention = attention
        self._publish = publish
        self._counter: Any = None
        self._counted_step: int | None = None
        #: Per signature whose count the policy carries: in the policy's order (least recently
        #: used first) and as many, so the two drop the same signature.
        self._counted: dict[tuple[Any, ...], _Counted] = {}
        self._loads = moe.ExpertLoadRecorder()
        self._nonpad = padding.NonPadTokens()
        self._published: tuple[Any, ...] | None = None
        self.last: Any = None  # the FlopCount in force
        #: The root's DTensor layout as the last window read it (``_layout_read``: one did), so the
        #: message does not walk the parameters again; estimate-only messages read it themselves.
        self._layout: ParallelLayout | None = None
        self._layout_read = False
        self.broken = False
        #: Counting is impossible here (compiled code): publish the model-shape estimate instead.
        self.estimate_only = False
        self._estimated_for: tuple[Any, ...] | None = None
        self._dtype: str | None = None  # compute dtype seen at the last training forward
        self._decided: int | None = None  # the step the policy last chose to count
        #: The steady state, for the caller to test before calling :meth:`on_forward` at all: the
        #: step's signature equals ``quiet_signature`` (the count in force) and its 0-based index is
        #: below ``quiet_until`` (the next re-check) -> nothing to do. None when that does not hold.
        self.quiet_signature: tuple[Any, ...] | None = None
        self.quiet_until = -1

    @property
    def counting(self) -> bool:
        """Whether a counting window is open now."""
        return self._counter is not None

    def on_forward(self, tracker: Any, signature: tuple[Any, ...], context: dict[str, Any]) -> bool:
        """First training forward of a step: re-send a carried count, maybe open a window.

        Returns True when a window was opened (the caller marks the step as sampled)."""
        if self.estimate_only:  # the estimate's peak needs the compute dtype, only known now
            self._dtype = _compute_dtype(tracker.root)
        if self._counter is not None or self.broken:
            return False
        if signature != self._published:
            carried = self.policy.carried(signature)
            if carried is not None:
                self.last = carried
                self._published = signature
                held = self._counted.pop(signature, None) or _Counted(self._counted_step or tracker.step + 1, 0, {})
                self._counted[signature] = held  # used now, as the policy's carried() marks it
                fields = self._message(carried, tracker, signature, held.tokens, context, held.step, held.keys)
                self._publish({**fields, **held.extras})
        if not self.policy.should_count(tracker.step, signature):  # 0-based index of the coming step
            self._set_quiet(signature)
            return False
        self._decided = tracker.step
        self.quiet_signature = None
        if in_compiled_call():
            # The forward runs inside a compiled region (module.compile()): a counting window
            # cannot be opened there safely (see probe.hookutil.in_compiled_call).
            self.stop_counting("the model's forward hooks run inside a torch.compile region "
                               "(module.compile()); torch.compile(module) is counted", tracker.root)
            return False
        self._counter = flops.StepFlopCounter(root=tracker.root, attention=self.attention,
                                              module_hooks=not getattr(tracker, "compiled", False))
        self._counter.start(in_forward=True)
        # MoE tokens per expert and non-padding tokens ride on the same window (probe.flops.moe, .padding)
        self._counter.on_groups = self._loads.on_groups
        self._loads.start(tracker.root, module_hooks=not getattr(tracker, "compiled", False))
        self._nonpad.start(tracker.root, getattr(tracker, "forward_inputs", None))
        self._counted_step = tracker.step + 1
        return True

    def _set_quiet(self, signature: tuple[Any, ...]) -> None:
        """After a step that needed nothing: until the next re-check, the same signature needs
        nothing either (it is the one published, so the policy holds its count)."""
        if (signature is not self._published and signature != self._published) or self._decided is None \
                or self.estimate_only or self.broken or self._counter is not None:
            self.quiet_signature = None
            return
        every = self.policy.recheck_every
        self.quiet_signature = signature
        self.quiet_until = self._decided + every if every > 0 else sys.maxsize

    def finish(self, tracker: Any, context: dict[str, Any], prev_micro_batches: int) -> None:
        """Close the window before the optimizer runs (or at the boundary, as a fallback)."""
        counter, self._counter = self._counter, None
        if counter is None:
            return
        result = counter.stop()
        extras = self._window_extras(result)
        forwards = tracker.forwards_this_step
        if result is not None and prev_micro_batches > 0 and forwards > prev_micro_batches:
            # A step skipped by the GradScaler (inf/NaN gradients) merges two iterations
            # into one window: throw the count away rather than carry a doubled figure.
            warn_once("flops-merged", "a FLOP count spanning more forwards than a step was discarded")
            return
        signature = tracker.signature
        self.policy.record(signature, result)
        if result is None:
            return
        self.last = result
        # Until the counted step's cost is known (charge() needs steady steps after it), the
        # next steps are never counted: they are the ones that measure the cost.
        self.policy.min_gap = max(self.policy.min_gap, CHARGE_GAP)
        self._published = signature
        keys = self._nonpad.keys(result.micro_batches)
        counted = _Counted(self._counted_step or tracker.step + 1, tracker.tokens, extras, keys)
        self._counted.pop(signature, None)
        self._counted[signature] = counted
        while len(self._counted) > self.policy.max_signatures:  # as the policy drops its counts
            self._counted.pop(next(iter(self._counted)))
        self._layout, self._layout_read = counter.layout, True
        self._publish({**self._message(result, tracker, signature, counted.tokens, context, counted.step, keys),
                       **extras})

    def _window_extras(self, result: Any) -> dict[str, Any]:
        """Close the MoE and padding recorders of the window; their optional message fields."""
        loads = self._loads.stop()
        nonpad = self._nonpad.stop(result.micro_batches if result is not None else 0)
        extras: dict[str, Any] = {}
        if loads:
            extras["expert_load"] = moe.load_field(loads)
        if nonpad is not None:
            extras["nonpad_tokens"] = int(nonpad)
        return extras

    def charge(self, extra_s: float, typical_step_s: float | None) -> None:
        """Space the next new-signature count so the counting cost stays in budget."""
        if not typical_step_s or typical_step_s <= 0:
            return
        budget = self.budget or (BUDGET_LARGE if typical_step_s >= LARGE_STEP_S else BUDGET_SMALL)
        self.policy.min_gap = max(0, math.ceil(max(0.0, extra_s) / (budget * typical_step_s)))

    def stop_counting(self, why: str, root: Any) -> None:
        """Counting cannot work here (compiled code): close any window, and from now on publish
        the model-shape estimate (6N+12LdT) instead, labelled as not counted. Called at a
        forward's start, where the compute dtype (autocast's) is known."""
        self.close()
        self.quiet_signature = None
        self._dtype = _compute_dtype(root)
        self.broken = True
        self.estimate_only = True
        self._layout_read = False  # the estimates read the layout themselves from now on
        warn_once("flops-compiled", f"FLOP counting off: {why}; MFU is taken from the 6N+12LdT "
                  "estimate of the model's shape (labelled as such)")

    def publish_estimate(self, tracker: Any, context: dict[str, Any], tokens: int) -> None:
        """After a step, when counting is impossible: the estimate as this rank's FLOPs, once
        per input signature (``counted`` False on the wire; nothing when no estimate exists)."""
        signature = tracker.signature
        if not self.estimate_only or not tokens or signature == self._estimated_for:
            return
        self._estimated_for = signature
        count = flops.FlopCount(0, 0, self.attention, self._dtype or "fp32")
        fields = self._message(count, tracker, signature, tokens, context, tracker.step)
        estimated = fields.get("estimated_flops")
        if not estimated:
            warn_once("flops-estimate", "no FLOP estimate either (the model's shape is unknown): "
                      "set FLOWTOP_FLOPS_PER_TOKEN for MFU")
            return
        fields.update(model_flops=estimated, executed_flops=estimated, counted=False,
                      tokens=int(tokens))
        self._publish(fields)

    def close(self) -> None:
        """Stop an open window (detach, failure): the dispatch mode must not outlive us."""
        counter, self._counter = self._counter, None
        if counter is not None:
            try:
                counter.stop()
                self._window_extras(None)
            except Exception:
                pass

    def _message(
        self, count: Any, tracker: Any, signature: tuple[Any, ...], tokens: int, context: dict[str, Any],
        step: int, keys: padding.MicroBatchKeys | None = None,
    ) -> dict[str, Any]:
        """The ``flops`` message of ``count``, counted at ``step`` (1-based)."""
        return accounting.flops_message(
            count,
            step=step,
            tokens=tokens,
            root=tracker.root,
            signature=signature,
            device=tracker.device,
            device_name=context["device_name"],
            flops_per_token=context["flops_per_token"],
            attention=self.attention,
            local_ranks=context.get("local_ranks", 1),
            cp=context.get("cp", 1),  # context-parallel degree (probe.steps.parallel, at the first step)
            layout=self._layout, layout_known=self._layout_read,  # a carried count is the same model's
            keys=keys,
        )


def _compute_dtype(root: Any) -> str | None:
    """The compute precision of a forward about to run: autocast's dtype when it is on, else the
    root's parameter dtype (with TF32 for fp32 CUDA matmuls) — what the estimate's peak needs."""
    import torch

    try:
        for dev in ("cuda", "cpu"):
            if torch.is_autocast_enabled(dev):
                return flops.dtype_label(torch.get_autocast_dtype(dev), dev, flops.MATMUL, False, False)
        p = next(root.parameters(), None) if root is not None else None
        if p is None:
            return None
        tf32 = bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
        return flops.dtype_label(p.dtype, p.device.type, flops.MATMUL, tf32, False)
    except Exception:  # noqa: BLE001 - a label must never hurt training
        return None
