"""Remote strings made safe to print: no terminal control sequences from a probe (or a forger).

Job ids, host names, device names, kernel names and the rest arrive from the network; an ESC or
BEL in one would reach the user's terminal raw through ``flowtop snapshot`` or the TUI. Every
character that is not printable (C0/C1 controls, DEL, line and paragraph separators, bidi
overrides) becomes ``\\xNN``/``\\uNNNN``, so the text stays readable and nothing is lost silently.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any


#: Each byte to 0x00 when it is printable ASCII (space to "~"), else to 0x80: a translation by it is
#: ASCII exactly when every byte was printable. str.isprintable() looks every character up in the
#: Unicode tables (~25 instructions a character; a telemetry frame's text is ~800 of them),
#: bytes.translate is a plain loop in C.
_ASCII_FLAGS = bytes(0x00 if 0x20 <= b <= 0x7E else 0x80 for b in range(256))


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


def printable_deep(obj: Any) -> bool:
    """Whether every string (and map key) inside lists and maps is printable already: one walk
    that gathers the strings and one test of them joined, in C, without the copies :func:`deep`
    makes (telemetry arrives from every rank every second, and nearly always clean)."""
    texts: list[Any] = []
    stack = [obj]
    while stack:
        o = stack.pop()
        t = type(o)
        if t is dict:
            texts.extend(o)  # the keys
            values: Any = o.values()
        elif t is list:
            values = o
        else:
            if t is str:
                texts.append(o)
            continue
        for v in values:
            tv = type(v)
            if tv is str:
                texts.append(v)
            elif tv is dict or tv is list:
                stack.append(v)
    return _printable_texts(texts)


def _printable_texts(texts: list[Any]) -> bool:
    """Whether every one of ``texts`` is a printable string (False for anything else: a key that
    is not a string, which deep() then looks at)."""
    try:
        text = "".join(texts)
    except TypeError:
        return False
    if text.isascii():  # nearly always (a flag of the string's, no pass): printable is 0x20-0x7e then
        return text.encode("ascii").translate(_ASCII_FLAGS).isascii()
    return text.isprintable()


def clean(obj: Any) -> Any:
    """``obj`` itself when :func:`printable_deep`, else :func:`deep` of it."""
    return obj if printable_deep(obj) else deep(obj)


def clean_maps(maps: Mapping[str, Any], last: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """:func:`clean` of a map of maps (a telemetry frame's fields), where ``last`` are maps made
    of an earlier :func:`clean`'s output (the sender's previous telemetry, whose every string is
    printable, escaped or not): an inner map equal to one of them is printable too and is not
    walked. A rank's reasons of values not read (about 400 of a frame's 800 characters) are the
    same every second; its device and host maps change (their numbers) and are walked, without
    the stack :func:`printable_deep` keeps for any depth. The answer is :func:`clean`'s: equal
    strings have equal characters. (One exception no decoded frame can make, the wire refusing
    names that are not strings: a map equal to a last one that kept such a name comes back as
    itself, where clean() gives an equal copy.)"""
    return maps if _printable_maps(maps, last) else clean(maps)


def _printable_maps(maps: Mapping[str, Any], last: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every string in ``maps`` (a map of maps) is printable, as :func:`printable_deep`
    says, those of its maps equal to one of ``last`` taken as printable; False also where a value
    of ``maps`` is not a map (clean() then looks at it)."""
    texts: list[Any] = [*maps]  # the names
    for inner in maps.values():
        if type(inner) is not dict:
            return False
        if inner in last:  # dict equality: lengths first, then value by value
            continue
        texts.extend(inner)
        for v in inner.values():
            t = type(v)
            if t is str:
                texts.append(v)
            elif (t is list or t is dict) and v and not printable_deep(v):
                return False
    return _printable_texts(texts)


def interned(obj: Any, longest: int | None = 256) -> Any:
    """``obj`` with every map key and string value of at most ``longest`` characters (None: any)
    interned, in maps, lists and tuples: every rank sends the same names (telemetry fields,
    reasons, the device) every second, and a decoded frame's strings are new objects each time
    — thousands of ranks would keep thousands of copies of each."""
    t = type(obj)
    if t is dict:
        return {(sys.intern(k) if type(k) is str else k): interned(v, longest) for k, v in obj.items()}
    if t is list:
        return [interned(v, longest) for v in obj]
    if t is tuple:
        return tuple(interned(v, longest) for v in obj)
    if t is str and (longest is None or len(obj) <= longest):
        return sys.intern(obj)
    return obj
