"""The monitor's view of node relays (``flowtop relay``), as typed records. No Textual.

A relay forwards its ranks' frames upstream unchanged, in multi-part messages
``[stamp, frame, frame, ...]``. The stamp (:func:`encode_stamp`) names the relay, its clock at
send time and, per frame, how long the relay held it. The monitor maps the relay's clock onto its
own with the smallest (monitor receive − relay send) offset seen so far: the path with the least
queueing. A frame then counts as received when the relay received it, so liveness and step pace
follow the relay's view of its ranks, and a burst from a congested upstream link (seconds of
frames arriving at once) neither makes ranks look silent in between nor bunches their steps.

Every ~1 s the relay sends its own figures as a ``relay`` wire message (``probe.wire``; up to
every 5 s while a monitor's pace holds and its batches leave), which with its batches makes
its heartbeat: a relay silent for :data:`SILENT_AFTER_S` marks the ranks that last came
through it stale and cut off, with ``status_reason`` "relay HOST silent for N s" (held as since
when: flowtop.monitor.relayviews.RelayCut, said at display), their rates n/a: unheard, not
stopped (the job's figures are over its heard ranks, flowtop.monitor.model_views); the other
ranks of the job are untouched. Its last report says ``closing`` (it handed the node over, or ended).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any, Callable

import msgpack

from flowtop.monitor import accounting
from flowtop.monitor.records import Fields
from flowtop.monitor.relayviews import RelayCut
from flowtop.monitor.sanitize import deep
from flowtop.monitor.snapshot import RankSnapshot, RelaySnapshot
from probe.wire import Message, RankKey, WireError
from probe.wire.command_bound import bound_text

#: A relay reports every second (or sends batches); this long without a batch or a report and it is "silent".
SILENT_AFTER_S = 3.0
#: A closed relay's ranks may take this long to come back through its successor.
HANDOFF_S = 3.0
#: A silent or closed relay with no ranks left is forgotten after this long.
FORGET_AFTER_S = 600.0
#: Most relays tracked at once (a record each; ids come only from admitted peers, still capped).
MAX_RELAYS = 8192
#: Clocks of two hosts drift by well under this (s/s): the offset estimate may grow this fast.
DRIFT = 1e-4
#: Seconds a relay's clock may run ahead of its earlier batches' mapping onto the monitor's (a
#: path that got faster by as much: a backlog drained). A stamp further ahead is refused: one
#: forged stamp (clock 1e15) had made a live relay read silent, 1e15 s behind, for good — unless
#: CLOCK_JUMP_BATCHES batches in a row agree on the new mapping within CLOCK_JUMP_AGREE_S: the
#: monitor's clock leaves out its own pauses (SIGSTOP, a laptop's suspend), the relay's does not.
MAX_CLOCK_LEAD_S = 120.0
CLOCK_JUMP_BATCHES = 3
CLOCK_JUMP_AGREE_S = 5.0
#: A stamp larger than this is refused (ages of at most a few thousand frames).
MAX_STAMP_BYTES = 64 * 1024
#: The longest a relay may say it held a frame (µs).
MAX_AGE_US = 10**12
STAMP_KIND = "stamp"
_NO_REASONS: tuple[float, dict[str, RelayCut]] = (math.nan, {})  # Relays._reasons not worked out yet


@dataclass(frozen=True)
class Stamp:
    """The first part of a relay's batch: who sent it, its clock, each frame's hold time."""

    relay: str
    clock: float  # relay monotonic seconds when the batch was sent
    ages_us: tuple[int, ...]  # per frame: relay send time - relay receive time, µs


def encode_stamp(relay: str, clock: float, ages_us: list[int], pack: Callable[[Any], bytes] = msgpack.packb) -> bytes:
    """The stamp part of a batch (the relay's side). ``pack``: a relay's own msgpack.Packer().pack
    (the same bytes as packb, which makes a Packer, and its 1 MiB buffer, at every call)."""
    return pack({"k": STAMP_KIND, "r": relay, "c": clock, "a": ages_us})


_VIEW = Fields(RankSnapshot)
_STATUS, _CUT, _TOKENS, _FLOPS = _VIEW.at("status", "cut", "tokens_per_s", "flops")
_RELAY = Fields(RelaySnapshot)  # a relay row's copy (Relays.snapshot)
_R_STATUS, _R_AGE, _R_RANKS, _R_BATCHES, _R_LAG = _RELAY.at("status", "age_s", "ranks", "batches", "link_lag_s")


def _stale(view: RankSnapshot, cut: RelayCut) -> RankSnapshot:
    """``view`` as a rank behind an unreachable relay shows: stale, cut off and why, its rates
    n/a (accounting.unheard: it may train on, unheard; 0 had read as a stop and pulled the job's
    figures down), its step and counts as last heard (positionally: dataclasses.replace builds
    keyword arguments)."""
    values = list(_VIEW.read(view))
    values[_STATUS], values[_CUT], values[_TOKENS] = "stale", cut, None
    if view.flops is not None:
        values[_FLOPS] = accounting.unheard(view.flops, cut.unheard)
    return RankSnapshot(*values)


@dataclass(frozen=True)
class _Marked:
    """A rank's view marked for its relay's silence, and what it was made from."""

    view: RankSnapshot  # the rank's own view
    cut: RelayCut
    marked: RankSnapshot  # what the snapshot shows


def decode_stamp(part: bytes, frames: int) -> Stamp:
    """Validate a batch's stamp for ``frames`` frames; raise :class:`WireError` with a reason."""
    relay, clock, ages = _stamp_fields(part, frames)
    return Stamp(relay, clock, tuple(ages))


def _stamp_fields(part: bytes, frames: int) -> tuple[str, float, list[int]]:
    """:func:`decode_stamp`'s checks, its fields as a plain tuple: every relayed batch comes
    through here (a frame or two each at 4,096 ranks), where a frozen dataclass's construction, a
    generator over the ages and msgpack's keyword arguments (the defaults since msgpack 1.0,
    pyproject's floor) cost more than the checks (bench/frame_path.py, callgrind)."""
    if len(part) > MAX_STAMP_BYTES:
        raise WireError(f"relay stamp of {len(part)} bytes exceeds {MAX_STAMP_BYTES}")
    try:
        obj = msgpack.unpackb(part)
    except Exception as exc:
        raise WireError(f"relay stamp: not msgpack: {type(exc).__name__}") from None
    # unpackb makes exact dicts, lists, strs and ints (a bool is not an int here: type(), not isinstance)
    if type(obj) is not dict or obj.get("k") != STAMP_KIND:
        raise WireError("multi-part message without a relay stamp first")
    relay, clock, ages = obj.get("r"), obj.get("c"), obj.get("a")
    if not (type(relay) is str and 0 < len(relay) <= 300 and relay.isprintable()):
        raise WireError("relay stamp: bad relay id")
    if (type(clock) is not float and type(clock) is not int) or not math.isfinite(clock) or clock < 0:
        raise WireError("relay stamp: bad clock")
    if type(ages) is not list or len(ages) != frames:
        raise WireError(f"relay stamp: {len(ages) if type(ages) is list else 'no'} ages for {frames} frames")
    for a in ages:
        if type(a) is not int or not 0 <= a <= MAX_AGE_US:
            raise WireError("relay stamp: bad age")
    return relay, float(clock), ages


def flooded_text(host: str, dropped: int) -> str:
    """What the monitor says once of a relay whose report says it dropped commands unread."""
    return (f"the relay on {host} dropped {dropped:,} commands unread: more came from its upstream than a "
            f"monitor sends (a relay takes {bound_text()}, as a probe does); something else sent them, a "
            "process on this monitor's port before it started? (the relay's stderr says when)")


class _Relay:
    """Mutable per-relay state; only :class:`Relays` touches it."""

    def __init__(self, relay: str, now: float) -> None:
        self.relay = relay
        host, _, rest = relay.rpartition(":")
        host, _, pid = host.rpartition(":")
        self.host = host or relay
        self.pid = int(pid) if pid.isdigit() else 0
        self.heard = now
        self.report: dict[str, Any] = {}
        self.closed_at: float | None = None
        self.offset: float | None = None  # monitor clock - relay clock, least-queued path
        self.offset_at = now
        self.lag = 0.0
        self.last_t = -math.inf  # latest frame time handed out (monotonic per relay)
        self.batches = 0
        self.jump: tuple[float, int] | None = None  # a refused mapping (offset) and batches agreeing on it
        self.shown: tuple[dict[str, Any], RelaySnapshot] | None = None  # its last row and the report it read


class Relays:
    """All relays heard of, and which relay each rank's latest frame came through."""

    def __init__(self) -> None:
        self._relays: dict[str, _Relay] = {}
        self._via: dict[RankKey, str] = {}
        #: key -> the rank's view marked for its relay's silence: see :meth:`mark`.
        self._marked: dict[RankKey, _Marked] = {}
        self._reasons_at: tuple[float, dict[str, RelayCut]] = _NO_REASONS  # see _reasons
        self._pruned_at = -math.inf
        #: Relay ids refused at :data:`MAX_RELAYS`.
        self.refused = 0

    def _get(self, relay: str, now: float) -> _Relay:
        rec = self._relays.get(relay)
        if rec is None:
            if len(self._relays) >= MAX_RELAYS and not self._make_room(now):
                self.refused += 1
                raise WireError("relay refused: the monitor's relay limit is reached")
            rec = self._relays[relay] = _Relay(relay, now)
        return rec

    def unstamp(self, parts: list[bytes], now: float, taken: float | None = None) -> tuple[str, list[float]]:
        """A batch ``[stamp, frame...]`` received at ``now``: the relay id and each frame's
        receive time on the monitor clock. Raises :class:`WireError` for a bad stamp.

        ``taken``: the monitor clock when the batch was taken off the socket, when it is later
        than ``now``. The collector applies a drain's frames at the drain's start, and a drain
        lasts as long as the tick before it: a batch taken 1.5 s into a drain after the long ticks
        of a 4,096-rank warm-up read as a path 1.5 s shorter than any, the least-delayed path
        kept that for hours (DRIFT), and every later batch of that relay looked 1.5 s behind (the
        UI was then handed one snapshot a second). The path and the lag are measured on ``taken``."""
        return self.stamp_times(parts[0], len(parts) - 1, now, taken)

    def stamp_times(self, raw: bytes, frames: int, now: float, taken: float | None = None) -> tuple[str, list[float]]:
        """:meth:`unstamp` of a batch's stamp ``raw`` and its number of ``frames`` (a replay has
        the stamp's record before the frames, flowtop.monitor.relayrecord)."""
        relay, clock, ages = _stamp_fields(raw, frames)
        rec = self._get(relay, now)
        # min and max written out here and below (the same values: the builtins parse keywords at
        # each call, ~0.7 k instructions each, as in Model.ingest)
        observed = (taken if taken is not None and taken > now else now) - clock
        if rec.offset is not None and observed < rec.offset - MAX_CLOCK_LEAD_S and not self._jumped(rec, observed):
            raise WireError(f"relay stamp: clock {rec.offset - observed:.0f} s ahead of its relay's earlier "
                            "batches (forged or corrupt; a monitor paused that long: its relay's next "
                            "batches are taken once they agree)")
        rec.jump = None
        if rec.offset is None:
            rec.offset = observed
        else:
            # The minimum tracks the least-delayed path; allowed to creep up by the drift bound,
            # so a clock that runs slow does not pin the estimate forever.
            since = now - rec.offset_at
            crept = rec.offset + DRIFT * (since if since > 0.0 else 0.0)
            rec.offset = observed if observed < crept else crept
        rec.offset_at = now
        rec.lag = observed - rec.offset
        rec.heard = now
        self._reasons_at = _NO_REASONS  # a relay heard again: worked out afresh
        rec.batches += 1
        base = clock + rec.offset
        times = []
        last_t = rec.last_t
        for age in ages:
            # Never in the future, never before an earlier frame of the same relay.
            t = base - age * 1e-6
            t = t if t > last_t else last_t
            last_t = t if t < now else now
            times.append(last_t)
        rec.last_t = last_t
        return relay, times

    @staticmethod
    def _jumped(rec: _Relay, observed: float) -> bool:
        """Whether ``observed`` (a mapping far from the relay's) is the CLOCK_JUMP_BATCHES-th in a
        row to agree on a new one: then the relay's clock did run on (the monitor paused), and the
        relay's mapping starts over from it."""
        jump = rec.jump
        if jump is not None and abs(observed - jump[0]) <= CLOCK_JUMP_AGREE_S:
            jump = rec.jump = (jump[0], jump[1] + 1)
        else:
            jump = rec.jump = (observed, 1)
        if jump[1] < CLOCK_JUMP_BATCHES:
            return False
        rec.offset = None  # taken afresh from this batch
        return True

    def report(self, msg: Message, now: float) -> int:
        """A relay's own figures (wire kind ``relay``); the commands it dropped so far (a flood:
        the model says the first of each relay, see :func:`flooded_text`)."""
        f = msg.fields
        rec = self._get(str(f["relay"]), now)
        rec.heard = now
        rec.report = deep(dict(f))  # remote text reaches terminals: no control sequences
        if f.get("closing"):
            rec.closed_at = now
        self._reasons_at = _NO_REASONS
        self.prune(now)
        return int(f.get("commands_dropped", 0))

    def saw(self, key: RankKey, relay: str | None) -> None:
        """A frame of ``key`` arrived through ``relay`` (None: directly)."""
        if relay is None:
            if self._via:
                self._via.pop(key, None)
        elif self._via.get(key) != relay:
            self._via[key] = relay

    def lag_of(self, relay: str | None) -> float:
        """Seconds ``relay``'s latest batch waited in queues beyond the least-queued one (0 for
        None: a rank heard directly): its ranks' frames count when it got them, so a rank whose
        frames wait behind a backlog looks silent for that long while it still sends."""
        rec = self._relays.get(relay) if relay is not None else None
        return rec.lag if rec is not None else 0.0

    def behind(self, now: float) -> float:
        """Seconds the live relays' latest batches waited in queues, the median relay's (0 with
        none): how far the monitor, not one congested link, has fallen behind its ranks."""
        lags = sorted(r.lag for r in self._relays.values() if self._status(r, now) == "live")
        return lags[len(lags) // 2] if lags else 0.0

    def forget(self, key: RankKey) -> None:
        """The model forgot ``key``."""
        self._via.pop(key, None)
        self._marked.pop(key, None)

    def _status(self, rec: _Relay, now: float) -> str:
        if rec.closed_at is not None and rec.heard <= rec.closed_at:
            return "closed"
        return "silent" if now - rec.heard > SILENT_AFTER_S else "live"

    def _why(self, rec: _Relay, now: float) -> RelayCut | None:
        """Why the ranks behind ``rec`` are unreachable (None when they are not): a silent relay,
        or a closed one that they have not left within :data:`HANDOFF_S`. Since when, not for how
        long: the same record while the relay stays silent (said at display, RelayCut.text)."""
        status = self._status(rec, now)
        if status == "silent":
            return RelayCut(rec.host, rec.heard)
        if status == "closed" and rec.closed_at is not None and now - rec.closed_at > HANDOFF_S:
            return RelayCut(rec.host, None)
        return None

    def cut_of(self, relay: str | None, now: float) -> RelayCut | None:
        """Why the ranks behind ``relay`` are marked unreachable at ``now`` (None: they are not; see
        :meth:`mark`)."""
        return self._reasons(now).get(relay) if relay is not None else None

    def _reasons(self, now: float) -> dict[str, RelayCut]:
        """Relay id -> why its ranks are unreachable, for the relays with a reason (once per tick,
        not once per rank: a tick of a 4,096-rank job asked 4,096 times)."""
        if self._reasons_at[0] != now:
            self._reasons_at = (now, {r.relay: why for r in self._relays.values()
                                     if (why := self._why(r, now)) is not None})
        return self._reasons_at[1]

    def _make_room(self, now: float) -> bool:
        """Forget the longest-silent relay that is not live and has no ranks."""
        used = set(self._via.values())
        idle = [r for r in self._relays.values() if r.relay not in used and self._status(r, now) != "live"]
        if not idle:
            return False
        del self._relays[min(idle, key=lambda r: r.heard).relay]
        return True

    def mark(self, ranks: tuple[Any, ...], states: list[Any], now: float) -> tuple[Any, ...]:
        """The job's rank views (``RankSnapshot``, one per ``RankState`` in ``states``; each names
        its relay already, RankState.via) with, behind a relay that is silent or closed, status
        "stale" with its reason (a RelayCut) and its rates n/a (unheard, see :func:`_stale`). A
        marked view is reused while its base view and reason stay the same (a silent relay's from tick to tick: since
        when it is silent), so a rank whose view did not change keeps the same object
        (flowtop.monitor.rankviews)."""
        reasons = self._reasons(now) if self._relays else {}
        if not reasons and not self._marked:
            return ranks
        # Only the ranks behind a cut relay, and those marked before, are looked at one by one
        # (a silent node's 8 of 4,096 ranks: the others' views pass as they are).
        behind_cut = [i for i, view in enumerate(ranks) if view.relay in reasons]
        was_marked = [i for i, st in enumerate(states) if st.key in self._marked] if self._marked else []
        if not behind_cut and not was_marked:
            return ranks
        out = list(ranks)
        still: set[RankKey] = set()
        for i in behind_cut:
            view, st = ranks[i], states[i]
            if st.bye is None:  # a rank that said bye is never cut off
                out[i] = self._marked_view(st.key, view, reasons[view.relay])
                still.add(st.key)
        for i in was_marked:
            if states[i].key not in still:
                del self._marked[states[i].key]
        return tuple(out)

    def _marked_view(self, key: RankKey, view: RankSnapshot, cut: RelayCut) -> RankSnapshot:
        held = self._marked.get(key)
        if held is not None and held.view is view and held.cut == cut:
            return held.marked
        marked = _stale(view, cut)
        self._marked[key] = _Marked(view, cut, marked)
        return marked

    def prune(self, now: float) -> None:
        """Forget relays silent or closed for FORGET_AFTER_S with no ranks (at most every 10 s; at a
        relay's report and at the model's ticks: with no relay left reporting, closed ones stayed for
        good, a soak trial's 11 relays 20 minutes after the last job)."""
        if now - self._pruned_at < 10.0:
            return
        self._pruned_at = now
        used = set(self._via.values())
        for rec in list(self._relays.values()):
            if rec.relay not in used and now - rec.heard > FORGET_AFTER_S:
                del self._relays[rec.relay]

    def _row(self, rec: _Relay, now: float, ranks: int) -> RelaySnapshot:
        """The relay's row at ``now``, its figures read from its latest report."""
        f = rec.report

        def n(name: str) -> int:
            v = f.get(name, 0)
            return int(v) if isinstance(v, int) else 0

        return RelaySnapshot(
            relay=rec.relay, host=rec.host, pid=rec.pid, status=self._status(rec, now), age_s=now - rec.heard,
            listen=f.get("listen"), upstream=f.get("upstream"), hosted_by=f.get("hosted_by"),
            ranks_connected=n("ranks"), ranks=ranks, frames_in=n("frames_in"),
            frames_out=n("frames_out"), bytes_in=n("bytes_in"), bytes_out=n("bytes_out"), drops=n("drops"),
            queued=n("queued"), commands=n("commands"), commands_dropped=n("commands_dropped"),
            link_ups=n("link_ups"), uptime_s=float(f["uptime_s"]) if "uptime_s" in f else None, batches=rec.batches,
            link_lag_s=rec.lag,
        )  # fmt: skip

    def snapshot(self, now: float) -> tuple[RelaySnapshot, ...]:
        """Every relay, by host then id. Nothing a reader sees changes; it keeps each relay's last
        row, copied while its report is the same object."""
        behind = collections.Counter(self._via.values())
        out = []
        for rec in sorted(self._relays.values(), key=lambda r: (r.host, r.relay)):
            held = rec.shown
            if held is not None and held[0] is rec.report:
                # Its report's figures as in its last row (read once a report, not once a tick),
                # the clock's and the batches' anew: positionally, through its slots.
                values = list(_RELAY.read(held[1]))
                values[_R_STATUS], values[_R_AGE] = self._status(rec, now), now - rec.heard
                values[_R_RANKS], values[_R_BATCHES], values[_R_LAG] = behind[rec.relay], rec.batches, rec.lag
                row = RelaySnapshot(*values)
            else:
                row = self._row(rec, now, behind[rec.relay])
            rec.shown = (rec.report, row)
            out.append(row)
        return tuple(out)
