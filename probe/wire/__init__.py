"""The one message schema between probe and monitor (versioned msgpack maps).

Standard library + msgpack only: the monitor imports this package and nothing else
from ``probe``.

Every frame is a msgpack map with an envelope and kind-specific fields::

    {"v": [MAJOR, MINOR], "k": kind, "job": str, "rank": int, "host": str,
     "pid": int, "inc": int, "seq": int, "t": float, ...fields}

* ``v`` — schema version. A different MAJOR is rejected; a newer MINOR is
  accepted (new optional fields are ignored by older monitors).
* ``seq`` — per-rank sequence number, so the monitor can count lost messages.
* ``t`` — the sender's wall clock when it queued the frame. Liveness uses the monitor's receive
  time; a bye's ``t`` (on the monitor's clock by the rank's least transit) orders a job's endings.

Decoding validates types and ranges and raises :class:`WireError` with a reason.
Unknown optional fields are ignored; unknown kinds are rejected. Each kind's fields and their
checks are in :mod:`probe.wire.schema`, the field checkers in :mod:`probe.wire.checks`, those of
kernel windows in :mod:`probe.wire.kernels`, step columns in :mod:`probe.wire.steps`, the hello's
step fields in :mod:`probe.wire.hello`, a ``flops`` message as a record in :mod:`probe.wire.flops`;
the control channel's commands (monitor to probe) in :mod:`probe.wire.control`.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable, Mapping, NamedTuple

import msgpack

# decode() relies on msgpack 1.0's unpackb defaults (raw=False, strict_map_key=True, use_list=True)
# and encode() on its packb's (use_bin_type=True): an older msgpack would read every key as bytes
# and refuse every frame. pyproject asks for >= 1.0; a system package can still shadow it.
if msgpack.version < (1, 0):
    raise ImportError(f"flowtop needs msgpack >= 1.0, found {'.'.join(map(str, msgpack.version))}")

from probe.wire import steps as _steps
from probe.wire.checks import PARALLEL_ROLES, Check, I64, _int, _name, _num, job_id_problem
from probe.wire.control import CONTROL_COMMANDS as CONTROL_COMMANDS
from probe.wire.control import MAX_PACE_S as MAX_PACE_S
from probe.wire.control import MAX_PACED_TELEMETRY_S as MAX_PACED_TELEMETRY_S
from probe.wire.control import PACE_TTL_S as PACE_TTL_S
from probe.wire.control import Control as Control
from probe.wire.control import decode_control as decode_control
from probe.wire.control import encode_control as encode_control
from probe.wire.errors import WireError
from probe.wire.flops import DtypeFlops, FlopsReport, flops_report
from probe.wire.hello import HELLO_STEP_FIELDS as HELLO_STEP_FIELDS
from probe.wire.hello import HelloStep, hello_step
from probe.wire.kernels import (
    ACT_CPU_OP, ACT_KERNEL, ACT_MEMCPY, ACT_MEMSET, ACT_RUNTIME, KERNEL_ACT_KINDS, KERNEL_MAX_DIMS,
    KERNEL_MAX_INPUTS, KERNEL_MAX_LIST, KERNEL_MAX_NAME, KERNEL_MAX_NAMES, KERNEL_MAX_RECORDS, KERNEL_MAX_STR,
    is_runtime_call,
)
from probe.wire.schema import MAX_BATCH as MAX_BATCH
from probe.wire.schema import SCHEMA
from probe.wire.steps import StepColumns
from probe.wire.version import MAJOR as MAJOR
from probe.wire.version import MINOR as MINOR

__all__ = [
    "ACT_CPU_OP", "ACT_KERNEL", "ACT_MEMCPY", "ACT_MEMSET", "ACT_RUNTIME", "DEFAULT_ADDR", "DEFAULT_PORT",
    "DtypeFlops", "FlopsReport", "HELLO_STEP_FIELDS", "HelloStep",
    "KERNEL_ACT_KINDS", "KERNEL_MAX_DIMS", "KERNEL_MAX_INPUTS", "KERNEL_MAX_LIST",
    "KERNEL_MAX_NAME", "KERNEL_MAX_NAMES", "KERNEL_MAX_RECORDS", "KERNEL_MAX_STR", "KINDS", "MAJOR", "MAX_BATCH",
    "MAX_FRAME_BYTES", "MAX_PACE_S", "MINOR", "PACE_TTL_S", "PARALLEL_ROLES", "Admit", "Control", "Message",
    "RankKey", "StepColumns", "WireError",
    "BYE_ERROR_PREFIX", "PEEK_BYTES", "decode", "flops_report", "job_id_problem", "decode_control", "encode",
    "encode_control", "encode_steps",
    "envelope",
    "is_runtime_call", "records",
    "step_columns",
]

#: The start of a bye's reason when its process ends of an exception nobody caught (the monitor
#: shows such a rank as "failed", not "done"): "error: TYPE: message".
BYE_ERROR_PREFIX = "error: "
#: Largest frame either side accepts (the collector also sets ZMQ MAXMSGSIZE).
MAX_FRAME_BYTES = 8 * 1024 * 1024
#: Default address: the monitor binds it, the probe connects to it.
DEFAULT_PORT = 5759
DEFAULT_ADDR = f"tcp://127.0.0.1:{DEFAULT_PORT}"


# Keys and messages are tuples with names, not dataclasses: the monitor makes one of each per
# frame (tens of thousands a second at thousands of ranks) and hashes keys several times per
# frame; a tuple's hash and construction run in C.
class RankKey(NamedTuple):
    """Identity of one rank process: (job, host, pid, rank, incarnation)."""

    job: str
    host: str
    pid: int
    rank: int
    inc: int


class Message(NamedTuple):
    """A decoded, validated message: envelope plus the kind's fields; a step frame's records
    (``step``, ``steps``, ``stepcols``) also as columns in ``steps``."""

    kind: str
    key: RankKey
    seq: int
    sent_at: float
    fields: Mapping[str, Any]
    steps: StepColumns | None = None
    #: The frame itself when only its envelope was read (:func:`envelope`; ``fields`` is then
    #: empty): its fields are decoded, and validated, where they are used.
    frame: bytes | None = None
    #: A hello's step fields (``last_step``, ``step_age_s``, also in ``fields``) as one record;
    #: None where it says no step (probe.wire.hello), and for other kinds.
    hello_step: HelloStep | None = None


#: Message(*fields) with every field given, in order, by tuple's own constructor: the NamedTuple's
#: __new__ is a Python function (binding its arguments and defaults: ~1 k instructions a frame).
_message = functools.partial(tuple.__new__, Message)

#: The message kinds a frame may be (:mod:`probe.wire.schema`).
KINDS = tuple(SCHEMA)


_ENVELOPE: dict[str, Check] = {
    "job": _name(256),
    "rank": _int(0, 1 << 24),
    "host": _name(256),
    "pid": _int(0, 1 << 31),
    "inc": _int(0, 1 << 20),
    "seq": _int(),
    "t": _num(0, 1e11),
}
#: Keys of frames decoded whole, by their fields: one RankKey object per rank (a dict hit instead
#: of a construction per frame; cleared when it holds as many keys as the monitor admits ranks).
_KEYS: dict[tuple[Any, ...], RankKey] = {}
_MAX_KEYS = 1 << 16


def encode(kind: str, key: RankKey, seq: int, sent_at: float, fields: Mapping[str, Any]) -> bytes:
    """Pack one message. Fields are not validated here (the probe's hot path)."""
    body: dict[str, Any] = dict(fields)
    # The envelope is written last so a field can never shadow it.
    body.update({
        "v": [MAJOR, MINOR],
        "k": kind,
        "job": key.job,
        "rank": key.rank,
        "host": key.host,
        "pid": key.pid,
        "inc": key.inc,
        "seq": seq,
        "t": sent_at,
    })
    return msgpack.packb(body, use_bin_type=True)


def encode_steps(key: RankKey, seq: int, sent_at: float, records: list[Mapping[str, Any]], drops: int) -> bytes:
    """Pack step records (oldest first, each with the "step" fields) as one ``stepcols`` frame."""
    return encode("stepcols", key, seq, sent_at, _steps.encode_fields(records, drops))


#: Asked before a frame's fields are validated: (key, kind, frame bytes) -> "" to go on, or why
#: the frame is refused (validating a large kernels frame is the costly part of a decode).
Admit = Callable[[RankKey, str, int], str]


def decode(frame: bytes, admit: Admit | None = None) -> Message:
    """Unpack and validate one frame; raise :class:`WireError` with a reason."""
    if type(frame) is not bytes or len(frame) > MAX_FRAME_BYTES:
        _check_bytes(frame)  # refuses it, unless a bytearray or memoryview within the limit
    try:
        # raw=False, strict_map_key=True, use_list=True: msgpack's defaults since 1.0 (pyproject's
        # floor), not passed (parsing the keywords was ~0.3 k instructions a frame, callgrind)
        obj = msgpack.unpackb(frame)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"not msgpack: {type(exc).__name__}: {exc}"[:200]) from None
    kind, key, interned = _head(obj)
    if admit is not None:
        why = admit(key, kind, len(frame))
        if why:
            raise WireError(why)
    if kind == "stepcols":
        columns = _steps.decode_fields(obj, MAX_BATCH)
        return _message((kind, key if interned else _known(key), obj["seq"], float(obj["t"]), {}, columns, None,
                         None))
    schema = SCHEMA[kind]
    fields: dict[str, Any] = {}
    for name, (required, check) in schema.items():
        if name not in obj:
            if required:
                raise WireError(f"{kind}: missing field {name!r}")
            continue
        if not check(obj[name]):
            raise WireError(f"{kind}: bad value for {name!r}")
        fields[name] = obj[name]
    cols = None
    if kind == "steps":  # only the known fields of each record, like any single message
        step_fields = SCHEMA["step"]
        fields["records"] = [{n: r[n] for n in step_fields if n in r} for r in fields["records"]]
        cols = _steps.from_records(fields["records"])
    elif kind == "step":
        cols = _steps.from_records((fields,))
    elif kind == "hello":
        return _message((kind, key if interned else _known(key), obj["seq"], float(obj["t"]), fields, None, None,
                         hello_step(fields)))
    return _message((kind, key if interned else _known(key), obj["seq"], float(obj["t"]), fields, cols, None, None))


def _check_bytes(frame: Any) -> None:
    """Refuse what is not a frame of bytes within MAX_FRAME_BYTES."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise WireError("frame is not bytes")
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")


def _head(obj: Any) -> tuple[str, RankKey, bool]:
    """The kind and rank key of an unpacked frame, its version and envelope validated, and whether
    that key is the interned one (:func:`_known`). Every frame: a rank already known, in a valid
    frame, takes one straight test (its fields read in one call, the checks the key's decode
    made not made again: ~4 k instructions fewer, callgrind); anything else is decided field by
    field (:func:`_head_checked`), which refuses a frame for the same reason as ever."""
    if type(obj) is dict:
        try:
            version, kind, job, host, pid, rank, inc, seq, t = _HEAD_FIELDS(obj)
        except KeyError:  # some field missing: said below
            pass
        else:
            # Exact types before the cache: True == 1 and 7.0 == 7 would find the key of a valid
            # frame; the cached key's values passed their checks when its frame was decoded.
            if (type(version) is list and len(version) == 2 and type(version[0]) is int and version[0] == MAJOR
                    and type(minor := version[1]) is int and 0 <= minor <= 1 << 16
                    and type(kind) is str and kind in SCHEMA
                    and type(job) is str and type(host) is str
                    and type(pid) is int and type(rank) is int and type(inc) is int
                    and type(seq) is int and 0 <= seq <= I64 and type(t) in (float, int) and 0 <= t <= 1e11):
                key = _KEYS.get((job, host, pid, rank, inc))
                if key is not None:
                    return kind, key, True
    kind, key = _head_checked(obj)
    return kind, key, False


def _head_checked(obj: Any) -> tuple[str, RankKey]:
    """The kind and rank key of an unpacked frame, its version and envelope validated."""
    if type(obj) is not dict:
        raise WireError("top level is not a map")
    version = obj.get("v")
    if type(version) is not list or len(version) != 2:
        raise WireError("missing or malformed version 'v'")
    major, minor = version  # each frame: plain tests, no generator (bench/ingest.py --costs)
    if not (type(major) is int and type(minor) is int and 0 <= major <= 1 << 16 and 0 <= minor <= 1 << 16):
        raise WireError("missing or malformed version 'v'")
    if major != MAJOR:
        raise WireError(f"unsupported major version {major} (this monitor speaks {MAJOR})")
    kind = obj.get("k")
    if type(kind) is not str or kind not in SCHEMA:
        raise WireError(f"unknown kind {kind!r:.40}")
    return kind, _key(obj, kind)


#: Frames at least this long are worth reading envelope first (:func:`envelope`): kernel
#: windows (~80 KB for a GPT step on an H200), not step frames (~2 KB for 45 records).
PEEK_BYTES = 16 * 1024
#: Most top-level entries :func:`envelope` reads: the largest kind has ~25 (envelope included),
#: a newer minor a few more.
MAX_FIELDS = 64
_HEAD_NAMES = frozenset(("v", "k", *_ENVELOPE))
#: The version, kind and envelope of a frame's map (_head's order) in one C call.
_HEAD_FIELDS = operator.itemgetter("v", "k", "job", "host", "pid", "rank", "inc", "seq", "t")


def envelope(frame: bytes) -> Message:
    """The envelope of ``frame`` (kind, key, seq, sent time; ``fields`` empty, ``frame`` set),
    validated as :func:`decode` validates it, without building its fields: they are stepped over
    in C. An 80 KB kernel window: ~65 µs instead of ~600 µs for its unpack and ~1.3 ms for its
    validation, which a monitor refusing it for its byte rate, or building it on another
    thread, need not pay on its data thread. Raises :class:`WireError`; a frame it reads may
    still fail :func:`decode` (its fields are not looked at)."""
    _check_bytes(frame)
    obj: dict[str, Any] = {}
    try:
        reader = msgpack.Unpacker(raw=False, strict_map_key=True, use_list=True, max_buffer_size=max(1, len(frame)))
        reader.feed(frame)
        entries = reader.read_map_header()
        if entries > MAX_FIELDS:  # stepping over millions of tiny entries in Python costs more than a decode
            raise WireError(f"frame map of {entries} entries: more than any kind's {MAX_FIELDS}")
        for _ in range(entries):
            name = reader.unpack()
            if type(name) is str and name in _HEAD_NAMES:
                obj[name] = reader.unpack()
            else:
                reader.skip()
        trailing = reader.tell() != len(frame)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"not msgpack: {type(exc).__name__}: {exc}"[:200]) from None
    if trailing:  # as unpackb refuses extra data
        raise WireError("not msgpack: extra data after the frame's map")
    kind, key, _ = _head(obj)
    return Message(kind, key, obj["seq"], float(obj["t"]), {}, None, bytes(frame))


def _known(key: RankKey) -> RankKey:
    """The one object of ``key``, interned once its frame decoded whole (a flood of frames that
    are then refused must not fill the cache, nor push the real ranks' keys out of it)."""
    held = _KEYS.get(key)
    if held is None:
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        held = _KEYS[key] = key
    return held


def _key(obj: Any, kind: str) -> RankKey:
    """The envelope's rank key, validated (every frame: plain type and range tests first, the
    checkers only to name what is wrong)."""
    get = obj.get
    job, host, pid, rank, inc = get("job"), get("host"), get("pid"), get("rank"), get("inc")
    seq, t = get("seq"), get("t")
    fields = (job, host, pid, rank, inc)
    # Exact types before the cache: True == 1 and 7.0 == 7 would find the key of a valid frame.
    ints = type(pid) is int and type(rank) is int and type(inc) is int
    key = _KEYS.get(fields) if ints and type(job) is str and type(host) is str else None
    if (
        (key is not None or (ints and _ENVELOPE["job"](job) and _ENVELOPE["host"](host)
                             and 0 <= pid <= 1 << 31 and 0 <= rank <= 1 << 24 and 0 <= inc <= 1 << 20))
        and type(seq) is int and 0 <= seq <= I64
        and type(t) in (float, int) and 0 <= t <= 1e11
    ):
        return key if key is not None else RankKey(job, host, pid, rank, inc)
    for name, check in _ENVELOPE.items():
        if name not in obj:
            raise WireError(f"{kind}: missing envelope field {name!r}")
        if not check(obj[name]):
            raise WireError(f"{kind}: bad envelope field {name!r}")
    raise WireError(f"{kind}: bad envelope")  # not reached: some checker fails above


def records(msg: Message) -> list[dict[str, Any]]:
    """The step records of a step frame (``step``, ``steps``, ``stepcols``), oldest first: as
    sent for the record kinds, rebuilt from the columns for ``stepcols``."""
    if msg.kind == "steps":
        return list(msg.fields["records"])
    if msg.kind == "step":
        return [dict(msg.fields)]
    return msg.steps.records() if msg.steps is not None else []


def step_columns(msg: Message) -> StepColumns | None:
    """The step records of a message as columns (None when it holds none); a message built by
    hand from a "step"/"steps" map (tests, tools) gets its columns here."""
    if msg.steps is not None or msg.kind not in ("step", "steps"):
        return msg.steps
    return _steps.from_records(records(msg))

