"""What the model says to the user of what came in, for flowtop.monitor.model: refused frames, a
job's first failed rank, a rank or relay flooded with commands, a refused kernel window. No Textual.

A base of :class:`flowtop.monitor.model.Model` (above :class:`~flowtop.monitor.model_tick.ModelTicks`),
not a separate object: the ingest path reaches these methods through ``self`` exactly as when they
were written in one class (no extra call layer). Its state is set by ``Model.__init__``.
"""

from __future__ import annotations

import collections
import re

from flowtop.monitor.model_tick import ModelTicks
from flowtop.monitor.notices import Notices
from flowtop.monitor.rankstate import RankState
from probe.wire.command_bound import bound_text

#: Jobs remembered as having had a failed rank said (Model._failed), beyond which it forgets them all.
MAX_FAILED_JOBS = 1024
#: Seconds after a kernel window was asked of a rank within which its refusal is said (its
#: count of refusals alone, e.g. a monitor started late, says nothing).
REFUSAL_NOTICE_S = 30.0
#: Seconds of monitor time between two notices of refused frames: the first refusal is said at
#: once with its reason, later ones at most this often (a hostile flood is counted, not shown).
REJECT_NOTICE_S = 60.0
#: Kinds of refusal counted by name; past them, in one bucket (OTHER_REASONS).
MAX_REASONS = 100
OTHER_REASONS = "other reasons (past 100 kinds)"
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")  # a byte's value, its position: not the kind of refusal


class ModelNotices(ModelTicks):
    """Refusals counted and said, and the notices of what a rank's frames told (see
    flowtop.monitor.model.Model)."""

    # Set by Model.__init__ (see there for what each holds).
    rejected: int
    rejected_reasons: collections.Counter[str]
    _rejects_said: int
    _rejects_said_at: float | None
    _last_reject: str
    _failed_jobs: set[str]
    _flooded_jobs: set[str]
    notices: Notices
    _now: float

    def reject(self, reason: str, where: str = "") -> None:
        """Count a frame that failed validation (reasons are bucketed by kind: their numbers,
        a byte's value or position, are left out, so garbage cannot fill the buckets with one
        kind and leave a later kind of refusal, a wrong key, unnamed). ``where``: its place (a
        recording's record), said in the notice and kept out of the bucket (a replay's buckets
        are the live monitor's)."""
        self.rejected += 1
        bucket = _NUMBERS.sub("#", reason[:200])[:100]  # an exception's text has no bound
        if len(self.rejected_reasons) < MAX_REASONS or bucket in self.rejected_reasons:
            self.rejected_reasons[bucket] += 1
        else:
            self.rejected_reasons[OTHER_REASONS] += 1
        self._last_reject = (where + reason)[:300]  # an exception's text has no bound
        said_at = self._rejects_said_at
        if said_at is None or self._now - said_at >= REJECT_NOTICE_S:
            self._say_rejects()

    def _say_rejects(self) -> None:
        """Say the refusals since the last notice and the latest one's reason: counted alone, a
        corrupt recording or a peer with the wrong keys read only as a growing ``rej`` in the
        header (a new user's trial). At a refusal, or at a tick for those a flood left unsaid."""
        since = self.rejected - self._rejects_said
        what = (f"{since:,} frames since the last notice, the last one" if self._rejects_said_at is not None
                and since > 1 else "a frame")
        self.notices.warning(f"refused {what}: {self._last_reject} ({self.rejected:,} refused in all; `rej` in the "
                             "header counts them, `flowtop snapshot --json` lists the reasons)", self._now)
        self._rejects_said, self._rejects_said_at = self.rejected, self._now

    def _say_unsaid_rejects(self) -> None:
        """At a tick: refusals left unsaid (the flood stopped within REJECT_NOTICE_S of a notice)."""
        said_at = self._rejects_said_at
        if self.rejected > self._rejects_said and said_at is not None and self._now - said_at >= REJECT_NOTICE_S:
            self._say_rejects()

    def _failed(self, st: RankState, now: float) -> None:
        """The first rank of a job to end failing is said, with its exception (the table's status
        cell has room for "failed" only; the ranks that die of it after — a collective's peers —
        are not said again: thousands of them would flood the UI)."""
        job = st.key.job
        if _first_of(self._failed_jobs, job):
            self.notices.error(f"rank {st.key.rank} of {job} failed: {st.bye}", now)

    def _flooded(self, st: RankState, dropped: int, now: float) -> None:
        """A rank's probe dropped commands unread (probe.transport.gate): more came from its
        monitor's side than a monitor sends, so something else sent them. Said for the first rank
        of a job only (a squatter on this port floods every rank that connects to it)."""
        job = st.key.job
        if not _first_of(self._flooded_jobs, job):
            return
        self.notices.warning(f"rank {st.key.rank} of {job} dropped {dropped:,} commands unread: more came from its "
                             f"monitor's side than a monitor sends (its probe takes {bound_text()}); something "
                             "else sent them, a process on this monitor's port before it started? (the rank's stderr "
                             "says when)", now)

    def _refused(self, st: RankState, now: float) -> None:
        """The rank turned down a kernel window asked of it moments ago (its probe's rate limit):
        said, where the UI had said only that it asked (the refusal showed as a count on the
        rank's detail screen, a new user's trial)."""
        self.notices.warning(f"rank {st.key.rank} of {st.key.job} refused the kernel window asked for: it took "
                             "one moments ago and takes a requested one at most every FLOWTOP_KERNELS_REQUEST_S "
                             "(as its probe was started) or its last window's cost over its budget; ask again in a "
                             "few seconds", now)


def _first_of(said: set[str], name: str) -> bool:
    """Whether ``name`` (a job, a relay) is new to ``said`` (then added): one notice per job or
    relay, the set bounded by MAX_FAILED_JOBS (cleared when full: one said long ago may be said again)."""
    if name in said:
        return False
    if len(said) >= MAX_FAILED_JOBS:
        said.clear()
    said.add(name)
    return True
