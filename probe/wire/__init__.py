"""The one message schema between probe and monitor (versioned msgpack maps).

Standard library + msgpack only: the monitor imports this package and nothing else
from ``probe``.

Every frame is a msgpack map with an envelope and kind-specific fields::

    {"v": [MAJOR, MINOR], "k": kind, "job": str, "rank": int, "host": str,
     "pid": int, "inc": int, "seq": int, "t": float, ...fields}

* ``v`` — schema version. A different MAJOR is rejected; a newer MINOR is
  accepted (new optional fields are ignored by older monitors).
* ``seq`` — per-rank sequence number, so the monitor can count lost messages.
* ``t`` — the sender's wall clock (informational only: liveness uses the
  monitor's receive time).

Decoding validates types and ranges and raises :class:`WireError` with a reason.
Unknown optional fields are ignored; unknown kinds are rejected. Field checkers live in
:mod:`probe.wire.checks`, those of kernel windows in :mod:`probe.wire.kernels`, step columns in
:mod:`probe.wire.steps`, the hello's step fields in :mod:`probe.wire.hello`, a ``flops`` message as
a record in :mod:`probe.wire.flops`; the control channel's
commands (monitor to probe) in :mod:`probe.wire.control`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import msgpack

from probe.wire import steps as _steps
from probe.wire.checks import (
    PARALLEL_ROLES, Check, I64, _coords, _counts, _flat_map, _int, _int_list, _int_lists, _name, _num,
    job_id_problem,
    _num_map, _opt, _str, _str_list,
)
from probe.wire.control import CONTROL_COMMANDS as CONTROL_COMMANDS
from probe.wire.control import MAX_PACE_S as MAX_PACE_S
from probe.wire.control import MAX_PACED_TELEMETRY_S as MAX_PACED_TELEMETRY_S
from probe.wire.control import PACE_TTL_S as PACE_TTL_S
from probe.wire.control import Control as Control
from probe.wire.control import decode_control as decode_control
from probe.wire.control import encode_control as encode_control
from probe.wire.errors import WireError
from probe.wire.flops import MIX_PEAK_KINDS, PEAK_KINDS, DtypeFlops, FlopsReport, flops_report
from probe.wire.hello import HELLO_STEP_FIELDS as HELLO_STEP_FIELDS
from probe.wire.hello import LAST_STEP_CHECK, STEP_AGE_CHECK, HelloStep, hello_step
from probe.wire.kernels import (
    ACT_CPU_OP, ACT_KERNEL, ACT_MEMCPY, ACT_MEMSET, ACT_RUNTIME, KERNEL_ACT_KINDS, KERNEL_MAX_DIMS,
    KERNEL_MAX_INPUTS, KERNEL_MAX_LIST, KERNEL_MAX_NAME, KERNEL_MAX_NAMES, KERNEL_MAX_RECORDS, KERNEL_MAX_STR,
    _kernel_acts, _kernel_ops, is_runtime_call,
)
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
#: Most step records one "steps"/"stepcols" frame may carry (a rank flushes every FLOWTOP_FLUSH_S anyway).
MAX_BATCH = 512
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


def _step_records(v: Any) -> bool:
    """A "steps" batch: 1..MAX_BATCH maps, each a valid "step" message's fields."""
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_BATCH:
        return False
    schema = _SCHEMA["step"]
    for rec in v:
        if not isinstance(rec, dict):
            return False
        for name, (required, check) in schema.items():
            if name in rec:
                if not check(rec[name]):
                    return False
            elif required:
                return False
    return True


# kind -> {field: (required, check)}
_SCHEMA: dict[str, dict[str, tuple[bool, Check]]] = {
    "hello": {
        "local_rank": (True, _int(0, 1 << 20)),
        "world_size": (True, _int(1, 1 << 24)),
        "device": (True, _str(256)),
        "probe_version": (True, _str(64)),
        "argv": (False, _str_list(64, 1024)),
        # Where the rank came from: "argument", a launcher variable ("RANK", ...), "process
        # group" or "none" (nothing said: rank 0 by default, which several processes may claim).
        "rank_source": (False, _str(32)),
        # Parallel coordinates of this rank (probe.steps.parallel): role ("dp", "tp", "pp", "cp", "ep")
        # -> [rank, size], read from the device mesh and the pipeline stage; where they came from;
        # the pipeline stage indices this rank runs. Absent: not known (the monitor then sums tokens).
        "coords": (False, _coords),
        "coords_source": (False, _str(256)),
        "pp_stages": (False, _int_list(64)),
        # The rank's last completed step and the seconds since that boundary when this hello was
        # built (added within 1.3; probe.steps.tracker.StepTracker.hello_step): a monitor started
        # while the rank hangs in a collective knows how long it has (flowtop.monitor.rankstate).
        # Absent before the first step and between a sweep's models.
        "last_step": (False, LAST_STEP_CHECK),
        "step_age_s": (False, STEP_AGE_CHECK),
    },
    "step": {
        "step": (True, _int()),
        "wall_s": (True, _num(0, 1e7)),
        # Device time of step ``dstep`` (CUDA events are read a few steps late).
        "device_s": (False, _opt(_num(0, 1e7))),
        "dstep": (False, _opt(_int())),
        "tokens": (True, _int()),
        "input_wait_s": (False, _opt(_num(0, 1e7))),
        "lead_s": (False, _opt(_num(0, 1e7))),
        "micro_batches": (False, _int(0, 1 << 20)),
        "probe_s": (False, _opt(_num(0, 1e7))),
        # Compute time of this rank's pipeline stage(s) in a recent step: its forward and backward
        # chunks, waits for neighbour stages excluded (probe.steps.pipeline); absent outside pipelines.
        "stage_s": (False, _opt(_num(0, 1e7))),
        "drops": (True, _int()),
        # Monitor commands this rank refused so far (rate limit or malformed).
        "commands_refused": (False, _int()),
        # Monitor commands it dropped unread so far: over its bound (probe.transport.gate), a flood.
        "commands_dropped": (False, _int()),
    },
    # Several step records of one rank in one frame (MINOR 2): a rank sends at most one frame
    # per flush interval whatever its step rate. Each record has the "step" fields.
    "steps": {
        "records": (True, _step_records),
    },
    # Step records as columns (MINOR 3, probe.wire.steps): validated as a whole by
    # probe.wire.steps.decode_fields, not field by field.
    "stepcols": {},
    "bye": {
        "reason": (True, _str(256)),
        "steps": (True, _int()),
        "drops": (True, _int()),
    },
    "flops": {
        "step": (True, _int()),
        "model_flops": (True, _num(0, 1e30)),
        "executed_flops": (True, _num(0, 1e30)),
        "estimated_flops": (False, _opt(_num(0, 1e30))),
        "estimate_source": (False, _opt(_str(256))),
        "attention": (True, lambda v: v in ("full", "causal")),
        # The counted step's attention calls: all causal, all bidirectional, or both (absent: not read)
        "attention_masking": (False, lambda v: v in ("causal", "bidirectional", "mixed")),
        "dtype": (True, _str(16)),
        "peak_flops": (False, _opt(_num(0, 1e30))),
        "peak_source": (True, _str(512)),
        "peak_kind": (False, lambda v: v in PEAK_KINDS),
        "uncounted": (True, _counts()),
        # FLOP-like size per uncounted op in the step (probe.flops.uncounted), to weigh them by
        "uncounted_size": (False, _counts()),
        "tokens": (True, _int()),
        "signature": (False, _str(4096)),
        "cost_s": (False, _opt(_num(0, 1e7))),
        # False: the figures are the model-shape estimate, not a count (compiled code forbids one)
        "counted": (False, lambda v: isinstance(v, bool)),
        # How model FLOPs were derived where they are not a plain count (e.g. a bounded backward)
        "model_note": (False, _str(256)),
        # Mesh and placements under DTensor parallelism; the figures are then this rank's local ones
        "parallel": (False, _str(256)),
        # Precision (probe.flops.precision): [model, executed] FLOPs per operand dtype label, and the
        # dense peak of each label on this device (a label without one is absent)
        "flops_by_dtype": (False, _num_map(32, 16, width=2)),
        "peak_by_dtype": (False, _num_map(32, 16)),
        # Where those peaks come from (wire 1.4): a peak kind, or "mixed" where they differ
        "peak_by_dtype_kind": (False, lambda v: v in MIX_PEAK_KINDS),
        # MoE (probe.flops.moe): tokens per local expert of each MoE layer in the counted step
        "expert_load": (False, _int_lists(256, 128, 4096)),
        # Non-padding tokens of the counted step (the root's attention_mask), beside "tokens"
        "nonpad_tokens": (False, _int()),
    },
    "kernels": {
        "window": (True, _int()),
        "step": (True, _int()),
        "device": (True, lambda v: v in ("cuda", "cpu")),
        "step_dur_us": (True, _num(0, 1e13)),
        "typical_step_us": (False, _num(0, 1e13)),
        # Raw records of the profiled step, times in µs from the window start; the monitor
        # links and attributes them (flowtop.monitor.kernels.trace.window_from_wire).
        "names": (True, _str_list(KERNEL_MAX_NAMES, KERNEL_MAX_NAME)),
        "ops": (True, _kernel_ops),
        "acts": (True, _kernel_acts),
        "cost_s": (False, _opt(_num(0, 1e7))),
    },
    "telemetry": {
        "gpu": (True, _flat_map()),
        "proc": (True, _flat_map()),
        "reasons": (False, _flat_map()),
    },
    # A node relay's own figures (flowtop.tools.relay), about once a second beside the rank frames it
    # forwards. Not a rank: the monitor keeps relays apart (flowtop.monitor.relays). Envelope: job "",
    # rank 0, the relay's host and pid.
    "relay": {
        "relay": (True, _str(300)),  # relay id "host:pid:nonce" (its batches' stamps name it)
        "listen": (True, _str(1024)),  # where its ranks connect
        "upstream": (True, _str(1024)),
        "ranks": (True, _int(0, 1 << 20)),  # rank connections now
        "frames_in": (True, _int()),
        "frames_out": (True, _int()),
        "bytes_in": (True, _int()),
        "bytes_out": (True, _int()),
        "drops": (True, _int()),  # frames it dropped (upstream away past the age limit, queue full)
        "queued": (True, _int()),
        "commands": (True, _int()),  # monitor commands carried down
        "link_ups": (True, _int()),  # upstream connections made (1 + reconnects)
        "uptime_s": (True, _num(0, 1e10)),
        "closing": (False, lambda v: isinstance(v, bool)),  # its last report: it hands over or ends
        "hosted_by": (False, _str(64)),  # "flowtop relay" or "flowtop run"
        # Monitor commands it dropped unread so far: over the wire's bound (probe.wire.command_bound), a flood.
        "commands_dropped": (False, _int()),
    },
}

KINDS = tuple(_SCHEMA)


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
    _check_bytes(frame)
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"not msgpack: {type(exc).__name__}: {exc}"[:200]) from None
    kind, key = _head(obj)
    schema = _SCHEMA[kind]
    if admit is not None:
        why = admit(key, kind, len(frame))
        if why:
            raise WireError(why)
    if kind == "stepcols":
        columns = _steps.decode_fields(obj, MAX_BATCH)
        return Message(kind, _known(key), obj["seq"], float(obj["t"]), {}, columns)
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
        step_fields = _SCHEMA["step"]
        fields["records"] = [{n: r[n] for n in step_fields if n in r} for r in fields["records"]]
        cols = _steps.from_records(fields["records"])
    elif kind == "step":
        cols = _steps.from_records((fields,))
    elif kind == "hello":
        return Message(kind, _known(key), obj["seq"], float(obj["t"]), fields, None, None, hello_step(fields))
    return Message(kind, _known(key), obj["seq"], float(obj["t"]), fields, cols)


def _check_bytes(frame: Any) -> None:
    """Refuse what is not a frame of bytes within MAX_FRAME_BYTES."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise WireError("frame is not bytes")
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")


def _head(obj: Any) -> tuple[str, RankKey]:
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
    if type(kind) is not str or kind not in _SCHEMA:
        raise WireError(f"unknown kind {kind!r:.40}")
    return kind, _key(obj, kind)


#: Frames at least this long are worth reading envelope first (:func:`envelope`): kernel
#: windows (~80 KB for a GPT step on an H200), not step frames (~2 KB for 45 records).
PEEK_BYTES = 16 * 1024
#: Most top-level entries :func:`envelope` reads: the largest kind has ~25 (envelope included),
#: a newer minor a few more.
MAX_FIELDS = 64
_HEAD_NAMES = frozenset(("v", "k", *_ENVELOPE))


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
    kind, key = _head(obj)
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

