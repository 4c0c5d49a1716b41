"""What a snapshot holds of node relays: each relay's row, and why a rank behind one is cut off. No Textual.

A rank behind a relay that fell silent (or closed without handing it on) is stale, whatever its
own silence, with the reason "relay HOST silent for N s" (flowtop.monitor.relays decides it).
Made as text at each tick, its seconds made a new view of the rank at every tick, and with it a
new snapshot of a silent job that nothing else of changed (flowtop.monitor.endedjobs could not
keep it). So a view holds the reason as a :class:`RelayCut`: the relay's host and since when it
is silent (monitor clock), said at a snapshot's ``taken_at`` (RankSnapshot.status_reason_at: the
JSON), like a stall (FlopsView.stalled_since) and a hang hint (flowtop.monitor.hintclock). While
the relay stays silent the record is equal from tick to tick, and so is the view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from flowtop.monitor.records import fast_init


@dataclass(frozen=True, slots=True)
class RelayCut:
    """Why a rank behind a relay counts as stale though it may still run: its relay on ``host``
    is silent since ``silent_since`` (monitor time it was last heard), or closed (``None``) and the
    rank did not come back through another within the hand-over time."""

    host: str
    silent_since: float | None  # None: the relay closed

    @property
    def cause(self) -> str:
        """The reason without its growing seconds: "relay HOST silent", "relay HOST closed"."""
        return f"relay {self.host} {'closed' if self.silent_since is None else 'silent'}"

    @property
    def unheard(self) -> str:
        """What a cut rank's ``mfu_reason`` says: it is not heard, not known to have stopped (its
        rates are n/a, and the job's figures leave it out: flowtop.monitor.model_views)."""
        return f"unheard behind relay {self.host} ({'closed' if self.silent_since is None else 'silent'})"

    def text(self, now: float) -> str:
        """The reason at monitor time ``now``: "relay HOST silent for N s", "relay HOST closed"."""
        if self.silent_since is None:
            return self.cause
        return f"{self.cause} for {now - self.silent_since:.0f} s"


def unheard_hosts(cuts: Sequence[RelayCut | None]) -> tuple[str, ...]:
    """The hosts of the relays that ranks are cut off behind (``cuts``: each rank's
    RankSnapshot.cut), sorted: a job's ``unheard_relays``."""
    return tuple(sorted({c.host for c in cuts if c is not None}))


def over_phrase(cuts: Sequence[RelayCut | None], left_out: int = 0) -> str:
    """What a job's figures are over when some of its ranks are unheard (``cuts``: each rank's
    RankSnapshot.cut; ``left_out``: heard ranks left out with their data-parallel replica, which
    has an unheard rank: flowtop.monitor.parallelism.whole_replicas): "over 4 of 6 ranks; 2
    unheard behind relay node1" (the header, the text report, the job's ``mfu_reason``); "no rank
    heard; ..." when none is counted; "" when every rank is heard. The one place it is made."""
    hosts = unheard_hosts(cuts)
    if not hosts:
        return ""
    n = sum(1 for c in cuts if c is not None)
    tail = f"{n} unheard behind relay{'s' if len(hosts) > 1 else ''} {', '.join(hosts)}"
    if left_out:
        tail += f", {left_out} more left out with {'its' if n == 1 else 'their'} data-parallel replica"
    counted = len(cuts) - n - left_out
    if counted <= 0:  # "over 0 of 1 ranks" read as a figure over nothing
        return f"no {'whole replica' if left_out else 'rank'} heard; {tail}"
    return f"over {counted} of {len(cuts)} ranks; {tail}"


#: ``mfu_reason`` of a rank (or job) with no FLOP count.
NO_COUNT_REASON = "no FLOP count yet"


def no_count_reason(cuts: Sequence[RelayCut | None], left_out: int = 0) -> str:
    """A job's ``mfu_reason`` when it has no FLOP figures (arguments as :func:`over_phrase`): the
    over phrase alone when no rank is counted (not "no FLOP count yet": there may be one, unheard),
    else "no FLOP count yet", with the over phrase when some ranks are unheard."""
    over = over_phrase(cuts, left_out)
    if not over:
        return NO_COUNT_REASON
    counted = len(cuts) - sum(1 for c in cuts if c is not None) - left_out
    return f"{NO_COUNT_REASON}; {over}" if counted > 0 else over


@fast_init  # one a relay at every tick: 512 of them at 4,096 ranks
@dataclass(frozen=True, slots=True)
class RelaySnapshot:
    """One relay as the monitor sees it now (figures from its latest report)."""

    relay: str  # id: host:pid:nonce
    host: str
    pid: int
    status: str  # "live" | "silent" (no batch or report for SILENT_AFTER_S) | "closed"
    age_s: float  # since the monitor last heard from it
    listen: str | None  # where its ranks connect (None before its first report)
    upstream: str | None
    hosted_by: str | None  # "flowtop relay" | "flowtop run"
    ranks_connected: int  # rank connections it reports
    ranks: int  # ranks whose latest frame came through it
    frames_in: int
    frames_out: int
    bytes_in: int
    bytes_out: int
    drops: int  # frames the relay dropped (upstream away past the age limit, queue full)
    queued: int
    commands: int  # monitor commands it carried down
    commands_dropped: int  # commands over the wire's bound, dropped unread (a flood from a port squatter)
    link_ups: int  # upstream connections it made (1 + reconnects)
    uptime_s: float | None
    batches: int  # batches received here
    #: How much later than its best-seen path its latest batch arrived (upstream link lag), s.
    link_lag_s: float

