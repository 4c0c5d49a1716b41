"""Shared by the FLOP-count tests: count one callable's FLOPs with the probe's counter."""

from __future__ import annotations

from typing import Any, Callable

from probe.flops.count import FlopCount
from probe.flops.counter import StepFlopCounter
from probe.flops.estimate import Estimate, estimate_with_reason


def count(fn: Callable[[], Any], **kw: Any) -> FlopCount:
    """Run ``fn`` inside one counting window and return the (non-None) count."""
    counter = StepFlopCounter(**kw)
    counter.start()
    fn()
    result = counter.stop()
    assert result is not None
    return result


def estimate_of(model: Any, **kw: Any) -> Estimate | None:
    """The estimate alone of :func:`probe.flops.estimate.estimate_with_reason` (None: there is none)."""
    return estimate_with_reason(model, **kw)[0]
