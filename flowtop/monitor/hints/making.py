"""How a rule's measurement becomes a hint, for flowtop.monitor.hints.engine. No Textual.

Whether a measurement is beyond its rule's threshold (to fire) or not yet back past its clear
value (to stay), its gates included (:func:`beyond`); the :class:`Hint` record made from it, its
summary and action rendered from the rule's templates (:func:`make_hint`, :func:`render`); and
whether a shown hint still says all that a new measurement would (:func:`reusable`). Pure
functions: the engine keeps the hysteresis state and decides when each is asked.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from flowtop.monitor.hintclock import with_parts
from flowtop.monitor.hints.base import Measurement, finite
from flowtop.monitor.hints.rules import Gate, Rule
from flowtop.monitor.snapshot import Hint


class _NA:
    """Stands in for a missing number in a summary template ("n/a" whatever the format spec)."""

    def __format__(self, spec: str) -> str:
        return "n/a"


class _Fields(dict[str, Any]):
    """Template fields; an unknown name reads "n/a"."""

    def __missing__(self, key: str) -> Any:
        return _NA()


def render(template: str, fields: Mapping[str, Any]) -> str:
    """Format a template; missing or None fields read "n/a" instead of raising."""
    return _render(template, _safe(fields))


def _safe(fields: Mapping[str, Any]) -> _Fields:
    """``fields`` as a template reads them: None as "n/a", an unknown name too."""
    return _Fields({k: (_NA() if v is None else v) for k, v in fields.items()})


def _render(template: str, safe: _Fields) -> str:
    try:
        return template.format_map(safe)
    except (ValueError, TypeError):  # a text value under a numeric format spec
        return template.format_map(_Fields({k: str(v) for k, v in safe.items()}))


def _gate_ok(gate: Gate, evidence: Mapping[str, Any], keep: bool) -> bool:
    """Whether the gate's figure in ``evidence`` is beyond its threshold (to fire) or not yet
    back past its clear value (``keep``: to stay); a missing or non-finite figure is not."""
    value = evidence.get(gate.key)
    if not finite(value):
        return False
    limit = gate.clear if keep else gate.threshold
    return value < limit if gate.op == "<" else value >= limit


def beyond(rule: Rule, m: Measurement, keep: bool) -> bool:
    """To fire (keep=False): strictly beyond the threshold. To stay (keep=True): not yet back
    past the clear value. Gates use their own threshold/clear the same way."""
    v = m.value
    if not finite(v):
        return False
    if rule.direction == "above":
        ok = v >= rule.clear if keep else v > rule.threshold
    else:
        ok = v <= rule.clear if keep else v < rule.threshold
    return ok and all(_gate_ok(g, m.evidence, keep) for g in rule.gates)


@functools.cache
def _limit_keys(unit: str) -> tuple[str, str]:
    """The evidence keys of a rule's threshold and clear value ("threshold_pct", "clear_pct"):
    made once a unit, not two new strings a hint (a rule that holds for every rank of a large job
    keeps a hint a rank, each with its evidence: ~120 bytes of equal keys each)."""
    return f"threshold_{unit}", f"clear_{unit}"


def make_hint(rule: Rule, target: str, m: Measurement, since_step: int | None, first_step: int | None,
              steps: int, secs: float) -> Hint:
    """The hint ``rule`` shows of ``target`` for the measurement ``m``: its evidence (the
    rule's threshold and clear value, the window it covers: ``steps``, ``secs``, from
    ``since_step``), its severity, its summary and action rendered from the rule's templates
    (a clock's growing figures left for display), ``first_step`` the first step it covers."""
    ev: dict[str, Any] = dict(m.evidence)
    if m.clock is None:  # else the clock says it at display (Hint.evidence_at)
        ev[rule.measure] = m.value
    threshold_key, clear_key = _limit_keys(rule.unit)
    ev[threshold_key] = rule.threshold
    # A shown hint holds until its measure passes back the clear value (hysteresis): a figure
    # between the two (an ended straggler "6 % slower" of threshold 10) says why it still shows.
    ev[clear_key] = rule.clear
    if rule.window_steps:
        ev.setdefault("window_steps", steps)
    if rule.window_s:
        ev.setdefault("window_s", secs)
    ev.setdefault("since_step", since_step)
    severity = m.severity or rule.severity
    if rule.critical_at is not None:
        past = m.value > rule.critical_at if rule.direction == "above" else m.value < rule.critical_at
        if past:
            severity = "critical"
    fields = {**ev, **m.text, "target": target}
    template = rule.variants.get(m.variant, rule.summary) if m.variant else rule.summary
    # A clock's figures are left in its parts, for display (flowtop.monitor.hintclock).
    clock = with_parts(m.clock, template, fields, render) if m.clock is not None else None
    safe = _safe(fields)  # once for the summary and the action: thousands of hints an evaluation
    return Hint(
        id=rule.id,
        severity=severity,
        scope=rule.scope,
        target=target,
        summary=_render(template, safe) if clock is None else "",
        evidence=ev,
        action=_render(rule.action, safe),
        impact=max(0.0, min(1.0, m.impact)),
        first_step=first_step,
        last_step=m.step,
        clock=clock,
    )


def reusable(rule: Rule, m: Measurement, made_from: Measurement) -> bool:
    """Whether the hint made from ``made_from`` says all that ``m`` would: a measure whose figures
    grow with the clock (a hang's: its hint holds since when, HintClock) and nothing else of it
    moved. A silent job's hang hints are then the same records from tick to tick, and so is its
    snapshot (flowtop.monitor.endedjobs). The hysteresis reads ``m.value`` all the same."""
    return (m.clock is not None and not rule.window_steps and not rule.window_s and rule.critical_at is None
            and m.clock == made_from.clock and m.step == made_from.step and m.variant == made_from.variant
            and m.impact == made_from.impact and m.severity == made_from.severity
            and m.text == made_from.text and m.evidence == made_from.evidence)
