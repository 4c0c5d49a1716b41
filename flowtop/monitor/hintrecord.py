"""A bottleneck hint as a snapshot holds it: :class:`Hint`, and the severities' order. No Textual.

Its own module (re-exported by flowtop.monitor.snapshot, where its readers take it): the hint
engine makes them, the snapshot holds them, the UI and the exporters render them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from flowtop.monitor.hintclock import HintClock
from flowtop.monitor.records import Slotted, fast_init


#: Hint severities, most severe first: the one order the rules' checks, the engine's ranking and
#: the UI's hints list follow (here, beside :class:`Hint`, because the UI reads it too).
SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")


@fast_init  # made per rank at every tick (flowtop.monitor.records)
@dataclass(frozen=True, slots=True)
class Hint(Slotted):
    """A bottleneck hint with the evidence that triggered it."""

    id: str
    severity: str  # one of SEVERITIES
    scope: str  # "job" | "rank" | "kernel"
    target: str  # "" for job scope, "rank 3", a kernel name ...
    summary: str
    evidence: Mapping[str, Any]
    action: str
    impact: float  # estimated share of step time at stake (0..1)
    #: The rank or job it was about ended while it was shown: kept, frozen, until the job is
    #: evicted, so the final snapshot of a finished job still holds its diagnosis.
    ended: bool = False
    first_step: int | None = None  # first step of the evidence (target's step index)
    last_step: int | None = None  # last step at which the measure still held
    #: A hang hint's figures that grow with the clock, as instants (flowtop.monitor.hintclock):
    #: ``summary`` is then "" and ``evidence`` lacks them; :meth:`summary_at` and
    #: :meth:`evidence_at` say them at a snapshot's ``taken_at``. None: nothing of it grows.
    clock: HintClock | None = None

    def summary_at(self, now: float) -> str:
        """The summary at monitor time ``now`` (a snapshot's ``taken_at``): what is shown."""
        return self.summary if self.clock is None else self.clock.text(now)

    def evidence_at(self, now: float) -> Mapping[str, Any]:
        """The evidence at monitor time ``now``, a clock's figures included: what is shown."""
        return self.evidence if self.clock is None else {**self.evidence, **self.clock.figures(now)}

    def frozen(self, now: float) -> Hint:
        """This hint as it reads at ``now``, growing no more (its subject ended, or it is only
        held after its measure passed back the clear value: it says what it last measured)."""
        if self.clock is None:
            return self
        return dataclasses.replace(self, summary=self.summary_at(now), evidence=self.evidence_at(now), clock=None)
