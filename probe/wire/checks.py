"""Field checkers of the wire schema: each takes a decoded msgpack value and says whether it is
acceptable (types and ranges). Standard library only."""

from __future__ import annotations

import math
from typing import Any, Callable

I64 = 2**63 - 1

Check = Callable[[Any], bool]


def _int(lo: int = 0, hi: int = I64) -> Check:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _num(lo: float = 0.0, hi: float = 1e30) -> Check:
    def check(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return math.isfinite(v) and lo <= v <= hi

    return check


def _str(max_len: int = 256) -> Check:
    return lambda v: isinstance(v, str) and len(v) <= max_len


def _opt(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _str_list(max_items: int, max_len: int = 4096) -> Check:
    return lambda v: isinstance(v, list) and len(v) <= max_items and all(
        isinstance(s, str) and len(s) <= max_len for s in v
    )


#: Parallel roles a rank's coordinates name (hello ``coords``): data, tensor, pipeline, context
#: and expert parallelism.
PARALLEL_ROLES = ("dp", "tp", "pp", "cp", "ep")


def _coords(v: Any) -> bool:
    """Parallel coordinates: role -> [rank, size] with 0 <= rank < size (probe.steps.parallel)."""
    return isinstance(v, dict) and len(v) <= len(PARALLEL_ROLES) and all(
        k in PARALLEL_ROLES and isinstance(rs, list) and len(rs) == 2 and _int(0, 1 << 24)(rs[0])
        and _int(1, 1 << 24)(rs[1]) and rs[0] < rs[1] for k, rs in v.items()
    )


def _int_list(max_items: int, hi: int = 1 << 24) -> Check:
    return lambda v: isinstance(v, list) and len(v) <= max_items and all(_int(0, hi)(x) for x in v)


def _counts(max_items: int = 1000) -> Check:
    """A map of short names to non-negative integers (e.g. uncounted ops)."""
    return lambda v: isinstance(v, dict) and len(v) <= max_items and all(
        isinstance(k, str) and len(k) <= 256 and _int()(c) for k, c in v.items()
    )


def _num_map(max_items: int = 32, max_key: int = 16, width: int = 0) -> Check:
    """A map of short names to non-negative finite numbers, or (``width`` > 0) to lists of
    ``width`` of them (e.g. FLOPs per dtype label: [model, executed])."""
    num = _num(0, 1e30)

    def value(x: Any) -> bool:
        if width:
            return isinstance(x, list) and len(x) == width and all(num(n) for n in x)
        return num(x)

    return lambda v: isinstance(v, dict) and len(v) <= max_items and all(
        isinstance(k, str) and len(k) <= max_key and value(x) for k, x in v.items()
    )


def _int_lists(max_items: int = 256, max_key: int = 128, max_len: int = 4096) -> Check:
    """A map of short names to lists of non-negative integers (e.g. tokens per expert per layer)."""
    size = _int(0, 2**62)
    return lambda v: isinstance(v, dict) and len(v) <= max_items and all(
        isinstance(k, str) and len(k) <= max_key and isinstance(x, list) and len(x) <= max_len
        and all(size(n) for n in x) for k, x in v.items()
    )


#: Name sets a flat-map check keeps of maps that passed (see _flat_map).
MAX_NAME_SETS = 64


def _flat_map(max_items: int = 200) -> Check:
    """A map of short names to scalars, short strings, lists of strings or None. (Exact types,
    one loop: telemetry maps arrive from every rank every second; msgpack makes no subclasses.)

    Every rank's map of a field has the same names, in the same order, second after second: the
    names of maps that passed are kept as tuples, and a map whose names are one of those (a tuple's
    equality: a bytes name never equals a text one) skips their tests (~9 k instructions of a
    telemetry frame, callgrind). msgpack interns names, so the tuple is one C pass and its hash and
    equality mostly identity tests; several kinds of ranks' maps (probe versions) are kept at once,
    at most MAX_NAME_SETS (a flood of new names clears them).

    A map equal to the last one that passed passes without them (one dict comparison in C, ~1 k
    instructions against ~5 k): every rank's reasons of values not read are the same, second after
    second. Whatever msgpack decodes that equals a valid value is valid: a name equal to a short
    string is that string; a number equal to a finite one is a finite int or float (or a bool); a
    list equal to a list of short strings is one (NaN equals nothing)."""
    passed: set[tuple[Any, ...]] = set()
    last: list[dict[Any, Any]] = [{}]  # the last map that passed its tests

    def check(v: Any) -> bool:
        if type(v) is not dict or len(v) > max_items:
            return False
        if v == last[0]:  # equal to a map that passed: valid (the docstring's last paragraph)
            return True
        names = tuple(v)
        if names in passed:
            ok = _flat_values(v)
        else:
            for k in names:
                if type(k) is not str or len(k) > 64:
                    return False
            ok = _flat_values(v)
            if ok:
                if len(passed) >= MAX_NAME_SETS:
                    passed.clear()
                passed.add(names)
        if ok:
            last[0] = v
        return ok

    return check


def _flat_values(v: dict[Any, Any]) -> bool:
    """Whether every value of ``v`` is a scalar, a short string, a list of short strings or None."""
    for x in v.values():
        t = type(x)
        if x is None or t is int:  # the most frequent first (telemetry: metrics not read, counts)
            continue
        if t is float:
            if x - x != 0.0:  # NaN or an infinity
                return False
        elif t is str:
            if len(x) > 512:
                return False
        elif t is list:
            if x and (len(x) > 64 or not all(type(s) is str and len(s) <= 64 for s in x)):  # []: no generator
                return False
        elif t is not bool:
            return False
    return True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v <= I64



def _name(max_len: int) -> Check:
    """An identifier printed everywhere (job, host): no control characters at all."""
    return lambda v: isinstance(v, str) and len(v) <= max_len and v.isprintable()


def job_id_problem(job: str) -> str:
    """Why ``job`` cannot name a job ("" when it can): the wire refuses ids with control
    characters (a job id is printed everywhere); an empty one names nothing. (A longer one than
    the wire's 256 characters is cut to them by the probe.)"""
    if not job.strip():
        return "is empty"
    if not job.isprintable():
        return "has control characters (a tab, an escape): a job id is printed everywhere"
    return ""

