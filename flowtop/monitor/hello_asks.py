"""When the monitor asks ranks it forgot for their hello and FLOP count again. No Textual.

A probe sends its hello first whenever a monitor (re)appears on its connection, and its latest FLOP
count right after it; otherwise a count goes once, when counted (and at each re-count,
FLOWTOP_RECHECK_STEPS steps apart), and the hello every 10-30 s while steps flow. A monitor that
forgot a rank while the connection stayed up got neither: it evicted the job because every rank of
it was silent for EVICT_AFTER_S (all stopped with SIGSTOP, a partition), or it restarted behind a
relay quicker than the relay looked upstream. The rank's frames then came back without its device
and world size (the hello) and without a FLOP count: no MFU until the next re-count, up to 500
steps. The probe cannot tell, so the monitor asks ("hello_now", wire 1.4): a rank it first hears
from by anything but a starting rank's hello (one that says no step yet) is noted
(:meth:`HelloAsks.note`, once per new rank: nothing per frame), and asked if its hello or count is
still missing ASK_GRACE_S later (a probe that saw the monitor appear sends both itself). One
command for the job, every rank of which resends (two frames each, once); again after ASK_AGAIN_S
while one still lacks its hello, ASK_TRIES times at most (an older probe refuses the command and
sends its hello within 10-30 s anyway), but once only for a rank whose hello is there and whose
count is not: a probe sends its count with the hello it was asked for, so it has none (FLOP
counting off, or not counted yet: the count then comes when counted; a monitor started beside
thousands of such ranks asks each job once). A job's ranks are asked by a command for that job
while the bucket holds a token for each waiting job (else one command for every job). All of it
within the monitor's share of the wire's command bound (probe.wire.command_bound: HELLO_ASKS_BURST,
HELLO_ASKS_RATE_PER_S).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

from probe.wire import Message, RankKey
from probe.wire import command_bound as _bound

if TYPE_CHECKING:
    from flowtop.monitor.rankstate import RankState

#: Seconds (monitor clock) a noted rank has to bring its hello and count by itself.
ASK_GRACE_S = 0.5
#: Seconds between two asks for a rank that still lacks them, and how many asks at most.
ASK_AGAIN_S = 5.0
ASK_TRIES = 3
#: Ranks noted at most (a bound whatever floods the monitor with new keys; the caps of
#: flowtop.monitor.limits admit far fewer).
MAX_WAITING = 65_536


#: What a noted rank still lacks: nothing (or it is gone), its FLOP count only, or its hello.
Lack = Literal["nothing", "count", "hello"]


@dataclass(frozen=True)
class HelloAsk:
    """One "hello_now" to send: for ``job`` (None: every job), on behalf of ``ranks`` ranks."""

    job: str | None
    ranks: int


@dataclass
class _Waiting:
    """A noted rank: since when, and its asks so far."""

    since: float
    asks: int = 0
    asked_at: float = -math.inf


def lack_of(st: "RankState | None") -> Lack:
    """What a rank's state still lacks of its hello and FLOP count ("nothing" once gone or ended)."""
    if st is None or st.bye is not None:
        return "nothing"
    # hello_source is () until a hello came (``hello`` holds its defaults until then)
    return "hello" if not st.hello_source else "count" if st.flops is None else "nothing"


class HelloAsks:
    """The ranks the monitor may have to ask, and its bucket for asking (the data loop's)."""

    def __init__(self) -> None:
        self._waiting: dict[RankKey, _Waiting] = {}
        self._tokens = float(_bound.HELLO_ASKS_BURST)
        self._at = -math.inf
        #: Before this monitor time no ask can be due: :meth:`due` runs at every turn of the data
        #: loop, and thousands of ranks may wait at a monitor's start beside running jobs.
        self._next_due = math.inf
        #: Asks sent so far (tests, and what the monitor says of itself).
        self.sent = 0

    def first_heard(self, msg: Message, now: float) -> None:
        """The first frame of a rank new to the model: noted unless it is a starting rank's hello
        (one that says no step yet) or a bye."""
        if msg.kind != "bye" and (msg.kind != "hello" or msg.fields.get("last_step") is not None):
            self.note(msg.key, now)

    def note(self, key: RankKey, now: float) -> None:
        """A rank first heard at monitor time ``now`` by a frame that says it ran before (a step,
        a count, a hello with a last step): maybe one the monitor forgot."""
        if key not in self._waiting and len(self._waiting) < MAX_WAITING:
            self._waiting[key] = _Waiting(now)
            self._next_due = min(self._next_due, now + ASK_GRACE_S)

    def due(self, now: float, lacking: Callable[[RankKey], Lack]) -> HelloAsk | None:
        """The ask to send now, if any (then counted as sent). ``lacking(key)``: what the rank
        still misses ("nothing" too when the model forgot it). One job's ranks an ask while the
        bucket holds a token for each waiting job (the others' next), every job's at once when
        more jobs wait than that: a job whose ranks are all known is not made to resend."""
        if now < self._next_due:
            return None
        ready: dict[str, list[_Waiting]] = {}
        self._next_due = math.inf
        for key, wait in list(self._waiting.items()):
            lack = lacking(key)
            if lack == "nothing" or wait.asks >= (ASK_TRIES if lack == "hello" else 1):
                del self._waiting[key]
                continue
            at = max(wait.since + ASK_GRACE_S, wait.asked_at + ASK_AGAIN_S)
            if now >= at:
                ready.setdefault(key.job, []).append(wait)
            else:
                self._next_due = min(self._next_due, at)
        if not ready:
            return None
        tokens = min(float(_bound.HELLO_ASKS_BURST), self._tokens + (now - self._at) * _bound.HELLO_ASKS_RATE_PER_S)
        self._at = now
        if tokens < 1.0:
            self._tokens = tokens
            self._next_due = min(self._next_due, now + (1.0 - tokens) / _bound.HELLO_ASKS_RATE_PER_S)
            return None
        self._tokens = tokens - 1.0
        job: str | None = next(iter(ready)) if len(ready) <= tokens else None
        asked = ready[job] if job is not None else [w for ws in ready.values() for w in ws]
        for wait in asked:
            wait.asks += 1
            wait.asked_at = now
        # asked again ASK_AGAIN_S on; the other jobs' ranks are due already
        self._next_due = now if len(ready) > 1 and job is not None else min(self._next_due, now + ASK_AGAIN_S)
        self.sent += 1
        return HelloAsk(job, len(asked))
