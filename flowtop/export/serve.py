"""``flowtop serve`` and ``flowtop snapshot --follow``: the monitor without a TUI. No Textual.

Both host the collector on the data thread (flowtop.monitor.datathread), exactly as the TUI does: the
model, ticks and hints run there, and the main thread only reads the snapshots it publishes.
``serve`` answers scrapes (flowtop.export.metrics_http) until SIGINT, SIGTERM or SIGHUP; ``--follow`` writes
one snapshot per line (JSON Lines) every ``--interval`` seconds until interrupted, each line
whole. Monitor-side notices (a recording that stopped, the open-file limit) go to stderr.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

from flowtop.monitor.clock import TICK_S
from flowtop.monitor.datathread import DataThread
from flowtop.monitor.format import fmt_ranks
from flowtop.monitor.snapshot import ENDED, JobSnapshot, MonitorSnapshot, RankSnapshot, ending_order, first_ending, \
    job_done
from flowtop.monitor.snapshot_json import to_json

#: Seconds to wait for the data thread to bind and start.
START_TIMEOUT_S = 30.0


def _say(text: str) -> None:
    print(f"flowtop: {text}", file=sys.stderr, flush=True)


def host(collector: Any) -> DataThread:
    """A data thread for ``collector`` whose notices go to stderr (nobody takes its mailbox
    otherwise: each wake-up empties it, so the next put wakes again)."""
    data: DataThread

    def wake() -> None:  # on the data thread
        for n in data.mailbox.take().notices:
            _say(n.text)

    data = DataThread(collector, cadence_s=TICK_S, wake=wake)
    return data


def start(data: DataThread) -> str:
    """Start the data thread; "" or why the collector could not start (a busy port)."""
    try:
        data.start().result(START_TIMEOUT_S)
    except Exception as exc:
        return getattr(data.source, "start_error", "") or f"{type(exc).__name__}: {exc}"
    return ""


@contextmanager
def interrupted() -> Iterator[threading.Event]:
    """An event set by SIGINT, SIGTERM or SIGHUP (a closed SSH session: the recording must still
    be closed whole) while the block runs (the handlers only set it, so a line being written is
    finished first); the previous handlers come back afterwards. An ignored SIGHUP (``nohup``)
    stays ignored."""
    stop = threading.Event()
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue
        try:
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
        except ValueError:  # not the main thread
            pass
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def recording_failed(collector: Any) -> str:
    """Why the recording stopped ("" when it did not, or there was none)."""
    recorder = getattr(collector, "last_recorder", None)
    return recorder.error if recorder is not None else ""


def serve(collector: Any, metrics: Any) -> int:
    """Run ``collector`` on the data thread and ``metrics`` (a flowtop.export.metrics_http.MetricsServer
    whose ``latest`` reads ``data.latest``) until interrupted. 0, 1 if the recording failed, 2
    when the monitor or the metrics endpoint could not start."""
    from flowtop.export.metrics_http import MetricsAddressError

    data = host(collector)
    metrics.latest = lambda: data.latest
    with interrupted() as stop:
        try:
            where = metrics.start()
        except MetricsAddressError as exc:
            _say(str(exc))
            return 2
        try:
            error = start(data)
            if error:
                _say(error)
                return 2
            _say(f"monitor on {collector.listen}; metrics at {where.url()} (and {where.url('/snapshot.json')}); "
                 "Ctrl-C stops")
            while not stop.wait(1.0):
                pass
        finally:
            metrics.stop()
            data.stop()
    return _exit_status(collector)


def follow(collector: Any, interval: float, timeout: float | None, until_done: bool,
           out: TextIO | None = None) -> int:
    """Write one snapshot JSON per line every ``interval`` seconds (a newer snapshot each time:
    the data thread publishes one per tick) until SIGINT/SIGTERM/SIGHUP, ``timeout`` or, with
    ``until_done``, the first line on which every rank is done. 0; 1 if the recording failed;
    2 when the monitor could not start; 3 when ``until_done`` met the timeout first; 4 when
    every rank ended and one or more failed, 5 when a signal stopped ranks (:func:`end_status`)."""
    from flowtop.monitor.snapshot import all_done

    stream = out or sys.stdout
    data = host(collector)
    with interrupted() as stop:
        error = start(data)
        if error:
            _say(error)
            return 2
        timed_out = False
        try:
            deadline = time.monotonic() + timeout if timeout else float("inf")
            last: MonitorSnapshot | None = None
            due = time.monotonic()
            while not stop.is_set():
                snap = _next(data, last, stop, min(due, deadline))
                if snap is None:  # stopped (a signal)
                    break
                if not _write(stream, json.dumps(to_json(snap), separators=(",", ":"))):
                    break  # the reader went away (| head): not an error
                last = snap
                if until_done and all_done(snap):
                    break
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                due = max(due + interval, time.monotonic())
        finally:
            data.stop()
    status = _exit_status(collector)
    if status == 0 and until_done and timed_out:
        return not_done(after_timeout(timeout), last)
    if status == 0 and until_done and last is not None and all_done(last):  # not a signal's early end
        return end_status(last)
    return status


#: ``--until-done``'s exit status when every rank ended and a job's first ending was a crash.
FAILED_STATUS = 4
#: ... when every rank ended and no job's first ending was a crash, one's a signal's stop mid-run
#: (``stopped``: scancel, a preemption, a timeout's kill; its peers' collectives may fail after
#: it): not finished, yet no crash to look for.
STOPPED_STATUS = 5


def end_status(snap: MonitorSnapshot) -> int:
    """The exit status of ``--until-done`` once every rank is done: 4 where a job's first ending
    (snapshot.first_ending, by the byes' send times) was a crash (an uncaught exception, a
    non-zero exit), else 5 where one's was a signal's stop (scancel, a preemption, a timeout's
    kill), 3 where ranks were unheard behind a dead relay at the end (:func:`_say_unheard`), each
    said on stderr per job, of its own ranks (a script tells them from a clean run without reading
    the JSON); else 0. The first ending is the cause, the others its consequences, said as such:
    torchrun stops a crashed rank's peers with SIGTERM (4, "stopped after the failure"), and a
    node a signal stopped breaks its peers' collectives (5, "failed after the signal"). A rank
    known to have failed or been stopped says more than one not known to have finished, so 4 and
    5 win over 3; the unheard ranks are still named on a line of their own (the 5's line alone
    hid them)."""
    unheard = [(j.job, r) for j in snap.jobs for r in j.ranks if r.cut is not None and r.status not in ENDED]
    ends = {_job_ended(j) for j in snap.jobs}
    status = FAILED_STATUS if FAILED_STATUS in ends else STOPPED_STATUS if STOPPED_STATUS in ends else 0
    if unheard:
        _say_unheard(unheard)
    return status or (3 if unheard else 0)


def _job_ended(job: JobSnapshot) -> int:
    """4 where the job's first ending was a crash, 5 where a signal's stop, each said with its
    consequences (the job's other failed or stopped ranks, ended after it); else 0."""
    first = first_ending(job.ranks)
    if first is None:
        return 0
    failed = sorted((r for r in job.ranks if r.status == "failed"), key=ending_order)
    stopped = sorted((r for r in job.ranks if r.status == "stopped"), key=ending_order)
    how = ", ".join(sorted({r.bye_reason or "?" for r in stopped}))
    if first.status == "failed":
        _say(f"--until-done: {len(failed)} rank(s) failed, first rank {first.rank} of {job.job}: {first.bye_reason}")
        if stopped:
            _say(f"--until-done: {len(stopped)} rank(s) of {job.job} stopped by a signal ({how}) after the failure, "
                 f"first rank {stopped[0].rank}")
        return FAILED_STATUS
    _say(f"--until-done: {len(stopped)} rank(s) stopped by a signal ({how}) before they finished, "
         f"first rank {first.rank} of {job.job}")
    if failed:
        _say(f"--until-done: {len(failed)} rank(s) of {job.job} failed after the signal, first rank "
             f"{failed[0].rank}: {failed[0].bye_reason}")
    return STOPPED_STATUS


def _say_unheard(unheard: list[tuple[str, RankSnapshot]]) -> None:
    """Name the ranks of a job done while they were unheard behind a dead relay (their byes lost
    with it): not known to have finished, so not a clean end."""
    by_job: dict[str, list[int]] = {}
    for job, r in unheard:
        if r.rank not in by_job.setdefault(job, []):  # two processes of one rank number (a conflict)
            by_job[job].append(r.rank)
    hosts = sorted({r.cut.host for _, r in unheard if r.cut is not None})
    named = "; ".join(f"{job + ': ' if len(by_job) > 1 else ''}rank{'s' if len(nums) > 1 else ''} "
                      f"{fmt_ranks(nums, 60)}" for job, nums in by_job.items())
    count = sum(len(nums) for nums in by_job.values())
    _say(f"--until-done: {count} rank(s) of {', '.join(by_job)} ({named}) unheard behind relay(s) on "
         f"{', '.join(hosts)} when the job ended: whether they finished is not known")


def not_done(when: str, snap: MonitorSnapshot | None = None) -> int:
    """``--until-done`` ended before every rank had finished (``when``: after its timeout, or
    where a replayed recording ends): said on stderr, exit status 3 (a script tells it from done).
    Where ``snap`` holds no rank at all, that is said instead: "not every rank had finished" of a
    monitor that never heard one (a training sent elsewhere, refused keys) sent a trial looking
    for ranks that did not finish."""
    if snap is not None and not snap.jobs:
        _say(f"--until-done: no rank was heard {when} (received {snap.received}, rejected {snap.rejected} "
             f"on {snap.listen}); nothing to wait for")
        return 3
    _say(f"--until-done: not every rank had finished {when}; the output shows them as they were")
    for job in (snap.jobs if snap is not None else ())[:MAX_JOBS_SAID]:
        if not job_done(job):  # as all_done judges it
            _say(f"--until-done: {job.job}: {_unfinished(job, snap.taken_at if snap is not None else 0.0)}")
    return 3


#: Jobs :func:`not_done` names the ranks of (a monitor holds 256 at most).
MAX_JOBS_SAID = 8


def _unfinished(job: JobSnapshot, now: float) -> str:
    """The job's ranks by status, those not ended first: "rank 2 stale (nothing heard for 42 s),
    ranks 0-1,3 stopped". A trial: a rank killed by SIGKILL (no bye) held ``--until-done`` to its
    timeout, whose line named no rank: which one never finished was the JSON's to find."""
    by_status: dict[str, list[int]] = {}
    for r in sorted(job.ranks, key=lambda r: (r.status in ENDED, r.rank)):
        # one behind a dead relay may train on: unheard, not known to be stale (its relay_silent hint)
        by_status.setdefault(f"unheard behind {r.cut.cause}" if r.cut is not None else r.status, []).append(r.rank)
    parts = []
    for status, nums in by_status.items():
        said = f"rank{'s' if len(nums) > 1 else ''} {fmt_ranks(nums, 60)} {status}"
        if status == "stale":  # silent: no bye may ever come (killed outright, its host down)
            silent = max(r.age_s(now) for r in job.ranks if r.status == "stale" and r.cut is None)
            said += f" (nothing heard for {silent:.0f} s)"
        parts.append(said)
    never = job.never_heard
    if never:
        parts.append(f"rank{'s' if len(never) > 1 else ''} {fmt_ranks(never, 60)} of {job.world_size} never heard")
    return ", ".join(parts)


def after_timeout(timeout: float | None) -> str:
    """:func:`not_done`'s ``when`` for a timeout."""
    return f"after {timeout:g} s (the timeout)"


def _exit_status(collector: Any) -> int:
    """1 (said) when the recording failed, else 0: how serve and follow end."""
    failed = recording_failed(collector)
    if failed:
        _say(failed)
        return 1
    return 0


def _next(data: DataThread, last: MonitorSnapshot | None, stop: threading.Event,
          due: float) -> MonitorSnapshot | None:
    """Wait until ``due``, then for a snapshot newer than ``last``; None when stopped."""
    if stop.wait(max(0.0, due - time.monotonic())):
        return None
    while True:
        snap = data.latest
        if snap is not None and snap is not last:
            return snap
        if stop.wait(0.02):
            return None


def _write(stream: TextIO, line: str) -> bool:
    """One whole line, flushed; False when the reader has gone."""
    try:
        stream.write(line + "\n")
        stream.flush()
        return True
    except BrokenPipeError:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())  # the interpreter's own flush at exit stays quiet
        return False
