"""The shape of a hint rule (one row of the table in :mod:`flowtop.hints.rules`) and its checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")
SCOPES: tuple[str, ...] = ("job", "rank", "kernel")


@dataclass(frozen=True)
class Gate:
    """A secondary condition on another evidence value, with its own hysteresis.

    ``op`` is ``"<"`` or ``">="``. To fire, ``evidence[key] op threshold`` must hold; to stay
    active, ``evidence[key] op clear`` (the looser value). A missing value fails the gate.
    """

    key: str
    op: str
    threshold: float
    clear: float


@dataclass(frozen=True)
class Rule:
    """One row of the rules table."""

    id: str
    scope: str  # "job" | "rank" | "kernel"
    severity: str  # "critical" | "warning" | "info"
    measure: str  # evidence key of the measured value (unit in the name)
    unit: str  # unit suffix for the threshold evidence key: "pct", "x", "calls", ...
    direction: str  # "above": fires when measure > threshold; "below": when measure < threshold
    threshold: float
    clear: float  # looser value: "above" clears when measure < clear, "below" when > clear
    window_steps: int  # minimum evidence window in steps (0: none)
    window_s: float  # minimum evidence window in seconds of monitor time (0: none)
    summary: str  # one line, plain words, with the number
    action: str  # a concrete next step
    gates: tuple[Gate, ...] = ()
    critical_at: float | None = None  # escalate to "critical" beyond this measure value
    params: Mapping[str, Any] = field(default_factory=dict)  # rule-specific constants
    doc: str = ""  # what the measure is, for the README table


def validate(rules: tuple[Rule, ...]) -> None:
    """Raise ValueError when a table row is inconsistent (clear on the wrong side, bad names)."""
    seen: set[str] = set()
    for r in rules:
        if r.id in seen:
            raise ValueError(f"duplicate rule id {r.id}")
        seen.add(r.id)
        if r.severity not in SEVERITIES or r.scope not in SCOPES:
            raise ValueError(f"{r.id}: bad severity or scope")
        if r.direction == "above" and r.clear > r.threshold:
            raise ValueError(f"{r.id}: clear must be <= threshold for an 'above' rule")
        if r.direction == "below" and r.clear < r.threshold:
            raise ValueError(f"{r.id}: clear must be >= threshold for a 'below' rule")
        if r.direction not in ("above", "below"):
            raise ValueError(f"{r.id}: direction must be 'above' or 'below'")
        for g in r.gates:
            if g.op == "<" and g.clear < g.threshold or g.op == ">=" and g.clear > g.threshold:
                raise ValueError(f"{r.id}: gate {g.key} clear is tighter than its threshold")
            if g.op not in ("<", ">="):
                raise ValueError(f"{r.id}: gate op must be '<' or '>='")

