"""Bottleneck hints: a rules table (data), measures over snapshots, and a hysteresis engine.

Use :class:`HintEngine` — ``HintEngine().evaluate(job_snapshot, now)`` returns the active hints,
most severe first, then by impact. Thresholds live in :mod:`flowtop.monitor.hints.rules`.
"""

from flowtop.monitor.hints.engine import HintEngine
from flowtop.monitor.hints.groups import HintGroup, HintLine, group_key, grouped, hint_line
from flowtop.monitor.hints.measures_device import power_limited, watched_reasons
from flowtop.monitor.hints.rules import RULES, RULES_BY_ID, Gate, Rule

# power_limited/watched_reasons: the throttling rule's reading of one rank (the UI shows it).
# HintGroup/grouped: rank hints many ranks share, as one line (the hints panel and the text report);
# hint_line: the words of that line, or of one hint's.
__all__ = ["HintEngine", "HintGroup", "HintLine", "RULES", "RULES_BY_ID", "Gate", "Rule", "group_key", "grouped",
           "hint_line", "power_limited", "watched_reasons"]
