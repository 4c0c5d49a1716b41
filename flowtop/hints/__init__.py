"""Bottleneck hints: a rules table (data), measures over snapshots, and a hysteresis engine.

Use :class:`HintEngine` — ``HintEngine().evaluate(job_snapshot, now)`` returns the active hints,
most severe first, then by impact. Thresholds live in :mod:`flowtop.hints.rules`.
"""

from flowtop.hints.engine import HintEngine
from flowtop.hints.rules import RULES, RULES_BY_ID, Gate, Rule

__all__ = ["HintEngine", "RULES", "RULES_BY_ID", "Gate", "Rule"]
