"""Step records as columns: the ``stepcols`` frame (wire MINOR 3) and the typed record every step
frame decodes to. Standard library + msgpack only.

A rank sends its step records every FLOWTOP_FLUSH_S (0.1 s) as one frame. As a list of maps
(``steps``, MINOR 2) a frame of ten 10 ms steps cost the monitor ~60 µs to validate and apply,
record by record and field by field: 4,096 ranks at a 10 ms step send 41 k such frames a second,
more than two cores. As columns — each field one little-endian array of machine numbers — the
monitor checks them with a few C-level passes (every float column at once by its bit patterns, see
``_all_seconds``) and appends each to the rank's ring in one ``extend``, whatever the number of
records.

Columns of a ``stepcols`` frame (``n`` records, oldest first):

* ``step`` (int64, strictly increasing), ``wall_s`` (float64), ``tokens`` (int64): every record;
* ``input_wait_s``, ``lead_s``, ``probe_s``, ``stage_s`` (float64, NaN where a record has none):
  each present only when some record has one;
* scalars: ``device_s`` (the newest device time sent, or absent), ``drops``, ``commands_refused``
  and ``commands_dropped`` (the rank's running totals when the frame left).

Every step frame — ``step``, ``steps`` and ``stepcols`` — decodes to a :class:`StepColumns`
(:attr:`probe.wire.Message.steps`), so the monitor has one way to apply steps.
"""

from __future__ import annotations

import functools
import math
import operator
import struct
import sys
from array import array
from typing import Any, Mapping, NamedTuple, Sequence

from probe.wire.checks import I64
from probe.wire.errors import WireError

#: Columns every record has, and their array type codes.
REQUIRED = (("step", "q"), ("wall_s", "d"), ("tokens", "q"))
#: Float columns a record may lack (NaN on the wire and in :class:`StepColumns`).
OPTIONAL = ("input_wait_s", "lead_s", "probe_s", "stage_s")
#: The columns of seconds, in StepColumns' order.
_SECONDS = ("wall_s", *OPTIONAL)
#: Largest plausible seconds in a step time field (as the single-record schema says).
MAX_SECONDS = 1e7
_SWAP = sys.byteorder != "little"  # the wire is little-endian
_NAN = float("nan")
#: MAX_SECONDS's bit pattern as an unsigned 64-bit integer (see _all_seconds).
_MAX_BITS = struct.unpack("<Q", struct.pack("<d", MAX_SECONDS))[0]
#: The high bytes (sign and top exponent bits) of the little-endian doubles 0 <= x < 2**17:
#: every value whose high byte is one of them is a finite number of seconds within MAX_SECONDS.
_SMALL_HIGH = bytes(range(0x41))
#: Each byte to 0x00 when it is one of _SMALL_HIGH, else to 0x80: a translation by it is ASCII
#: exactly when every byte was (the table's translation is a plain loop in C, deleting bytes
#: builds a table of 256 entries at each call first: ~2.6 k instructions for 45 records of 4
#: columns, ~1 k this way).
_HIGH_FLAGS = bytes(0x00 if b in _SMALL_HIGH else 0x80 for b in range(256))
assert MAX_SECONDS >= 2.0**17


class StepColumns(NamedTuple):
    """Validated step records of one frame, oldest first, one array per field.

    ``step``/``tokens`` are ``array('q')``, the others ``array('d')``; an optional column is None
    when no record had the field, else NaN marks the records without it. (A tuple with names,
    not a dataclass: one is made per step frame, tens of thousands a second at scale.)"""

    step: array
    wall_s: array
    tokens: array
    input_wait_s: array | None = None
    lead_s: array | None = None
    probe_s: array | None = None
    stage_s: array | None = None
    device_s: float | None = None
    drops: int = 0
    commands_refused: int = 0
    commands_dropped: int = 0
    #: Every value of every column a number (no NaN: each record sent each optional column that is
    #: not None), as the decode's checks found; False: not known (look at the values).
    finite: bool = False

    def records(self) -> list[dict[str, Any]]:
        """The records as maps of the single-step schema (None where a field was not sent)."""
        out = []
        for i in range(len(self.step)):
            rec: dict[str, Any] = {"step": self.step[i], "wall_s": self.wall_s[i], "tokens": self.tokens[i]}
            for name in OPTIONAL:
                col = getattr(self, name)
                if col is not None and col[i] == col[i]:
                    rec[name] = col[i]
            out.append(rec)
        return out


#: StepColumns of all its fields in order, made by tuple's own constructor: the NamedTuple's
#: __new__ is a Python function (binding 12 arguments costs ~1 k instructions a frame).
_columns = functools.partial(tuple.__new__, StepColumns)


def _column(values: Sequence[Any], code: str) -> bytes:
    a = array(code, values)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def encode_fields(records: Sequence[Mapping[str, Any]], drops: int) -> dict[str, Any]:
    """The ``stepcols`` fields of step records (the probe's sender thread; not validated here)."""
    body: dict[str, Any] = {"n": len(records), "drops": drops}
    for name, code in REQUIRED:
        body[name] = _column([r[name] for r in records], code)
    for name in OPTIONAL:
        values = [r.get(name) for r in records]
        if any(v is not None for v in values):
            body[name] = _column([_NAN if v is None else v for v in values], "d")
    device = [r.get("device_s") for r in records if r.get("device_s") is not None]
    if device:
        body["device_s"] = device[-1]
    for name in ("commands_refused", "commands_dropped"):
        count = max((r.get(name, 0) for r in records), default=0)
        if count:
            body[name] = count
    return body


def _array(obj: Mapping[str, Any], name: str, code: str, n: int) -> array:
    raw = obj.get(name)
    if type(raw) is not bytes or len(raw) != 8 * n:
        raise WireError(f"stepcols: bad column {name!r}: want {n} values of 8 bytes")
    a = array(code)
    a.frombytes(raw)
    if _SWAP:
        a.byteswap()
    return a


def _seconds(a: array, name: str) -> None:
    """Every value a finite number of seconds in 0..MAX_SECONDS; NaN allowed (a record that did
    not send the field) only in an optional column. C-level passes, not a check per value: a NaN or
    an infinity makes the sum non-finite (values within the limit never overflow it), then the
    smallest and the largest value are checked."""
    total = sum(a)
    if total != total and name in OPTIONAL:  # some records did not send it: check the others
        a = array("d", [x for x in a if x == x])
        total = sum(a)
    if a and not (math.isfinite(total) and min(a) >= 0.0 and max(a) <= MAX_SECONDS):
        raise WireError(f"stepcols: bad column {name!r}: values must be finite seconds in 0..{MAX_SECONDS:g}")


def _largest_bits(raws: list[bytes]) -> int:
    """The largest of little-endian 64-bit words of ``raws`` read as unsigned integers (one C pass
    over every column at once; 0 when empty)."""
    words = array("Q")
    words.frombytes(b"".join(raws))
    if _SWAP:
        words.byteswap()
    return max(words, default=0)


def _all_seconds(raws: list[bytes]) -> bool:
    """Whether every float64 of ``raws`` is a finite number of seconds in 0..MAX_SECONDS. First
    by the values' high bytes alone (a slice and a translation in C, no number made): every step
    time below 2**17 s passes. Else by one pass over the bit patterns: a non-negative double's
    orders as its value does, and a negative one (the sign bit), an infinity or a NaN (the
    exponent all ones) reads larger than MAX_SECONDS's. False says only "look closer" (a NaN of a
    record that did not send the field, -0.0): _seconds decides then, column by column, with the
    reason."""
    if b"".join(raws)[7::8].translate(_HIGH_FLAGS).isascii():
        return True
    return _largest_bits(raws) <= _MAX_BITS


def _non_negative(raws: list[bytes]) -> bool:
    """Whether every little-endian int64 of ``raws`` is >= 0: no high byte has its top bit set."""
    return b"".join(raws)[7::8].isascii()


#: Every byte value in order: the low bytes of consecutive steps are a slice of it (_increasing).
_IOTA = bytes(range(256))


def _consecutive(first: int, n: int) -> bytearray:
    """The little-endian bytes of the ``n`` int64 steps ``first``, ``first + 1``, ...: a run of
    words that share their high bytes per wrap of the low byte (one run for up to 256 steps that
    do not wrap, two or three for a 200-step frame's 200 or a full 512), each run built in C (its
    first word repeated, its low bytes a slice of _IOTA). ``first + n - 1`` must fit an int64."""
    out = bytearray()
    while n > 0:
        low = first & 0xFF
        run = min(n, 256 - low)
        words = bytearray(first.to_bytes(8, "little") * run)
        words[::8] = _IOTA[low:low + run]
        out += words
        first += run
        n -= run
    return out


def _increasing(step: array, raw: bytes) -> bool:
    """Whether the step numbers (``raw``: their little-endian bytes, every one non-negative)
    strictly increase. Consecutive ones (every step of a rank sent: the common case) are found
    by comparing bytes with the column they must be (_consecutive). 200 steps whose low byte
    wraps (most frames at the 2 s pace): 20.8 k instructions for this check instead of the 37.0 k
    of comparing the column read as one integer (callgrind, 2,000 columns). Else the pairwise
    test decides."""
    if len(step) < 2:
        return True
    first, n = step[0], len(step)
    if step[-1] - first == n - 1 and _consecutive(first, n) == raw:  # (the last step bounds every word)
        return True
    return all(map(operator.lt, step, step[1:]))


def _count(obj: Mapping[str, Any], name: str, required: bool) -> int:
    v = obj.get(name, None if required else 0)
    if type(v) is not int or not 0 <= v <= I64:
        raise WireError(f"stepcols: bad value for {name!r}")
    return v


def _optional_seconds(obj: Mapping[str, Any], raw: Any, name: str, size: int, raws: list[bytes]) -> array | None:
    """An optional column of seconds (None: no record sent it): its bytes typed at once when they
    are ``size`` bytes of native doubles, else read by :func:`_array` (which says what is wrong);
    its bytes join ``raws`` for the one-pass finite check."""
    if raw is None:
        return None
    column = array("d", raw) if type(raw) is bytes and len(raw) == size and not _SWAP \
        else _array(obj, name, "d", size // 8)
    raws.append(raw)
    return column


#: A ``stepcols`` frame's required fields in one C call (decode_fields' straight path).
_REQUIRED_FIELDS = operator.itemgetter("n", "step", "tokens", "wall_s", "drops")


def decode_fields(obj: Mapping[str, Any], max_batch: int) -> StepColumns:
    """Validate the fields of a ``stepcols`` frame; raise :class:`WireError` with the reason.
    Every step frame comes through here (tens of thousands a second at 4,096 ranks): the raw
    columns are read once, and every check is a C pass over them (bench/ingest.py --costs).

    A valid frame takes one straight path: every field read and every type and size tested at
    once, each column typed in place, no helper called (~6.7 k instructions fewer a frame than the
    path of one helper per optional column, callgrind). Anything it does not expect goes
    :func:`_decode_checked`, which tests field by field in the order it always did, so a refused
    frame is refused for the same reason."""
    try:
        n, raw_step, raw_tokens, raw_wall, drops = _REQUIRED_FIELDS(obj)
    except KeyError:
        return _decode_checked(obj, max_batch)
    get = obj.get
    raw_wait, raw_lead, raw_probe, raw_stage = get("input_wait_s"), get("lead_s"), get("probe_s"), get("stage_s")
    # the size only once n is known to be a small int (8 * "text" would repeat the text)
    size = n << 3 if type(n) is int and 1 <= n <= max_batch else -1
    if not (type(raw_step) is bytes and type(raw_tokens) is bytes and type(raw_wall) is bytes
            and len(raw_step) == size and len(raw_tokens) == size and len(raw_wall) == size
            and (raw_wait is None or (type(raw_wait) is bytes and len(raw_wait) == size))
            and (raw_lead is None or (type(raw_lead) is bytes and len(raw_lead) == size))
            and (raw_probe is None or (type(raw_probe) is bytes and len(raw_probe) == size))
            and (raw_stage is None or (type(raw_stage) is bytes and len(raw_stage) == size))
            and type(drops) is int and 0 <= drops <= I64 and not _SWAP
            and raw_tokens[7::8].isascii()):  # no negative token count: no high byte's top bit
        return _decode_checked(obj, max_batch)
    step = _new_q()
    step.frombytes(raw_step)
    # no negative step: the first is not, and the others increase from it (one test instead of
    # a pass over the column's high bytes: ~2.5 k instructions for 200 records)
    if step[0] < 0 or (n > 1 and not _increasing(step, raw_step)):
        return _decode_checked(obj, max_batch)
    # _all_seconds inline; NaN (a record that did not send an optional field) fails it: the
    # column checks decide then, with the reason
    seconds = b"".join((raw_wall, raw_wait or b"", raw_lead or b"", raw_probe or b"", raw_stage or b""))
    device, refused = get("device_s"), get("commands_refused", 0)
    if not ((seconds[7::8].translate(_HIGH_FLAGS).isascii() or _largest_bits([seconds]) <= _MAX_BITS)
            and (device is None or (type(device) in (int, float) and 0 <= device <= MAX_SECONDS))
            and type(refused) is int and 0 <= refused <= I64 and "commands_dropped" not in obj):
        return _decode_checked(obj, max_batch)
    # each column typed in place (a helper's call per column: ~0.6 k instructions more)
    tokens, wall = _new_q(), _new_d()
    tokens.frombytes(raw_tokens)
    wall.frombytes(raw_wall)
    wait = lead = probe = stage = None
    if raw_wait is not None:
        wait = _new_d()
        wait.frombytes(raw_wait)
    if raw_lead is not None:
        lead = _new_d()
        lead.frombytes(raw_lead)
    if raw_probe is not None:
        probe = _new_d()
        probe.frombytes(raw_probe)
    if raw_stage is not None:
        stage = _new_d()
        stage.frombytes(raw_stage)
    return _columns((step, wall, tokens, wait, lead, probe, stage, None if device is None else float(device), drops,
                     refused, 0, True))


#: An empty array of each type code, copied: array(code, raw) parses its arguments (and audits
#: the call), ~1.7 k instructions, a copy and a frombytes ~0.9 k (six columns a frame).
_new_q, _new_d = array("q").__copy__, array("d").__copy__


def _decode_checked(obj: Mapping[str, Any], max_batch: int) -> StepColumns:
    """:func:`decode_fields` field by field, in the order of its checks (the reason a refused
    frame is refused for), for any frame its straight path did not take."""
    get = obj.get
    n = get("n")
    if type(n) is not int or not 1 <= n <= max_batch:
        raise WireError(f"stepcols: bad value for 'n': 1..{max_batch} records")
    raw_step, raw_tokens, raw_wall = get("step"), get("tokens"), get("wall_s")
    size = 8 * n
    if (type(raw_step) is bytes and type(raw_tokens) is bytes and type(raw_wall) is bytes
            and len(raw_step) == size and len(raw_tokens) == size and len(raw_wall) == size):
        # array(code, bytes) is array(code).frombytes(bytes) in one call (as _array reads a column;
        # it also swaps the bytes where the machine is big-endian, the optional columns' case then)
        step, tokens, wall = array("q", raw_step), array("q", raw_tokens), array("d", raw_wall)
        if _SWAP:
            step.byteswap()
            tokens.byteswap()
            wall.byteswap()
    else:  # some column is missing or of the wrong size: say which, in the usual order
        step = _array(obj, "step", "q", n)
        tokens = _array(obj, "tokens", "q", n)
        wall = _array(obj, "wall_s", "d", n)
        raw_step, raw_tokens, raw_wall = obj["step"], obj["tokens"], obj["wall_s"]  # bytes, as _array found
    if not (raw_step + raw_tokens)[7::8].isascii():  # a high byte's top bit: a negative int64
        raise WireError("stepcols: step and tokens must be non-negative")
    if n > 1 and not _increasing(step, raw_step):
        raise WireError("stepcols: step numbers must increase")
    raws: list[bytes] = [raw_wall]  # each checked: bytes of n values
    # nil (None): no record sent it, as if the column were absent
    wait = _optional_seconds(obj, get("input_wait_s"), "input_wait_s", size, raws)
    lead = _optional_seconds(obj, get("lead_s"), "lead_s", size, raws)
    probe = _optional_seconds(obj, get("probe_s"), "probe_s", size, raws)
    stage = _optional_seconds(obj, get("stage_s"), "stage_s", size, raws)
    finite = _all_seconds(raws)  # the common case in one pass (a NaN fails it), else column by column:
    if not finite:
        for name, column in zip(_SECONDS, (wall, wait, lead, probe, stage)):
            if column is not None:
                _seconds(column, name)
    device = get("device_s")
    if device is not None and (type(device) not in (int, float) or not 0 <= device <= MAX_SECONDS):
        raise WireError("stepcols: bad value for 'device_s'")
    drops, refused = get("drops"), get("commands_refused", 0)
    if not (type(drops) is int and 0 <= drops <= I64):
        drops = _count(obj, "drops", True)  # raises
    if not (type(refused) is int and 0 <= refused <= I64):
        refused = _count(obj, "commands_refused", False)  # raises
    # almost never sent (a flood): a lookup, not a check, per frame
    dropped = _count(obj, "commands_dropped", False) if "commands_dropped" in obj else 0
    return _columns((step, wall, tokens, wait, lead, probe, stage, None if device is None else float(device),
                     drops, refused, dropped, finite))


def from_records(records: Sequence[Mapping[str, Any]]) -> StepColumns:
    """The columns of validated single-step records (``step`` and ``steps`` frames), in order; a
    record whose step does not follow the one before is left out (a ``steps`` map list carries
    no ordering guarantee of its own: the monitor's steps stay monotonic)."""
    kept, last = [], -1
    for r in records:
        if r["step"] > last:
            kept.append(r)
            last = r["step"]
    records = kept
    cols: dict[str, Any] = {name: array(code, [r[name] for r in records]) for name, code in REQUIRED}
    for name in OPTIONAL:
        values = [r.get(name) for r in records]
        if any(v is not None for v in values):
            cols[name] = array("d", [_NAN if v is None else float(v) for v in values])
    device = [r["device_s"] for r in records if r.get("device_s") is not None]
    return StepColumns(
        device_s=float(device[-1]) if device else None,
        drops=max(int(r.get("drops", 0)) for r in records),
        commands_refused=max(int(r.get("commands_refused", 0)) for r in records),
        commands_dropped=max(int(r.get("commands_dropped", 0)) for r in records),
        **cols,
    )
