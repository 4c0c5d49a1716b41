"""The sender's outbox: what the probe's sender thread holds for the monitor, and in what order it
leaves. A part of :class:`probe.transport.sender.SenderLoop`, whose round calls these steps.

The training thread's queue is taken into the pending messages, step records through the open
batch (probe.transport.rounds.Round); the hello goes first when due (the rank's heartbeat), the
latest FLOP count right after it for a monitor that (re)appeared; a key switch says bye under the
old key; what waited longer than ``max_age_s`` is dropped and counted (see the socket choices in
probe.transport.sender); then the sends, NOBLOCK, until the high-water mark refuses one.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Deque, Iterable, NamedTuple, cast

from probe import wire
from probe.wire.pace import MAX_PACED_TICK_S, paced_interval
from probe._log import warn_once
from probe.transport.rounds import REKEY as _REKEY, Item, Round
from probe.transport.steprows import ROW_LEN, Queued, StepRow, TrainingQueue


def _weight(kind: str, fields: dict[str, Any]) -> int:
    """Messages one pending entry stands for (a batch: its step records), for drop counts."""
    return len(fields["records"]) if kind == "steps" else (0 if kind == _REKEY else 1)


def weights(items: Iterable[Item]) -> int:
    """Messages the pending entries stand for (see _weight)."""
    return sum(_weight(kind, fields) for kind, _, _, fields in items)


#: The hello is the rank's heartbeat: it goes every HELLO_S while nothing else says the rank lives
#: (before its first step, hung in a collective, in a step longer than STEPS_ALIVE_S). While its
#: step frames leave (every flush, at most wire.MAX_PACE_S apart when paced) they keep it heard, and
#: the hello goes every HELLO_MAX_S only (paced: longer, see hello_max_s), for a monitor that
#: restarted unseen (a flap quicker than a relay's look upstream; a monitor
#: this socket sees (re)appear gets one at once). At 4,096 ranks a hello every 2 s was a third of
#: the frames a monitor read.
HELLO_S = 2.0
HELLO_MAX_S = 10.0
#: ... stretched by the monitor's pace (pace ÷ flush_s) up to this: a monitor that paces hears
#: thousands of ranks (4,096 at the 2 s pace: a hello every 10 s was 410 frames a second, a tenth
#: of what it read), and one that restarts is seen (re)appearing through the relay anyway.
HELLO_PACED_MAX_S = 30.0
STEPS_ALIVE_S = 2.5


class Pace(NamedTuple):
    """The monitor's last "pace" command as the probe keeps it: step records wait up to
    ``flush_s`` (never less than the probe's own flush_s) until the monotonic ``until``
    (wire.PACE_TTL_S after it came), and a paced periodic job stretches to ``tick_max_s`` at most
    (its telemetry_max_s; MAX_PACED_TICK_S when it did not say). All of it lapses together."""

    flush_s: float = 0.0
    until: float = 0.0
    tick_max_s: float = MAX_PACED_TICK_S

    def holds(self) -> bool:
        return time.monotonic() < self.until


class Outbox:
    """The steps of a round that fill and empty the pending messages (a base of
    :class:`probe.transport.sender.SenderLoop`; ``Publisher.__init__`` sets the attributes declared
    here)."""

    # No slots of its own: see SenderLoop.
    if not TYPE_CHECKING:
        __slots__ = ()

    if TYPE_CHECKING:
        key: wire.RankKey
        max_age_s: float
        flush_s: float
        _pace: Pace
        _queue: TrainingQueue
        _popped: int
        _sent: int
        _send_drops: int
        _seq: int

        #: (last step, seconds since its boundary) for the hello, read when one is built (see
        #: hello_now); None: the hello says neither.
        step_state: Callable[[], tuple[int, float] | None] | None

        @property
        def hello_fields(self) -> dict[str, Any] | None: ...

        @property
        def drops(self) -> int: ...

        def current_flush_s(self) -> float: ...

    def _take(self, r: "Round", stopping: bool, now: float) -> int:
        """Move the training thread's queue to the pending messages, step records through the
        open batch: closed when due (see Round.batch_at), when it is full, and before any other
        message (order is kept: a count or a bye never overtakes the steps before it). Returns
        the step records taken."""
        pending, batch = r.pending, r.batch
        steps, newest = 0, 0.0  # newest: a wall time, as publish() stamps it
        flush = self.current_flush_s()
        close = partial(r.close_batch, flush)
        while True:
            try:
                entry = self._queue.popleft()
            except IndexError:
                break
            self._popped += 1
            # The tracker's common step is a row (probe.transport.steprows), told by its length
            # (mypy does not narrow a union of tuples by it: hence the casts).
            item = r.clock.queued(cast(StepRow, entry)) if len(entry) == ROW_LEN else cast(Queued, entry)
            if item[0] == "step":
                if batch:
                    batch.append(item)
                else:
                    r.open_batch(item)  # its time on the sender's clock
                steps, newest = steps + 1, item[1]
                if len(batch) >= wire.MAX_BATCH:
                    close()
            else:
                close()
                pending.append(r.clock.item(item))
                if item[0] == "flops":
                    r.flops = item[2]
        if steps:
            r.stepped(steps, newest)
        if batch and (stopping or now >= r.batch_at(flush)):
            close()
        return steps

    def _queue_hello(self, r: "Round", now: float) -> None:
        """The hello goes first when it is due (see HELLO_S), or changed."""
        if self.hello_fields is not r.last_hello:
            r.next_hello = r.hello_at = -math.inf
            r.last_hello = self.hello_fields
        if not (r.listening and self.hello_fields is not None and now >= r.next_hello) or r.said_bye:
            return
        longest = self.hello_max_s()
        if now - r.steps_at >= STEPS_ALIVE_S or now - r.hello_at >= longest:
            r.pending.appendleft(("hello", now, r.clock.wall(now), self.hello_now()))
            r.hello_at, r.next_hello = now, now + HELLO_S
        else:  # looked at again when the steps would have to stop, or the longest gap ends
            r.next_hello = min(r.steps_at + STEPS_ALIVE_S, r.hello_at + longest)

    def hello_now(self) -> dict[str, Any]:
        """The hello as it leaves now: its fields and, once the rank has stepped, its last step and
        the seconds since that boundary (``last_step``, ``step_age_s``), so that a monitor that
        first hears the rank while it hangs knows for how long (one call every HELLO_S at most,
        on the sender thread: nothing on the training thread's path)."""
        fields = self.hello_fields
        assert fields is not None
        state = None
        if self.step_state is not None:
            try:
                state = self.step_state()
            except Exception as exc:  # noqa: BLE001 - the hello goes without them
                warn_once("hello-step", f"the hello's step is unavailable: {exc}")
        if state is None:
            return fields
        return {**fields, "last_step": state[0], "step_age_s": round(state[1], 3)}

    def hello_max_s(self) -> float:
        """The longest gap between two hellos while step frames leave: HELLO_MAX_S, stretched by
        a monitor's pace while one holds (not by the probe's own start pace: the monitor it would
        reach may be one that restarted unseen), as telemetry is, up to HELLO_PACED_MAX_S."""
        pace = self._pace
        if not pace.holds():
            return HELLO_MAX_S
        return paced_interval(HELLO_MAX_S, self.flush_s, max(self.flush_s, pace.flush_s), HELLO_PACED_MAX_S)

    def _resend_count(self, r: "Round", now: float) -> None:
        """After a monitor (re)appeared: the latest FLOP count again, right after the hello (a
        count is sent once, when counted) — unless one is still pending (it goes anyway) or a bye
        is pending or said (nothing of the rank after it)."""
        if not r.resend_count or r.flops is None:
            return
        r.resend_count = False
        if r.said_bye or any(kind in ("flops", "bye") for kind, _, _, _ in r.pending):
            return
        at = 1 if r.pending and r.pending[0][0] == "hello" else 0
        r.pending.insert(at, ("flops", now, r.clock.wall(now), r.flops))

    def _send(self, zmq: Any, sock: Any, r: "Round", now: float) -> bool:
        """Send what is pending while a monitor listens; False when the high-water mark stopped it."""
        pending = r.pending
        while pending and (r.listening or pending[0][0] == _REKEY):
            kind, at, t, fields = pending[0]  # t: the wall time, for the wire
            if kind == _REKEY:
                pending.popleft()
                self._switch_key(zmq, sock, fields, t, r.listening)
                if r.listening and self.hello_fields is not None:
                    pending.appendleft(("hello", at, t, self.hello_now()))  # the new key's hello
                    r.resend_count = True  # then its FLOP count (the count holds, the key changed)
                    self._resend_count(r, now)
                continue
            if kind == "steps":  # step records leave as columns (wire MINOR 3, probe.wire.steps)
                frame = wire.encode_steps(self.key, self._seq, t, fields["records"], self.drops)
            else:
                frame = wire.encode(kind, self.key, self._seq, t,
                                    dict(fields, drops=self.drops) if kind == "step" else fields)
            if len(frame) > wire.MAX_FRAME_BYTES and kind == "steps":
                pending.popleft()  # too big together: one by one, so only an oversized record is lost
                pending.extendleft(reversed([("step", at, t, dict(rec)) for rec in fields["records"]]))
                continue
            if len(frame) > wire.MAX_FRAME_BYTES:
                # The monitor's MAXMSGSIZE would drop the whole connection for this one.
                warn_once(f"oversize:{kind}",
                          f"dropping a {kind} message of {len(frame)} bytes (limit {wire.MAX_FRAME_BYTES})")
                pending.popleft()
                self._send_drops += _weight(kind, fields)
                continue
            try:
                sock.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                return False  # high-water mark reached (XPUB_NODROP): tried again (see RETRY_S)
            pending.popleft()
            self._seq += 1
            self._sent += 1
            if kind == "steps" or kind == "step":
                r.steps_at = now
            elif kind == "bye":
                r.said_bye = True  # no hello after it: the rank would look alive again
        return True

    def _switch_key(self, zmq: Any, sock: Any, fields: dict[str, Any], t: float, listening: bool) -> None:
        """Say bye under the old key (if a monitor listens), then speak under the new one."""
        if listening:
            bye = {"reason": str(fields["why"])[:256], "steps": 0, "drops": self.drops}
            try:
                sock.send(wire.encode("bye", self.key, self._seq, t, bye), zmq.NOBLOCK)
            except zmq.Again:
                pass  # the old key then just goes stale
        self.key = fields["key"]
        self._seq = 0

    def _expire(self, pending: Deque[Item], now: float) -> None:
        """Drop (and count) what waited longer than ``max_age_s``, wherever it sits (a key
        switch is never dropped: what follows it must go out under the new key). Ages leave out
        the process's pauses (Round.begin moved what was held across one)."""
        if pending and now - min(item[1] for item in pending) > self.max_age_s:
            fresh = [item for item in pending if now - item[1] <= self.max_age_s or item[0] == _REKEY]
            self._send_drops += weights(pending) - weights(fresh)
            pending.clear()
            pending.extend(fresh)

