"""The probe sender's rounds: what it keeps between them and when the next one is due.

A round reads the link (when a socket woke it), runs the periodic jobs that are due, takes the
training thread's queue, closes the step batch when due and sends; then the sender sleeps until
the next thing is due (probe.transport.sender: SenderLoop._wait_s). The rules of those due
times that are the sender's own state live here, and its clocks (:class:`SenderClock`).
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any, Callable, Deque

from probe.wire.pace import batch_due
from probe.transport.steprows import Queued as Queued, StepRow, step_fields

#: Queue marker (never sent): frames after it go out under a new rank key.
REKEY = "_rekey"
#: The shortest sleep of the sender (the longest: outbox.HELLO_MAX_S).
MIN_WAIT_S = 0.001
#: A send refused at the high-water mark is tried again after this long, twice as long after each
#: refusal in a row up to RETRY_MAX_S (a monitor that stopped reading: each try encodes a frame).
RETRY_S = 0.05
RETRY_MAX_S = 1.0
#: The sender takes the training thread's queue before it can be this full at the rate the last
#: rounds saw (a loop of 0.1 ms steps fills 10,000 entries in a second).
QUEUE_SHARE = 0.25

#: A sleep of the sender that ends this much later than it asked for is a pause of the process
#: (SIGSTOP, a starved VM): the time it did not run, which queued messages do not age by (see
#: SenderClock.slept). A poll wakes within a millisecond or two of its timeout otherwise.
PAUSE_MIN_S = 0.25
#: The pauses a clock keeps between two rounds (SenderClock.slept; an empty look loops sleeps
#: without rounds): past this many, the two oldest are counted as one, at the older's due end
#: (what was published between them is then credited with neither: never with a pause it did
#: not wait through).
PAUSES_MAX = 8

#: A message the sender holds: (kind, when it was published on the monotonic clock (its age, its
#: batch's due time), the same on the wall clock (its timestamp on the wire), fields).
Item = tuple[str, float, float, dict[str, Any]]


def _monotonic() -> float:
    return time.monotonic()


def _wall_time() -> float:
    # Looked up at each call: a test replaces this module's ``time`` to step the wall clock.
    return time.time()


def _perf_time() -> float:
    return time.perf_counter()


class SenderClock:
    """The sender's two clocks. It schedules on ``time.monotonic()`` alone: on the wall clock a
    step back (NTP, an admin's ``date -s``) held every timer back by as much (telemetry, hellos
    and batches stopped: the rank looked stale), a step forward fired them all at once and
    expired what waited as if old. The wire carries wall times (the monitor aligns ranks by
    them), and publish() reads the wall clock only: one clock read a step on the training thread,
    and a frame's timestamp is exactly the wall time at which it was published, a step of the
    clock since or not. The sender places those times on its monotonic clock with wall −
    monotonic sampled each round, within the span the message was published in (after the
    previous round took the queue, before this one took it): one published before a step and
    taken after it is then at most a round off, never a step's size.

    The monotonic clock also runs while the process does not (SIGSTOP, a starved VM): a message
    queued before such a pause would be older than ``max_age_s`` when the process resumes, and
    dropped, though it waited for nothing but the pause (a monitor then lost steps that
    happened). The sender knows how long each of its sleeps should last; one that ended more than
    PAUSE_MIN_S late (:meth:`slept`) was a pause, and the next round (:meth:`round`) places
    what was published before the sleep's due end that much later (Round.begin does the same to
    what it holds): ages count the time the process ran. Each pause is kept with its own due end
    (two sleeps between rounds may each find one): a message is credited with the pauses whose
    due end came after it was published, not with one from before it. What is published during the pause (a
    thread that did run) is not moved, so the bound that ``max_age_s`` keeps while no monitor
    listens still holds: what waits is what was published within the last ``max_age_s`` of
    the process's running time.

    The step tracker's rows (probe.transport.steprows) are stamped on ``time.perf_counter()``, the
    clock it reads anyway (CLOCK_MONOTONIC on Linux, as ``time.monotonic()``), not the wall clock:
    a row's wall time is its stamp placed on the wall clock with wall − perf_counter sampled at
    the round that takes it, so only a step of the wall clock between the two tells them apart.

    ``mono``, ``wall`` and ``perf`` are the clocks it reads (tests inject them)."""

    def __init__(self, mono: Callable[[], float] | None = None, wall: Callable[[], float] | None = None,
                 perf: Callable[[], float] | None = None) -> None:
        self._mono, self._wall, self._perf = mono or _monotonic, wall or _wall_time, perf or _perf_time
        self.since = self.now = self._mono()
        self.offset = self._wall() - self.now  # wall − monotonic, this round
        self.perf_offset = self.offset + self.now - self._perf()  # wall − perf_counter, this round
        #: The pauses found by the sleeps since the last round: (the due end of the sleep that
        #: found it, its lateness), oldest first (what was published before a due end is moved by
        #: that pause; at most PAUSES_MAX); this round's, once :meth:`round` began it, with
        #: :attr:`pause_s` their sum.
        self._pauses: list[tuple[float, float]] = []
        self.pauses: list[tuple[float, float]] = []
        self.pause_s = 0.0

    def round(self) -> float:
        """A round begins (before it takes the queue): monotonic now; the offset sampled anew,
        and the pause the sleeps found since the last round (:attr:`pause_s`) this round's."""
        self.since, self.now = self.now, self._mono()
        self.offset = self._wall() - self.now
        self.perf_offset = self.offset + self.now - self._perf()
        self.pauses, self._pauses = self._pauses, []
        self.pause_s = sum(late for _, late in self.pauses)
        return self.now

    def read(self) -> float:
        """Monotonic now (a sleep's start, for :meth:`slept`)."""
        return self._mono()

    def slept(self, asked_s: float, start: float) -> None:
        """A sleep asked for ``asked_s`` from ``start`` (this clock) has ended: any lateness past
        PAUSE_MIN_S is a pause of the process (the thread could not run to wake up)."""
        due = start + asked_s
        late = self._mono() - due
        if late >= PAUSE_MIN_S:
            pauses = self._pauses
            if len(pauses) >= PAUSES_MAX:
                due0, late0 = pauses.pop(0)
                pauses[0] = (due0, late0 + pauses[0][1])
            pauses.append((due, late))

    def moved(self, mono: float) -> float:
        """A monotonic time of before this round, moved by the round's pauses that it came before
        (each sleep's due end after it)."""
        if not self.pauses:
            return mono
        return mono + sum(late for due, late in self.pauses if mono < due)

    def mono(self, wall: float) -> float:
        """The monotonic time of a wall time read by publish() since the previous round (one
        published before the sender started counts as published when it started), moved past a
        pause it came before."""
        return min(self.now, max(self.since, self.moved(wall - self.offset)))

    def queued(self, row: StepRow) -> Queued:
        """A step row as the queue's other step records are: its record, stamped on the wall clock."""
        return "step", row[1] + self.perf_offset, step_fields(row)

    def item(self, queued: Queued) -> Item:
        """A queued message as the sender holds it."""
        kind, wall, fields = queued
        return kind, self.mono(wall), wall, fields

    def wall(self, mono: float) -> float:
        """The wall time of a monotonic time of this round (a timestamp the sender makes)."""
        return mono + self.offset


class Round:
    """The sender thread's state between rounds (its own: nothing else reads it)."""

    def __init__(self, hello: dict[str, Any] | None, clock: SenderClock | None = None) -> None:
        self.clock = clock or SenderClock()
        self.pending: Deque[Item] = collections.deque()
        self.batch: list[Queued] = []  # step records not yet closed into a frame
        self.batch_mono = 0.0  # when its first record was published, on the monotonic clock
        self.next_tick: list[float] = []
        self.next_hello = self.hello_at = self.steps_at = -math.inf  # hello checked, sent; steps sent
        self.listening = False
        self.last_hello = hello
        self.watched = 0  # watched descriptors handed to the poll so far
        self.popped, self.at = 0, self.clock.now  # the queue's count taken, and when (see SenderLoop._wait_s)
        self.flushed_at = -math.inf  # when the last batch was closed (see batch_at)
        self.newest = -math.inf  # the newest step record's publish time (monotonic, as all but the wire's)
        self.gap = 0.0  # seconds between step records, over the last round that took some
        self.retry_s = RETRY_S  # the wait after a refused send (see RETRY_MAX_S)
        self.said_bye = False  # a bye went out: no hello after it
        #: The latest FLOP count taken (its fields): a count is sent once, when counted, so a
        #: monitor that (re)appears later, or a new rank key, gets it again after the hello (else
        #: no FLOP/s or MFU until the next re-count, up to FLOWTOP_RECHECK_STEPS steps).
        self.flops: dict[str, Any] | None = None
        self.resend_count = False  # a monitor (re)appeared: the count goes after its hello
        self.look_until = -math.inf  # while looking (SenderLoop._look_again): when a round is due

    def begin(self) -> float:
        """A round begins: monotonic now (SenderClock.round). After a pause of the process, what
        the sender held from before it (pending messages, the open batch) is moved by the pause,
        as the queue's messages are when taken: none of it aged while the process did not run."""
        now = self.clock.round()
        clock = self.clock
        if clock.pause_s > 0.0:
            moved = clock.moved
            held = [(kind, moved(at), t, fields) for kind, at, t, fields in self.pending]
            self.pending.clear()
            self.pending.extend(held)
            if self.batch:
                self.batch_mono = moved(self.batch_mono)
        return now

    def close_batch(self, flush: float) -> None:
        """The open batch's records become one pending "steps" frame (a lone record too: columns
        cost the monitor less to check than a plain "step" map), held for ``flush``."""
        batch = self.batch
        if batch:
            # Its age (the outbox's expiry, max_age_s) counts from when it was due to leave (or
            # now, if sooner), not from its first record: a flush or a pace near or past
            # max_age_s (FLOWTOP_FLUSH_S=5; a monitor's 2 s pace and a sender waking a step late)
            # expired every batch at once, counted as the queue's drops (a new user's trial: a
            # job "done" at step 15 of 80). A round a minute late still finds it a minute old.
            ready = max(self.batch_mono, min(self.clock.now, self.batch_at(flush)))
            self.pending.append(("steps", ready, batch[0][1], {"records": [f for _, _, f in batch]}))
            self.flushed_at = self.clock.read()
            batch.clear()

    def open_batch(self, first: Queued) -> None:
        """``first`` opens the batch (the sender's round that took it)."""
        self.batch_mono = self.clock.mono(first[1])
        self.batch.append(first)

    def stepped(self, steps: int, newest: float) -> None:
        """``steps`` step records were taken this round, the newest published at wall time ``newest``."""
        newest = self.clock.mono(newest)
        self.gap = max(0.0, newest - self.newest) / steps if self.newest > -math.inf else 0.0
        self.newest = newest

    def batch_at(self, flush: float) -> float:
        """When the open batch leaves, on the monotonic clock (probe.wire.pace.batch_due; another
        message closes it sooner, and so does MAX_BATCH)."""
        return batch_due(self.flushed_at, self.batch_mono, flush)

    def step_rate(self, taken: int, elapsed: float, now: float, steps: int) -> float:
        """Messages a second the training thread queues, the highest of: the last round's, the
        open batch's, and one over the gap between this round's step records (a step record whose
        predecessor is unknown counts as 1 ms after it: the first of a fast loop has no batch
        to wait with it, and the wait for the next batch must not let the loop fill the queue)."""
        last = taken / elapsed if taken > 0 and elapsed > 0 else 0.0
        batch = len(self.batch) / max(MIN_WAIT_S, now - self.batch_mono) if self.batch else 0.0
        gap = 1.0 / max(MIN_WAIT_S, self.gap) if steps else 0.0
        return max(last, batch, gap)

    def refused(self, refused: bool) -> None:
        """A round's sends ended at the high-water mark (or not): the next try backs off."""
        self.retry_s = min(RETRY_MAX_S, 2 * self.retry_s) if refused else RETRY_S
