"""Remote strings made safe to print: no terminal control sequences from a probe (or a forger).

Job ids, host names, device names, kernel names and the rest arrive from the network; an ESC or
BEL in one would reach the user's terminal raw through ``flowtop snapshot`` or the TUI. Every
character that is not printable (C0/C1 controls, DEL, line and paragraph separators, bidi
overrides) becomes ``\\xNN``/``\\uNNNN``, so the text stays readable and nothing is lost silently.
"""

from __future__ import annotations

from typing import Any


def printable(s: str) -> str:
    """``s`` with every non-printable character written as a visible escape."""
    if s.isprintable():  # the common case, in C
        return s
    return "".join(c if c.isprintable() else _escape(c) for c in s)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def deep(obj: Any) -> Any:
    """:func:`printable` applied to every string (and map key) inside lists and maps."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, list):
        return [deep(v) for v in obj]
    if isinstance(obj, dict):
        return {printable(k) if isinstance(k, str) else k: deep(v) for k, v in obj.items()}
    return obj
