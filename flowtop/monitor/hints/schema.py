"""The shape of a hint rule (one row of the table in :mod:`flowtop.monitor.hints.rules`) and its checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from flowtop.monitor.snapshot import SEVERITIES as SEVERITIES  # re-exported: the rules table names it

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
    severity: str  # one of SEVERITIES
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
    #: Alternative summary templates, chosen by the measure (``Measurement.variant``) when one
    #: rule sees a problem in more than one way (the straggler: by step time or by lead time).
    variants: Mapping[str, str] = field(default_factory=dict)
    #: What measuring the rule costs on a large job, in ms of CPU at 4,096 ranks (the dev box,
    #: 2026-12-06): a large job's rules are measured in shares of about equal cost at different
    #: ticks (HintEngine.plan, flowtop.monitor.rotation.HINT_SHARES). Rules not measured: 2.
    cost: float = 2.0


#: Rule fields an override may set (the rest describe what the rule *is*, not how it is tuned).
TUNABLE: tuple[str, ...] = ("severity", "threshold", "clear", "window_steps", "window_s", "critical_at")


def apply_overrides(
    rules: Iterable[Rule],
    overrides: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[Rule, ...]:
    """A copy of ``rules`` with some values changed, e.g. ``{"hang": {"floor_s": 5.0}}``.

    A key is a rule id or a group name of ``groups`` (every rule of the group; a rule's own key
    wins over its group's, whatever the order). A value's keys are fields of :data:`TUNABLE` or
    existing keys of the rule's ``params``. Unknown rule ids,
    groups or keys raise ValueError (a misspelt override would otherwise do nothing quietly);
    the result is validated like the table itself.
    """
    rules = tuple(rules)
    ids = {r.id for r in rules}
    per_rule: dict[str, dict[str, Any]] = {}
    groups = groups or {}
    for key, changes in sorted(overrides.items(), key=lambda kv: kv[0] not in groups):  # groups first
        targets = groups.get(key, (key,))
        for rid in targets:
            if rid not in ids:
                raise ValueError(f"override for unknown rule or group {key!r}")
            per_rule.setdefault(rid, {}).update(changes)
    out = []
    for r in rules:
        values = per_rule.get(r.id)
        if not values:
            out.append(r)
            continue
        fields = {k: v for k, v in values.items() if k in TUNABLE}
        params = {k: v for k, v in values.items() if k not in TUNABLE}
        unknown = sorted(set(params) - set(r.params))
        if unknown:
            raise ValueError(f"{r.id}: no field or parameter {unknown}")
        out.append(dataclasses.replace(r, **fields, params={**r.params, **params}))
    result = tuple(out)
    validate(result)
    return result


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

