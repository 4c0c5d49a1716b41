"""The one message schema between probe and monitor (versioned msgpack maps).

Standard library + msgpack only: the monitor imports this module and nothing else
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
Unknown optional fields are ignored; unknown kinds are rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import msgpack

MAJOR = 1
MINOR = 2  # 1: kernels carry raw records (names, ops, acts); 2: "steps" batches, "relay" figures
#: Most step records one "steps" frame may carry (a rank flushes every FLOWTOP_FLUSH_S anyway).
MAX_BATCH = 512
#: Largest frame either side accepts (the collector also sets ZMQ MAXMSGSIZE).
MAX_FRAME_BYTES = 8 * 1024 * 1024
#: Default address: the monitor binds it, the probe connects to it.
DEFAULT_PORT = 5759
DEFAULT_ADDR = f"tcp://127.0.0.1:{DEFAULT_PORT}"

_I64 = 2**63 - 1


class WireError(ValueError):
    """A frame that cannot be accepted; ``str(err)`` is the reason."""


@dataclass(frozen=True)
class RankKey:
    """Identity of one rank process: (job, host, pid, rank, incarnation)."""

    job: str
    host: str
    pid: int
    rank: int
    inc: int


@dataclass(frozen=True)
class Message:
    """A decoded, validated message: envelope plus the kind's fields."""

    kind: str
    key: RankKey
    seq: int
    sent_at: float
    fields: Mapping[str, Any]


# --- field checkers -------------------------------------------------------------

Check = Callable[[Any], bool]


def _int(lo: int = 0, hi: int = _I64) -> Check:
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
    """Parallel coordinates: role -> [rank, size] with 0 <= rank < size (probe.parallel)."""
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


def _flat_map(max_items: int = 200) -> Check:
    """A map of short names to scalars, short strings, lists of strings or None."""

    def scalar(x: Any) -> bool:
        return (
            x is None
            or isinstance(x, (bool, int))
            or (isinstance(x, float) and math.isfinite(x))
            or (isinstance(x, str) and len(x) <= 512)
            or (isinstance(x, list) and len(x) <= 64 and all(isinstance(s, str) and len(s) <= 64 for s in x))
        )

    return lambda v: isinstance(v, dict) and len(v) <= max_items and all(
        isinstance(k, str) and len(k) <= 64 and scalar(x) for k, x in v.items()
    )


# --- kernel windows: raw profiler records (the monitor links and attributes them) --------------

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
#: Activity kinds on the wire: 0 kernel, 1 memcpy, 2 memset, 4 runtime call (3 is a host op).
KERNEL_ACT_KINDS = (0, 1, 2, 4)


def is_runtime_call(name: str) -> bool:
    """Whether a host record's name is a CUDA runtime or driver API call (``cudaEventQuery``,
    ``cuLaunchKernelEx``) or CUPTI's ``INVALID`` callback, never an operator. torch ≤ 2.11 does
    not say which a Kineto event is, and such a call made outside any operator carries no link
    to one (a probe of that torch sent them as operators; see probe.kernels)."""
    return name.startswith("cuda") or name == "INVALID" or (
        len(name) > 2 and name[:2] == "cu" and name[2].isupper())

_index = _int(0)
_time = _num(-1e12, 1e12)
_size = _int(0, 2**62)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v <= _I64


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


# The two record checkers raise WireError themselves (decode passes it on), so that the reason
# names the record and what is wrong with it rather than only the field.


def _kernel_ops(v: Any) -> bool:
    """Host operator calls: ``[name, thread, start_us, end_us, ext, dims, concrete]``."""
    for i, o in enumerate(_records("ops", v)):
        if not isinstance(o, list) or len(o) != 7:
            raise _bad_record("ops", i, "not a list of 7 fields")
        name, thread, start, end, ext, dims, concrete = o
        if not (_index(name) and _index(thread) and _index(ext)):
            raise _bad_record("ops", i, "name, thread and ext must be non-negative integers")
        if not (_time(start) and _time(end)):
            raise _bad_record("ops", i, "start/end must be finite numbers")
        if not _dims(dims):
            raise _bad_record("ops", i, f"dims must be None or ≤ {KERNEL_MAX_INPUTS} lists of ≤ {KERNEL_MAX_DIMS} sizes")
        if not _concrete(concrete):
            raise _bad_record("ops", i, "concrete must be None or a short list of scalars and int lists")
    return True


def _kernel_acts(v: Any) -> bool:
    """Device activities and runtime calls: ``[name, kind, start_us, end_us, stream, ext, corr]``."""
    for i, a in enumerate(_records("acts", v)):
        if not isinstance(a, list) or len(a) != 7:
            raise _bad_record("acts", i, "not a list of 7 fields")
        name, kind, start, end, stream, ext, corr = a
        if not (_int(0, 4)(kind) and kind in KERNEL_ACT_KINDS):
            raise _bad_record("acts", i, f"kind must be one of {KERNEL_ACT_KINDS}")
        if not (_index(name) and _int(-1, 2**31)(stream) and _index(ext) and _index(corr)):
            raise _bad_record("acts", i, "name, stream, ext and corr must be integers in range")
        if not (_time(start) and _time(end)):
            raise _bad_record("acts", i, "start/end must be finite numbers")
    return True


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
        # Parallel coordinates of this rank (probe.parallel): role ("dp", "tp", "pp", "cp", "ep")
        # -> [rank, size], read from the device mesh and the pipeline stage; where they came from;
        # the pipeline stage indices this rank runs. Absent: not known (the monitor then sums tokens).
        "coords": (False, _coords),
        "coords_source": (False, _str(256)),
        "pp_stages": (False, _int_list(64)),
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
        # chunks, waits for neighbour stages excluded (probe.pipeline); absent outside pipelines.
        "stage_s": (False, _opt(_num(0, 1e7))),
        "drops": (True, _int()),
        # Monitor commands this rank refused so far (rate limit or malformed).
        "commands_refused": (False, _int()),
    },
    # Several step records of one rank in one frame (MINOR 2): a rank sends at most one frame
    # per flush interval whatever its step rate. Each record has the "step" fields.
    "steps": {
        "records": (True, _step_records),
    },
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
        "dtype": (True, _str(16)),
        "peak_flops": (False, _opt(_num(0, 1e30))),
        "peak_source": (True, _str(512)),
        "uncounted": (True, _counts()),
        # FLOP-like size per uncounted op in the step (probe.flops_uncounted), to weigh them by
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
        # Precision (probe.precision): [model, executed] FLOPs per operand dtype label, and the
        # dense peak of each label on this device (a label without one is absent)
        "flops_by_dtype": (False, _num_map(32, 16, width=2)),
        "peak_by_dtype": (False, _num_map(32, 16)),
        # MoE (probe.moe): tokens per local expert of each MoE layer in the counted step
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
        # links and attributes them (flowtop.kernels.trace.window_from_wire).
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
    # A node relay's own figures (flowtop.relay), about once a second beside the rank frames it
    # forwards. Not a rank: the monitor keeps relays apart (flowtop.relays). Envelope: job "",
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
    },
}

KINDS = tuple(_SCHEMA)

def _name(max_len: int) -> Check:
    """An identifier printed everywhere (job, host): no control characters at all."""
    return lambda v: isinstance(v, str) and len(v) <= max_len and v.isprintable()


_ENVELOPE: dict[str, Check] = {
    "job": _name(256),
    "rank": _int(0, 1 << 24),
    "host": _name(256),
    "pid": _int(0, 1 << 31),
    "inc": _int(0, 1 << 20),
    "seq": _int(),
    "t": _num(0, 1e11),
}


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


#: Asked before a frame's fields are validated: (key, kind, frame bytes) -> "" to go on, or why
#: the frame is refused (validating a large kernels frame is the costly part of a decode).
Admit = Callable[[RankKey, str, int], str]


def decode(frame: bytes, admit: Admit | None = None) -> Message:
    """Unpack and validate one frame; raise :class:`WireError` with a reason."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise WireError("frame is not bytes")
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"not msgpack: {type(exc).__name__}: {exc}"[:200]) from None
    if not isinstance(obj, dict):
        raise WireError("top level is not a map")
    version = obj.get("v")
    if (
        not isinstance(version, list)
        or len(version) != 2
        or not all(_int(0, 1 << 16)(x) for x in version)
    ):
        raise WireError("missing or malformed version 'v'")
    if version[0] != MAJOR:
        raise WireError(f"unsupported major version {version[0]} (this monitor speaks {MAJOR})")
    kind = obj.get("k")
    schema = _SCHEMA.get(kind) if isinstance(kind, str) else None
    if schema is None:
        raise WireError(f"unknown kind {kind!r:.40}")
    for name, check in _ENVELOPE.items():
        if name not in obj:
            raise WireError(f"{kind}: missing envelope field {name!r}")
        if not check(obj[name]):
            raise WireError(f"{kind}: bad envelope field {name!r}")
    key = RankKey(obj["job"], obj["host"], obj["pid"], obj["rank"], obj["inc"])
    if admit is not None:
        why = admit(key, kind, len(frame))
        if why:
            raise WireError(why)
    fields: dict[str, Any] = {}
    for name, (required, check) in schema.items():
        if name not in obj:
            if required:
                raise WireError(f"{kind}: missing field {name!r}")
            continue
        if not check(obj[name]):
            raise WireError(f"{kind}: bad value for {name!r}")
        fields[name] = obj[name]
    if kind == "steps":  # only the known fields of each record, like any single message
        step_fields = _SCHEMA["step"]
        fields["records"] = [{n: r[n] for n in step_fields if n in r} for r in fields["records"]]
    return Message(kind=kind, key=key, seq=obj["seq"], sent_at=float(obj["t"]), fields=fields)


def records(msg: Message) -> list[dict[str, Any]]:
    """The step records of a "step" or "steps" message, oldest first."""
    if msg.kind == "steps":
        return list(msg.fields["records"])
    return [msg.fields] if msg.kind == "step" else []


# --- control channel (monitor → probe) -------------------------------------------
# Commands travel upstream on the data connection itself: the monitor's XSUB sends them to
# every probe connected to it, and each probe's XPUB receives them. A probe binds nothing,
# so only the monitor it reports to (authenticated by CURVE where keys are set) can reach it.

CONTROL_COMMANDS = ("kernels_now",)


def encode_control(command: str, job: str, rank: int | None) -> bytes:
    """A command for one rank (or every rank of ``job`` when ``rank`` is None)."""
    return msgpack.packb({"v": [MAJOR, MINOR], "k": "control", "cmd": command, "job": job, "rank": rank})


def decode_control(frame: bytes) -> tuple[str, str, int | None]:
    """Return (command, job, rank); raise :class:`WireError` on anything else."""
    if len(frame) > 4096:
        raise WireError("control frame too large")
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(obj, dict) or obj.get("k") != "control":
        raise WireError("not a control message")
    v = obj.get("v")
    if not isinstance(v, list) or not v or v[0] != MAJOR:
        raise WireError("unsupported control version")
    cmd, job, rank = obj.get("cmd"), obj.get("job"), obj.get("rank")
    if cmd not in CONTROL_COMMANDS or not _str()(job) or not (rank is None or _int(0, 1 << 24)(rank)):
        raise WireError("malformed control message")
    return cmd, job, rank
