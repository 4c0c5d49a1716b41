"""The control channel's commands, monitor to probe (probe.wire re-exports them).

Standard library + msgpack only, like the rest of the wire.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from probe.wire import pace as _pace
from probe.wire.checks import _int, _num, _str
from probe.wire.errors import WireError
from probe.wire.version import MAJOR, MINOR

# --- control channel (monitor → probe) -------------------------------------------
# Commands travel upstream on the data connection itself: the monitor's XSUB sends them to
# every probe connected to it, and each probe's XPUB receives them. A probe binds nothing,
# so only the monitor it reports to (authenticated by CURVE where keys are set) can reach it.
#: "kernels_now": profile one step now; "pace": send step records at most every ``flush_s``
#: (the monitor slows every rank down when it hears too many; it expires, see PACE_TTL_S);
#: "hello_now" (MINOR 4): send the hello and the latest FLOP count again now (a monitor that
#: forgot the rank while its connection stayed up: flowtop.monitor.hello_asks). An older probe
#: refuses "hello_now" and counts it (``commands_refused``), as any command newer than it.
CONTROL_COMMANDS = ("kernels_now", "pace", "hello_now")
#: The commands that may address every job at once (``job`` nil).
EVERY_JOB_COMMANDS = ("pace", "hello_now")
#: Seconds a "pace" command holds: a monitor that stopped sending it (it restarted, or has fewer
#: ranks now) no longer slows its ranks once this has passed.
PACE_TTL_S = 10.0
#: Longest flush interval a "pace" command may ask for (probe.wire.pace: what a pace is for).
MAX_PACE_S = _pace.MAX_PACE_S
#: Longest interval a "pace" command's ``telemetry_max_s`` may let a paced probe sample its
#: telemetry at (optional, added within 1.3: a probe paced without it, or with one out of range,
#: stretches to 5 s at most).
MAX_PACED_TELEMETRY_S = 60.0


class Control(NamedTuple):
    """A decoded monitor command: for the ranks of ``job`` (every job when None: only
    EVERY_JOB_COMMANDS),
    one rank of it or every rank (``rank`` None); ``flush_s`` for "pace", and the longest
    telemetry interval the paced ranks may stretch to, ``telemetry_max_s`` (None: the monitor did
    not say; an older one reads samples older than 10 s as stale)."""

    cmd: str
    job: str | None
    rank: int | None
    flush_s: float | None = None
    telemetry_max_s: float | None = None


def encode_control(command: str, job: str | None, rank: int | None, flush_s: float | None = None,
                   telemetry_max_s: float | None = None) -> bytes:
    """A command for one rank (or every rank of ``job`` when ``rank`` is None; every rank of every
    job when ``job`` is None, for EVERY_JOB_COMMANDS)."""
    body: dict[str, Any] = {"v": [MAJOR, MINOR], "k": "control", "cmd": command, "job": job, "rank": rank}
    if flush_s is not None:
        body["flush_s"] = flush_s
    if telemetry_max_s is not None:  # a field older probes do not read (they keep their 5 s)
        body["telemetry_max_s"] = telemetry_max_s
    return msgpack.packb(body)


def decode_control(frame: bytes) -> Control:
    """The command of a control frame; raise :class:`WireError` on anything else."""
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
    cmd, job, rank, flush = obj.get("cmd"), obj.get("job"), obj.get("rank"), obj.get("flush_s")
    pace = cmd == "pace"
    if (cmd not in CONTROL_COMMANDS or not (_str()(job) or (cmd in EVERY_JOB_COMMANDS and job is None))
            or not (rank is None or _int(0, 1 << 24)(rank))):
        raise WireError("malformed control message")
    if pace != (flush is not None) or (pace and not _num(0.0, MAX_PACE_S)(flush)):
        raise WireError(f"malformed control message: 'pace' needs flush_s in 0..{MAX_PACE_S:g} s, "
                        "nothing else takes it")
    # Optional and advisory: one out of range (a later monitor's) is left out, never the pace with it.
    raw = obj.get("telemetry_max_s")
    tel = float(raw) if pace and raw is not None and _num(1.0, MAX_PACED_TELEMETRY_S)(raw) else None
    return Control(cmd, job, rank, float(flush) if pace and flush is not None else None, tel)
