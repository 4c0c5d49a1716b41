"""Checkers of a ``kernels`` frame: the raw profiler records of one step (the monitor links and
attributes them, flowtop.monitor.kernels.trace). They raise :class:`WireError` themselves, so that the
reason names the record and what is wrong with it rather than only the field."""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Sequence

from probe.wire.checks import I64, _int, _is_int, _num
from probe.wire.errors import WireError


#: Limits of a ``kernels`` message.  An op's ``dims``/``concrete`` hold at most
#: ``KERNEL_MAX_INPUTS`` inputs, a shape at most ``KERNEL_MAX_DIMS`` dims, an int list in
#: ``concrete`` at most ``KERNEL_MAX_LIST`` items, a string there at most ``KERNEL_MAX_STR`` chars.
KERNEL_MAX_RECORDS = 500_000
KERNEL_MAX_NAMES = 100_000
KERNEL_MAX_NAME = 8192
KERNEL_MAX_INPUTS = 16
KERNEL_MAX_DIMS = 8
KERNEL_MAX_LIST = 16
KERNEL_MAX_STR = 64
#: Kinds of a kernel window's records, the one definition both sides import (the probe writes
#: them into ``acts``; the monitor's compact window, flowtop.monitor.kernels.trace, keeps them in its
#: events): device work (kernel, memcpy, memset), a host operator (never in ``acts``: operators
#: travel in ``ops``; the monitor's events use the code), a CUDA runtime or driver call.
ACT_KERNEL, ACT_MEMCPY, ACT_MEMSET, ACT_CPU_OP, ACT_RUNTIME = 0, 1, 2, 3, 4
#: Kinds an ``acts`` record may carry.
KERNEL_ACT_KINDS = (ACT_KERNEL, ACT_MEMCPY, ACT_MEMSET, ACT_RUNTIME)


def is_runtime_call(name: str) -> bool:
    """Whether a host record's name is a CUDA runtime or driver API call (``cudaEventQuery``,
    ``cuLaunchKernelEx``) or CUPTI's ``INVALID`` callback, never an operator. torch ≤ 2.11 does
    not say which a Kineto event is, and such a call made outside any operator carries no link
    to one (a probe of that torch sent them as operators; see probe.kernels.records).

    A classifier in the wire because both sides apply it and must agree: the probe, to send such
    a call as a runtime record rather than an operator; the monitor, to drop the ones that
    probes of older versions sent as operators (flowtop.monitor.kernels.trace). The probe cannot import
    ``flowtop`` and the monitor imports nothing of ``probe`` but its wire, so the wire is the
    one module both can read it from."""
    return name.startswith("cuda") or name == "INVALID" or (
        len(name) > 2 and name[:2] == "cu" and name[2].isupper())


#: Ranges of a record's fields, read by the record checks and the column checks alike.
TIME_US = 1e12  # start/end, µs from the window start: -TIME_US..TIME_US
MAX_SIZE = 2**62  # a dim of a shape
STREAM = (-1, 2**31)  # a stream id (-1: none)
I64_MIN = -(2**63)

_index = _int(0)
_time = _num(-TIME_US, TIME_US)
_size = _int(0, MAX_SIZE)


def _dims(v: Any) -> bool:
    """None, or per input a list of dims (``[]`` for a non-tensor input)."""
    if v is None:
        return True
    if not isinstance(v, list) or len(v) > KERNEL_MAX_INPUTS:
        return False
    return all(isinstance(d, list) and len(d) <= KERNEL_MAX_DIMS and all(_size(x) for x in d) for d in v)


def _concrete_item(x: Any) -> bool:
    if x is None or isinstance(x, bool) or _is_int(x):
        return True
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, str):
        return len(x) <= KERNEL_MAX_STR
    # int lists: strides, paddings, output masks (bools)
    return isinstance(x, list) and len(x) <= KERNEL_MAX_LIST and all(isinstance(i, bool) or _is_int(i) for i in x)


def _concrete(v: Any) -> bool:
    """None, or per input a scalar, a short string or a list of ints (the "Concrete Inputs")."""
    if v is None:
        return True
    return isinstance(v, list) and len(v) <= KERNEL_MAX_INPUTS and all(_concrete_item(x) for x in v)



def _records(field: str, v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise WireError(f"kernels: bad value for {field!r}: not a list")
    if len(v) > KERNEL_MAX_RECORDS:
        raise WireError(f"kernels: bad value for {field!r}: {len(v)} records exceed {KERNEL_MAX_RECORDS}")
    return v


def _bad_record(field: str, i: int, what: str) -> WireError:
    return WireError(f"kernels: bad value for {field!r}: record {i}: {what}")


# names the record and what is wrong with it rather than only the field.


def _kernel_ops(v: Any) -> bool:
    """Host operator calls: ``[name, thread, start_us, end_us, ext, dims, concrete]``."""
    return _ops_in_bulk(_records("ops", v)) or _ops_by_record(v)


def _kernel_acts(v: Any) -> bool:
    """Device activities and runtime calls: ``[name, kind, start_us, end_us, stream, ext, corr]``."""
    return _acts_in_bulk(_records("acts", v)) or _acts_by_record(v)


def _ops_by_record(v: list[Any]) -> bool:
    """True, or :class:`WireError` naming the first bad record and what is wrong with it."""
    for i, o in enumerate(v):
        if not isinstance(o, list) or len(o) != 7:
            raise _bad_record("ops", i, "not a list of 7 fields")
        name, thread, start, end, ext, dims, concrete = o
        if not (_index(name) and _index(thread) and _index(ext)):
            raise _bad_record("ops", i, "name, thread and ext must be non-negative integers")
        if not (_time(start) and _time(end)):
            raise _bad_record("ops", i, "start/end must be finite numbers")
        if not _dims(dims):
            raise _bad_record("ops", i,
                              f"dims must be None or ≤ {KERNEL_MAX_INPUTS} lists of ≤ {KERNEL_MAX_DIMS} sizes")
        if not _concrete(concrete):
            raise _bad_record("ops", i, "concrete must be None or a short list of scalars and int lists")
    return True


def _acts_by_record(v: list[Any]) -> bool:
    for i, a in enumerate(v):
        if not isinstance(a, list) or len(a) != 7:
            raise _bad_record("acts", i, "not a list of 7 fields")
        name, kind, start, end, stream, ext, corr = a
        if not (_int(0, ACT_RUNTIME)(kind) and kind in KERNEL_ACT_KINDS):
            raise _bad_record("acts", i, f"kind must be one of {KERNEL_ACT_KINDS}")
        if not (_index(name) and _int(*STREAM)(stream) and _index(ext) and _index(corr)):
            raise _bad_record("acts", i, "name, stream, ext and corr must be integers in range")
        if not (_time(start) and _time(end)):
            raise _bad_record("acts", i, "start/end must be finite numbers")
    return True


# --- the same rules, column by column ---------------------------------------------------------
# A window of ~2,400 records took the monitor's data thread ~3 ms to check record by record (and
# the monitor admits up to 2 MB of windows a second). Here each rule is a few passes in C over a
# whole column: the types present (a set), the smallest and largest value, a sum (NaN or an
# infinity makes it non-finite). True means every record passes the record-by-record checks above
# (tests/test_wire_kernels.py checks it against them); False only "look closer": those then run
# and name the record at fault (or pass an unusual one).

def _types(col: Sequence[Any]) -> set[type]:
    return set(map(type, col))


def _ints_in(col: Sequence[Any], lo: int, hi: int) -> bool:
    """Every value a plain int (not a bool) in lo..hi."""
    return not col or (_types(col) <= {int} and lo <= min(col) and max(col) <= hi)


def _times_in_bulk(col: Sequence[Any]) -> bool:
    """Every value an int or float (not a bool), finite, within _time's range. The range first: a
    NaN may slip past min and max, never past the sum of values that are all in range."""
    return not col or (_types(col) <= {int, float} and -TIME_US <= min(col) and max(col) <= TIME_US
                       and math.isfinite(sum(col)))


def _lists(col: Sequence[Any], most: int) -> list[Any] | None:
    """The items of the lists in ``col`` (None entries skipped), or None when an entry is not a
    list or holds more than ``most`` items."""
    given = [x for x in col if x is not None]
    if not given:
        return []
    if _types(given) != {list} or max(map(len, given)) > most:
        return None
    return list(chain.from_iterable(given))


def _dims_in_bulk(col: Sequence[Any]) -> bool:
    shapes = _lists(col, KERNEL_MAX_INPUTS)
    if shapes is None or (shapes and (_types(shapes) != {list} or max(map(len, shapes)) > KERNEL_MAX_DIMS)):
        return False
    return _ints_in(list(chain.from_iterable(shapes)), 0, MAX_SIZE)


def _concrete_in_bulk(col: Sequence[Any]) -> bool:
    items = _lists(col, KERNEL_MAX_INPUTS)
    if items is None:
        return False
    kinds = _types(items)
    if not kinds <= {type(None), bool, int, float, str, list}:
        return False
    if int in kinds and not _ints_in([x for x in items if type(x) is int], I64_MIN, I64):
        return False
    if float in kinds and not math.isfinite(sum(x for x in items if type(x) is float)):
        return False
    if str in kinds and max(len(x) for x in items if type(x) is str) > KERNEL_MAX_STR:
        return False
    if list not in kinds:
        return True
    inner = _lists([x for x in items if type(x) is list], KERNEL_MAX_LIST)
    return inner is not None and _types(inner) <= {bool, int} and _ints_in(
        [x for x in inner if type(x) is int], I64_MIN, I64)


def _columns(v: list[Any]) -> list[tuple[Any, ...]] | None:
    """The 7 columns of records that are all lists of 7 fields (empty ones for no record), else None."""
    if not v:
        return [()] * 7
    if _types(v) != {list} or set(map(len, v)) != {7}:
        return None
    return list(zip(*v))


def _ops_in_bulk(v: list[Any]) -> bool:
    if (cols := _columns(v)) is None:
        return False
    name, thread, start, end, ext, dims, concrete = cols
    return (_ints_in(name + thread + ext, 0, I64) and _times_in_bulk(start + end)
            and _dims_in_bulk(dims) and _concrete_in_bulk(concrete))


def _acts_in_bulk(v: list[Any]) -> bool:
    if (cols := _columns(v)) is None:
        return False
    name, kind, start, end, stream, ext, corr = cols
    return (_ints_in(kind, 0, ACT_RUNTIME) and set(kind) <= set(KERNEL_ACT_KINDS)
            and _ints_in(name + ext + corr, 0, I64) and _ints_in(stream, *STREAM)
            and _times_in_bulk(start + end))
