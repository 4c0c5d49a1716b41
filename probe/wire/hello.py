"""The hello's step fields (added within wire 1.3) as a typed record. Standard library only.

A probe's hello says its rank's last completed step and the seconds since that boundary when the
hello was built (``last_step``, ``step_age_s``; probe.steps.tracker.StepTracker.hello_step): a
monitor started while the rank hangs in a collective hears none of its steps, only its hellos
(flowtop.monitor.rankstate.heard_step). Both are optional: an older probe sends neither, and a
probe sends neither before its first step or between a sweep's models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from probe.wire.checks import _int, _num

#: The hello's fields that change at every hello (its step and that step's age).
HELLO_STEP_FIELDS = ("last_step", "step_age_s")
#: Their checkers, as the hello's schema (probe.wire) applies them.
LAST_STEP_CHECK = _int()
STEP_AGE_CHECK = _num(0, 1e9)


@dataclass(frozen=True, slots=True)
class HelloStep:
    """What a hello said of its rank's steps: the last completed one, and how long ago its
    boundary was (sender's seconds, measured when the hello was built)."""

    last_step: int
    age_s: float


def hello_step(fields: Mapping[str, Any]) -> HelloStep | None:
    """The step a hello's ``fields`` say, or None where they say none: either field absent, or
    either not valid (a hello decoded by probe.wire.decode has valid ones; checked again here so
    that no caller reads a value the schema would refuse)."""
    last_step, age_s = fields.get("last_step"), fields.get("step_age_s")
    # The isinstance tests narrow the types; the checkers hold the schema's ranges (and refuse bools).
    if isinstance(last_step, int) and isinstance(age_s, (int, float)) and LAST_STEP_CHECK(last_step) \
            and STEP_AGE_CHECK(age_s):
        return HelloStep(last_step, float(age_s))
    return None
