"""Markdown rendering of the rules table, so the README cannot drift from the code.

``python -m flowtop.monitor.hints.doc`` prints the table; a test checks that README.md holds it.
"""

from __future__ import annotations

from flowtop.monitor.hints.rules import RULES, Rule


def _num(x: float) -> str:
    return f"{x:g}"


_OPS = {"<": "<", ">=": "≥"}


def _window(r: Rule) -> str:
    parts = []
    if r.window_steps:
        parts.append(f"{r.window_steps} step" + ("s" if r.window_steps != 1 else ""))
    if r.window_s:
        parts.append(f"{_num(r.window_s)} s")
    return " and ".join(parts) or "—"


def _condition(r: Rule) -> str:
    op, back = (">", "<") if r.direction == "above" else ("<", ">")
    text = f"`{r.measure}` {op} {_num(r.threshold)}"
    for g in r.gates:
        text += f", `{g.key}` {_OPS[g.op]} {_num(g.threshold)}"
    clear = f"`{r.measure}` {back} {_num(r.clear)}"
    for g in r.gates:
        clear += f" or `{g.key}` {'≥' if g.op == '<' else '<'} {_num(g.clear)}"
    return f"{text} | {clear}"


def rules_markdown(rules: tuple[Rule, ...] = RULES) -> str:
    """The rules as a Markdown table (one row per rule, in table order)."""
    lines = [
        "| id | scope | severity | fires when | clears when | window | measure |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rules:
        sev = r.severity
        if r.critical_at is not None:
            sev += f" (critical {'>' if r.direction == 'above' else '<'} {_num(r.critical_at)})"
        lines.append(f"| `{r.id}` | {r.scope} | {sev} | {_condition(r)} | {_window(r)} | {r.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(rules_markdown(), end="")
