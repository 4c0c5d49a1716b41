"""Shared by the FLOP-count tests: count one callable's FLOPs with the probe's counter."""

from __future__ import annotations

from typing import Any, Callable

from probe.flops.count import FlopCount
from probe.flops.counter import StepFlopCounter


def count(fn: Callable[[], Any], **kw: Any) -> FlopCount:
    """Run ``fn`` inside one counting window and return the (non-None) count."""
    counter = StepFlopCounter(**kw)
    counter.start()
    fn()
    result = counter.stop()
    assert result is not None
    return result
