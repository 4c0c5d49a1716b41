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
MINOR = 0
#: Largest frame either side accepts (the collector also sets ZMQ MAXMSGSIZE).
MAX_FRAME_BYTES = 8 * 1024 * 1024
#: Default address: the monitor binds it, the probe connects to it.
DEFAULT_PORT = 5759
DEFAULT_ADDR = f"tcp://127.0.0.1:{DEFAULT_PORT}"
#: Control channel (monitor PUB → probe SUB): the data port + 1 by default.
DEFAULT_CONTROL_ADDR = f"tcp://127.0.0.1:{DEFAULT_PORT + 1}"

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


def _counts(max_items: int = 1000) -> Check:
    """A map of short names to non-negative integers (e.g. uncounted ops)."""
    return lambda v: isinstance(v, dict) and len(v) <= max_items and all(
        isinstance(k, str) and len(k) <= 256 and _int()(c) for k, c in v.items()
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


def _events(max_items: int = 500_000) -> Check:
    """Kernel-window events: ``[name, kind, ts_us, dur_us, stream, op, flops]``."""

    def check(v: Any) -> bool:
        if not isinstance(v, list) or len(v) > max_items:
            return False
        for e in v:
            if not isinstance(e, list) or len(e) != 7:
                return False
            name, kind, ts, dur, stream, op, flops = e
            if not (_int(0)(name) and _int(0, 4)(kind) and _int(-1, 2**31)(stream) and _int(-1)(op)):
                return False
            if not (_num(-1e12, 1e12)(ts) and _num(0, 1e12)(dur) and _num(-1, 1e30)(flops)):
                return False
        return True

    return check


# kind -> {field: (required, check)}
_SCHEMA: dict[str, dict[str, tuple[bool, Check]]] = {
    "hello": {
        "local_rank": (True, _int(0, 1 << 20)),
        "world_size": (True, _int(1, 1 << 24)),
        "device": (True, _str(256)),
        "probe_version": (True, _str(64)),
        "argv": (False, _str_list(64, 1024)),
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
        "drops": (True, _int()),
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
        "tokens": (True, _int()),
        "signature": (False, _str(4096)),
        "cost_s": (False, _opt(_num(0, 1e7))),
    },
    "kernels": {
        "window": (True, _int()),
        "step": (True, _int()),
        "device": (True, lambda v: v in ("cuda", "cpu")),
        "step_dur_us": (True, _num(0, 1e13)),
        "typical_step_us": (False, _num(0, 1e13)),
        "names": (True, _str_list(100_000, 8192)),
        "events": (True, _events()),
        "cost_s": (False, _opt(_num(0, 1e7))),
    },
    "telemetry": {
        "gpu": (True, _flat_map()),
        "proc": (True, _flat_map()),
        "reasons": (False, _flat_map()),
    },
}

KINDS = tuple(_SCHEMA)

_ENVELOPE: dict[str, Check] = {
    "job": _str(256),
    "rank": _int(0, 1 << 24),
    "host": _str(256),
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


def decode(frame: bytes) -> Message:
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
    fields: dict[str, Any] = {}
    for name, (required, check) in schema.items():
        if name not in obj:
            if required:
                raise WireError(f"{kind}: missing field {name!r}")
            continue
        if not check(obj[name]):
            raise WireError(f"{kind}: bad value for {name!r}")
        fields[name] = obj[name]
    key = RankKey(obj["job"], obj["host"], obj["pid"], obj["rank"], obj["inc"])
    return Message(kind=kind, key=key, seq=obj["seq"], sent_at=float(obj["t"]), fields=fields)


# --- control channel (monitor → probe) -------------------------------------------

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
