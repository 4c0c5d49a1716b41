"""What the model says to the user of what came in, for flowtop.monitor.model: refused frames, a
job's first failed rank, a rank or relay flooded with commands, a refused kernel window. No Textual.

A base of :class:`flowtop.monitor.model.Model` (above :class:`~flowtop.monitor.model_tick.ModelTicks`),
not a separate object: the ingest path reaches these methods through ``self`` exactly as when they
were written in one class (no extra call layer). Its state is set by ``Model.__init__``.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from typing import TypeVar

from flowtop.monitor.model_tick import ModelTicks
from flowtop.monitor.notices import Notices
from flowtop.monitor.rankstate import RankState
from flowtop.monitor.snapshot import ENDED, INTERRUPTED, JobSnapshot, MonitorSnapshot, RankSnapshot, ending_order, \
    ending_time, first_ending
from probe.wire.command_bound import bound_text

#: Jobs (and incarnations) remembered as having had a failed rank said (ModelNotices._say_failures),
#: beyond which it forgets them all.
MAX_FAILED_JOBS = 1024
#: Seconds after a job's first failed bye was received before its notice is said (at the first tick
#: past them): the byes sent before it that arrive after it (a scancelled node's "SIGTERM" queued
#: behind its step frames, a relay's next batch) come in within them, so the notice names the
#: job's first ending, as its status will, not the first failure that happened to arrive.
FAILURE_SETTLE_S = 1.0
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
    _failed_jobs: set[tuple[str, int]]
    _failing: dict[tuple[str, int], _Failing]
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
        """A rank of a job ended failing: the job's notice is due FAILURE_SETTLE_S after it came
        (_say_failures). Once per job and incarnation: a job that an elastic restart brought back
        and that fails again is said again (torchrun counts restarts per node agent: at most one
        notice per count a cascade's nodes are at)."""
        key = (st.key.job, st.key.inc)
        if key not in self._failing and key not in self._failed_jobs:
            # when it came: a relayed frame's ``now`` is when its relay got it, maybe a second back
            self._failing[key] = _Failing(max(now, self._now), st.key.rank, st.bye or "")

    def _say_failures(self, jobs: tuple[JobSnapshot, ...], now: float, force: bool = False) -> None:
        """At a tick: say each job whose first failure came FAILURE_SETTLE_S ago, once a job,
        naming its first failed rank by the byes' send times (snapshot.ending_order) and, where a
        signal's stop came before it (a node scancelled, preempted), that stop: the failure is its
        consequence and the job's status follows the stop. The table's status cell has room for
        "failed" only; the ranks that die of the same cause after it (a collective's peers) are
        not said again: thousands of them would flood the UI. Said once per job, at a tick: a
        notice per bye received in reverse order of sending flooded (a reverted attempt)."""
        if not self._failing:
            return
        by_name = {j.job: j for j in jobs}
        # due a second after it came, or once every heard rank of the job ended (the order is
        # final: a headless --until-done stops at that tick), or at once when ``force``d
        due = [key for key, f in self._failing.items() if force or now - f.received_at >= FAILURE_SETTLE_S
               or (key[0] in by_name and by_name[key[0]].status in ENDED)]
        for key in due:
            f = self._failing.pop(key)
            if _first_of(self._failed_jobs, key):
                self.notices.error(_failure_text(key[0], by_name.get(key[0]), f), now)

    def flush_notices(self, last: MonitorSnapshot | None) -> None:
        """Say the failures not said yet, by ``last`` (the latest tick's snapshot): where ticks
        stop (a collection's timeout or signal, a replay's end) before their notice was due."""
        self._say_failures(last.jobs if last is not None else (), self._now, force=True)

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


_T = TypeVar("_T")


def _first_of(said: set[_T], name: _T) -> bool:
    """Whether ``name`` (a job, a relay) is new to ``said`` (then added): one notice per job or
    relay, the set bounded by MAX_FAILED_JOBS (cleared when full: one said long ago may be said again)."""
    if name in said:
        return False
    if len(said) >= MAX_FAILED_JOBS:
        said.clear()
    said.add(name)
    return True


@dataclass(frozen=True, slots=True)
class _Failing:
    """A job's first failed bye received, its notice not said yet (ModelNotices._failed)."""

    received_at: float  # monitor time
    rank: int
    bye: str


def _failure_text(job: str, snap: JobSnapshot | None, f: _Failing) -> str:
    """The notice of a job's failure: its first failed rank by the byes' send times and its
    error, after the signal's stop that came first if one did; the first failure received where
    the job's snapshot does not show it (evicted, or an earlier incarnation's)."""
    ranks = snap.ranks if snap is not None else ()
    failed = min((r for r in ranks if r.status == "failed"), key=ending_order, default=None)
    if failed is None:
        return f"rank {f.rank} of {job} failed: {f.bye}"
    text = f"rank {failed.rank} of {job} failed: {failed.bye_reason}"
    first = first_ending(ranks)
    if first is not None and first.status == "stopped":  # strictly before: a crash wins a tie
        gap = ending_time(failed) - ending_time(first)
        text += (f" ({gap:.2f} s after rank {first.rank} {_stopped_how(first)}, which came first: the failure "
                 "likely follows from it)")
    return text


def _stopped_how(r: RankSnapshot) -> str:
    """"was stopped by SIGTERM", "was interrupted (Ctrl-C)": how a stopped rank ended."""
    return "was interrupted (Ctrl-C)" if r.bye_reason == INTERRUPTED else f"was stopped by {r.bye_reason}"
