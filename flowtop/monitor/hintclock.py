"""What of a hint grows with the clock, held as instants: the hang hints' "no step for N s". No Textual.

A hang hint's text and evidence state seconds that grow at every tick ("no step for 37 s",
``stalled_s``, ``stalled_x``, ``silent_s``). Computed when the hint was made, they made a new
:class:`~flowtop.monitor.snapshot.Hint` at every tick, and with it a new snapshot of a job that
nothing else of changed (a silent job, kept 600 s: every rank crashed, none said bye). So such a
hint holds the instants the figures count from (:class:`HintClock`) and its summary as text
between them; its readers compute the figures at a snapshot's ``taken_at``
(``Hint.summary_at``, ``Hint.evidence_at``: the TUI, the JSON, the text report). While its stall
and its words stay the same, the hint is the same record from tick to tick.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from flowtop.monitor.records import fast_init

#: The figures a clock says, by the evidence key (and summary field) that names them.
FIGURES = frozenset({"stalled_s", "stalled_x", "silent_s"})

_FORMATTER = string.Formatter()


@dataclass(frozen=True, slots=True)
class Growing:
    """A figure of a hint's summary that grows with the clock, and the format it is shown in."""

    key: str  # one of FIGURES
    spec: str  # its format spec in the rule's template (".0f")


@fast_init  # one a rank at each evaluation of hang_rank (flowtop.monitor.records)
@dataclass(frozen=True, slots=True)
class HintClock:
    """The instants a hang hint's growing figures count from (monitor clock, the snapshot's: a
    rank's relay lag added), and its summary as text and figures (``parts``, set by the engine
    from the rule's template)."""

    stalled_since: float | None  # stalled_s = now - stalled_since (None: no stall, a silent relay's hint)
    limit_s: float  # stalled_x = stalled_s / limit_s
    silent_since: float | None = None  # silent_s = now - silent_since (a hang_all naming silent ranks, a silent relay)
    parts: tuple[str | Growing, ...] = ()

    def figures(self, now: float) -> dict[str, float]:
        """The growing figures at monitor time ``now``, by evidence key."""
        out = {}
        if self.stalled_since is not None:
            stalled = max(0.0, now - self.stalled_since)
            out = {"stalled_s": stalled, "stalled_x": stalled / self.limit_s}
        if self.silent_since is not None:
            out["silent_s"] = max(0.0, now - self.silent_since)
        return out

    def text(self, now: float) -> str:
        """The summary at monitor time ``now``."""
        figures = self.figures(now)
        return "".join(p if isinstance(p, str) else format(figures[p.key], p.spec) for p in self.parts)


def with_parts(clock: HintClock, template: str, fields: Mapping[str, object],
               render: Callable[[str, Mapping[str, object]], str]) -> HintClock:
    """``clock`` with the summary ``template`` split into its text (each other field rendered by
    ``render`` from ``fields`` now) and the growing figures (FIGURES) left for display. The
    template is split where it names a field (string.Formatter's own parse), never the text."""
    parts: list[str | Growing] = []
    for literal, name, spec, conversion in _FORMATTER.parse(template):
        text = literal  # the template's own text, braces unescaped already
        growing = name is not None and name in FIGURES
        if name is not None and not growing:
            text += render("{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}",
                           fields)
        if text and parts and isinstance(parts[-1], str):
            parts[-1] += text
        elif text:
            parts.append(text)
        if name is not None and growing:
            parts.append(Growing(name, spec or ""))
    return replace(clock, parts=tuple(parts))


def frozen_at(clock: HintClock, now: float) -> tuple[str, dict[str, float]]:
    """The summary and figures of ``clock`` at ``now`` (a hint that stops growing: its subject
    ended, or its measure passed back the clear value and it is only held)."""
    return clock.text(now), clock.figures(now)
