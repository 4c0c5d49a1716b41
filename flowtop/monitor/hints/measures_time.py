"""Measures over step timing: hangs and input wait (stragglers: flowtop.monitor.hints.measures_straggler)."""

from __future__ import annotations

import math
import re
import statistics
import weakref
from dataclasses import dataclass
from typing import Any

from flowtop.monitor.format import fmt_ranks
from flowtop.monitor.hintclock import HintClock
from flowtop.monitor.records import fast_init
from flowtop.monitor.hints.aligned import flat
from flowtop.monitor.hints.base import (Measurement, clamp01, finite, finite_sum, latest_ranks, median_of,
                                        median_step_s, rank_target, safe_div, telemetry_number)
from flowtop.monitor.hints.stages import feeds_itself
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.snapshot import ENDED, JobSnapshot, RankSnapshot, ending_order, ending_time, first_ending
from probe.wire import BYE_ERROR_PREFIX


def _running(job: JobSnapshot) -> list[RankSnapshot]:
    """Ranks that may still make progress (a finished job or rank cannot hang or straggle)."""
    if job.status in ENDED:
        return []
    return [r for r in latest_ranks(job) if r.status not in ENDED]


def _newest_reached(r: RankSnapshot) -> tuple[int, float] | None:
    """The (step, receive time) of the rank's newest reached step when its history reaches its
    step, else None. A large job's hints read histories taken when they measure (Model._as_now:
    every rank with steps, its telemetry where it sampled again since its view); a history built
    by hand, or a rank without steps, may stop short of its step. One lookup: the hang rules ask
    it of every rank (4,096 ranks, two rules, every round)."""
    reached = r.history.reached
    if not reached:
        return None
    last = reached[-1]
    return last if last[0] >= r.step else None


def _current(r: RankSnapshot) -> bool:
    """Whether the rank's history reaches its step (see _newest_reached)."""
    return _newest_reached(r) is not None


@fast_init  # one a running rank at each evaluation of the hang rules (flowtop.monitor.records)
@dataclass(frozen=True, slots=True)
class _Stall:
    """A running rank's stall at one evaluation."""

    since: float  # monitor time it counts from (the snapshot's clock: its relay's lag added)
    stalled_s: float  # seconds since then, now
    limit_s: float
    median_step_time_s: float | None
    last_step: int
    by_hello: bool  # counted from the step boundary its hello reported


def _stall(rule: Rule, r: RankSnapshot, now: float) -> _Stall:
    """Since when the rank made no step (monitor clock), for how long now, and the limit that is
    compared with."""
    # A rank that stepped since its history was taken (not current) is not stalled since then
    # (read from its history, every healthy rank whose turn was furthest read as hung past the
    # 30 s floor); when it last stepped is unknown, so its silence stands for it: a rank that
    # stepped and then hung is seen at its next turn, within a round.
    last = _newest_reached(r)
    # The sender thread keeps heartbeating while training is stuck in a collective, so the time
    # since the last *step* matters; a silent rank (since it was heard) counts too.
    # Its hello's step boundary where newer than its step records: a monitor (re)started while
    # the job hangs heard none of them, the ranks' hellos say how long they have waited.
    reported = r.hello_step_at
    by_hello = reported is not None and (last is None or reported > last[1])
    stepped = reported if by_hello else (last[1] if last is not None else None)
    # As of its relay's latest report (on the snapshot's clock, its lag added): behind a backlog
    # its steps arrive late, it did not stop.
    since = (r.heard_at if stepped is None else min(r.heard_at, stepped)) + r.behind_s
    med = median_step_s(r)
    limit = max(float(rule.params["factor"]) * (med or 0.0), float(rule.params["floor_s"]))
    last_step = r.step if by_hello or last is None else last[0]
    return _Stall(since, max(0.0, now - since), limit, med, last_step, by_hello)


#: The last job measured (a weak reference: a large job's judged histories die with their
#: evaluation, Model._as_now), the instant, the parameters, and its running ranks' stalls.
_STALLS: list[tuple[weakref.ref[JobSnapshot], float, tuple[Any, Any], list[_Stall]]] = []


def _stalls(rule: Rule, job: JobSnapshot, now: float) -> tuple[list[RankSnapshot], list[_Stall]]:
    """The running ranks of ``job`` and their :func:`_stall` at ``now``: hang_all and hang_rank
    (same parameters, measured together, see HintEngine.plan) read the same, taken once (every
    rank's at every tick of a hung or silent job: half of what its hints then cost). Read only."""
    params = (rule.params["factor"], rule.params["floor_s"])
    # A rank behind a silent relay is unheard, not known to have stopped: a relay stopped or cut
    # off while its ranks trained on read as a critical hang of all of them (a trial: SIGSTOP of
    # the relay `flowtop run` hosts). Its relay's row and its status reason say it; its view is
    # marked cut off (RankSnapshot.cut, set where flowtop.monitor.relays decides the reason).
    ranks = [r for r in _running(job) if r.cut is None]
    if _STALLS and _STALLS[0][0]() is job and _STALLS[0][1] == now and _STALLS[0][2] == params:
        return ranks, _STALLS[0][3]
    stalls = [_stall(rule, r, now) for r in ranks]
    _STALLS[:] = [(weakref.ref(job), now, params, stalls)]
    return ranks, stalls


def hang_rank(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per running rank: time since its last step ÷ the hang limit."""
    out: dict[str, Measurement | None] = {}
    for r, stall in zip(*_stalls(rule, job, now)):
        # stalled_s and stalled_x grow with the clock: the hint holds since when (HintClock).
        ev = {"limit_s": stall.limit_s, "median_step_time_s": stall.median_step_time_s,
              "last_step": stall.last_step, "by_hello": stall.by_hello, "pid": r.pid}
        out[rank_target(r)] = Measurement(
            value=stall.stalled_s / stall.limit_s, evidence=ev, impact=1.0, step=r.step, text={"pid": str(r.pid)},
            clock=HintClock(stall.since, stall.limit_s),
        )
    return out


def hang_all(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Job: the *least* stalled running rank's stall ÷ its limit (all stalled iff it is over)."""
    ranks, stalls = _stalls(rule, job, now)
    if not ranks:
        return {}
    # Lists, then C scans: a key function or a generator a rank cost ~2x a comprehension's value
    # (every rank of a large job, each round). The first of the least, as min(key=) picks.
    ratios = [e.stalled_s / e.limit_s for e in stalls]
    least = stalls[ratios.index(min(ratios))]
    meds = [e.median_step_time_s for e in stalls if e.median_step_time_s]
    # stalled_s, stalled_x and silent_s grow with the clock: the hint holds since when (HintClock).
    ev: dict[str, Any] = {
        "limit_s": least.limit_s,
        "median_step_time_s": statistics.median(meds) if meds else None,
        "last_step": max([e.last_step for e in stalls]),
        "ranks_n": len(ranks),
        # Ranks whose stall is the one their hellos reported (this monitor saw none of their recent
        # steps: no median step either, so the limit is the floor).
        "by_hello_ranks": [r.rank for r, e in zip(ranks, stalls) if e.by_hello],
    }
    silent_since = None
    # A rank blocked in a collective still sends heartbeats; one that is stopped, dead or cut off
    # goes stale. When only some ranks are silent, they are the ones the others wait for.
    silent = [r for r in ranks if r.status == "stale"]
    ev["silent_ranks"] = [r.rank for r in silent]
    shown = latest_ranks(job)
    cut = len(shown) - [r.cut for r in shown].count(None)
    text: dict[str, str] = {"ranks_phrase": _ranks_phrase(len(ranks), len(shown), cut)}
    if silent:  # a dead rank is named even when it is the only one left
        # the longest-silent one's, on the snapshot's clock (RankSnapshot.age_s)
        silent_since = min(r.heard_at + r.behind_s for r in silent)
        text["silent"] = rank_list(silent)
        text["others_wait"] = " while the others wait" if len(silent) < len(ranks) else ""
    # Ranks of the world never heard (a monitor started after one stopped, or one that never
    # reached it): named like the silent ones, which they likely are.
    unheard = list(job.never_heard)
    ev["never_heard_ranks"] = unheard
    if unheard and not silent:
        text["unheard"] = ("rank " if len(unheard) == 1 else "ranks ") + fmt_ranks(unheard, 40)
        text["world"] = str(job.world_size)
        text["others_wait"] = " while the others wait"
    variant = "silent" if silent else ("unheard" if unheard else "")
    stopped = [r for r in shown if r.status == "stopped"]
    ev["stopped_ranks"] = [r.rank for r in stopped]
    failed = [r for r in shown if r.status == "failed"]
    ev["failed_ranks"] = [r.rank for r in failed]
    first = first_ending(shown)  # the cause, named before a later silence; the other endings follow it
    ev["first_cause"] = None if first is None else first.status
    if silent_since is not None and first is not None and _silent_first(silent, shown, failed, first,
                                                                         silent_since, ev["median_step_time_s"]):
        ev["first_cause"] = "silent"
        # Silent before anyone said bye: killed outright (SIGKILL, the OOM killer, a segfault),
        # then its peers ended of it (torchrun's SIGTERM, gloo's errors). A trial read that
        # SIGTERM as the cause and the dead rank as one waiting in a collective.
        text["after"] = _endings(stopped, failed)
        variant = "silent_first"
    elif first is not None and first.status == "stopped":  # scancel, a preemption: NCCL peers hang on it
        text["stopped"] = rank_list(stopped)
        text["signal"] = ", ".join(sorted({r.bye_reason or "?" for r in stopped}))[:40]
        # its peers whose collectives broke when it left: a consequence, not the cause
        text["then"] = f"; {rank_list(failed)} failed after it" if failed else ""
        variant = "stopped"
    elif first is not None:  # a crash (torchrun then stops its peers with SIGTERM)
        text["failed"] = rank_list(failed)
        text["why"] = _why(first.bye_reason)
        variant = "failed"
    return {"": Measurement(value=least.stalled_s / least.limit_s, evidence=ev, impact=1.0, step=job.step,
                            text=text, variant=variant,
                            clock=HintClock(least.since, least.limit_s, silent_since))}


#: The probe's default flush (FLOWTOP_FLUSH_S) and the longest gap between a running rank's
#: frames that hang_all allows for (its heartbeat's), in telling a rank silent before its peers'
#: endings from one that ended with them.
_FLUSH_S = 0.1
_GAP_CAP_S = 2.0


def _silent_first(silent: list[RankSnapshot], shown: list[RankSnapshot], failed: list[RankSnapshot],
                  first: RankSnapshot, silent_since: float, step_s: float | None) -> bool:
    """Whether the silence since ``silent_since`` came before the job's first ending (``first``),
    so caused it: by more than two of a frame's usual gaps (a step, the probe's 0.1 s flush, or
    the gap between its frames seen, paced; at most 2 s: one that ended with its peers but lost
    its bye and the records it held since its last frame was last heard up to a gap and its
    flush's phase before theirs, a reviewer's case), or at all where two or more failures are lost
    connections (gloo's peers fail within milliseconds of a peer's SIGKILL, inside any margin; one
    rank's own I/O error, "reset by peer" reading s3://, is no collective's)."""
    ended = ending_time(first)
    if silent_since >= ended:
        return False
    if first.status == "failed" and len(failed) >= 2 and all(peer_lost(r.bye_reason) for r in failed):
        return True
    # the job's ranks are paced alike: the silent ones' gaps and a few others' (a silent rank may
    # have sent one frame only), not all of a large job's
    gaps = [g for g in map(_frame_gap, silent[:16] + shown[:16]) if g > 0.0]
    seen_gap = statistics.median(gaps) if gaps else 0.0
    return silent_since + min(_GAP_CAP_S, 2.0 * max(_FLUSH_S, step_s or 0.0, seen_gap)) < ended


def _frame_gap(r: RankSnapshot) -> float:
    """The median time between a rank's recent frames: the distinct receive times of its last
    steps (a paced probe sends many steps a frame); 0 with fewer than two."""
    times = sorted({t for _, t in r.history.reached[-64:]})
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else 0.0


#: How a failure that is a lost connection to a peer reads (gloo's pair.cc "Connection closed by
#: peer", "Connection reset by peer"; NCCL's "Connection closed by remote peer", "remote process
#: exited or there was a network error"): the consequence of a peer's end.
_PEER_LOST = ("connection closed by peer", "connection reset by peer", "closed by remote peer",
              "remote process exited")
#: A source location in an error's text ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "):
#: left out of a hint's quote, whose 120 characters it ate ("… (RuntimeError: …Conne").
_SOURCE_AT = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|cxx|c|h|hpp|cu|py):\d+\]\s*")


def peer_lost(bye: str | None) -> bool:
    """Whether a failed rank's bye is a lost connection to a peer (:data:`_PEER_LOST`)."""
    low = (bye or "").lower()
    return any(p in low for p in _PEER_LOST)


def _why(bye: str | None) -> str:
    """A failure's exception as a hint quotes it: without the bye's prefix and source locations, 120
    characters at most."""
    return _SOURCE_AT.sub("", (bye or "").removeprefix(BYE_ERROR_PREFIX))[:120]


def _endings(stopped: list[RankSnapshot], failed: list[RankSnapshot]) -> str:
    """"a signal (SIGTERM) ended ranks 0-1,3 (vm)", "rank 3 (vm) failed (ValueError: …)", or
    both joined: the endings that followed a rank's silence."""
    said = []
    if stopped:
        signals = ", ".join(sorted({r.bye_reason or "?" for r in stopped}))[:40]
        said.append((min(map(ending_order, stopped)), f"a signal ({signals}) ended {rank_list(stopped)}"))
    if failed:
        first = min(failed, key=ending_order)
        said.append((ending_order(first), f"{rank_list(failed)} failed ({_why(first.bye_reason)})"))
    return " and ".join(text for _, text in sorted(said))  # in the order they ended


def rank_list(ranks: list[RankSnapshot], width: int = 40) -> str:
    """"rank 5", "ranks 720-727 (node0090)", "ranks 3,40-42,96-97 (3 hosts)": runs of numbers
    joined (flowtop.monitor.format.fmt_ranks), the host when there are few (a dead node's 8 ranks
    read "720, 721, …, 727"; a new user's trial)."""
    numbers = [r.rank for r in ranks]
    hosts = sorted({r.host for r in ranks})
    where = f" ({', '.join(hosts)})" if len(hosts) <= 2 else f" ({len(hosts)} hosts)"
    return ("rank " if len(set(numbers)) == 1 else "ranks ") + fmt_ranks(numbers, width) + where


def _ranks_phrase(running: int, shown: int, unheard: int = 0) -> str:
    """Who stopped, counted truthfully: "all 4 ranks", "the only rank", "the 1 running rank (of 2;
    the other ended)", "the 4 heard ranks (of 8; 4 unheard behind a silent relay)"."""
    if running == shown:
        return "the only rank" if running == 1 else f"all {running} ranks"
    if unheard:
        ended = shown - running - unheard
        rest = f"; {ended} ended" if ended else ""
        return (f"the {running} heard rank{'s' if running != 1 else ''} (of {shown}; {unheard} unheard "
                f"behind a silent relay{rest})")
    others = "the other ended" if shown - running == 1 else "the others ended"
    return f"the {running} running rank{'s' if running != 1 else ''} (of {shown}; {others})"


#: A telemetry reading older than this says nothing about the device now (the probe samples
#: every second, every 10 s at most when the monitor paces it, flowtop.monitor.pacing.
#: PACED_TELEMETRY_S, and a paced frame may wait its 2 s pace and a backlog on top; a dead NVML
#: must not keep the input-wait hint silent for good).
FRESH_TELEMETRY_S = 25.0


def device_idle_pct(r: RankSnapshot, now: float) -> float:
    """How much of the time the rank's compute device idles, in percent.

    A GPU rank: 100 − NVML GPU-Util (the share of time no kernel ran — the one thing GPU-Util
    measures well) while the reading is fresh at ``now`` (as of its view), else 1 − busy of its
    latest CUDA kernel window; a CPU rank, or a GPU rank with neither: 100 (the training thread is
    the device, or nothing says it is busy)."""
    if r.device.startswith("cpu"):
        return 100.0
    util = telemetry_number(r, "gpu_util")
    # Fresh as of the view: at ``now``, or for a rank between its turns at its history's newest
    # step (its telemetry is as old as its history, and would read as a dead NVML).
    at = now if _current(r) or not r.history.reached else r.history.reached[-1][1]
    if util is not None and r.telemetry is not None and r.telemetry.age_s(at) <= FRESH_TELEMETRY_S:
        return max(0.0, 100.0 - util)
    k = r.kernels
    if k is not None and k.device == "cuda":
        busy = k.anatomy.busy_frac_typical if k.anatomy.busy_frac_typical is not None else k.anatomy.busy_frac
        if busy is not None and math.isfinite(busy):
            return 100.0 * (1.0 - min(max(busy, 0.0), 1.0))
    return 100.0


#: Steps of a run whose input wait is not read: the first batch's wait is the loader's start (a
#: DataLoader spawning its workers, opening files, filling its prefetch), seconds once, which the
#: hint's advice (more workers) would not change. Past them a loader that cannot keep up still shows
#: in every window; one that restarts each epoch (not persistent) shows there too.
INPUT_WARMUP_STEPS = 3
#: Fewest steps in the window for its longest wait to be left out as a pause (see input_wait).
PAUSE_MIN_STEPS = 4


def input_wait(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per rank: Σ input wait ÷ Σ step time over the last ``window_steps`` steps (past the run's
    first INPUT_WARMUP_STEPS), and how much the device idles (a wait costs nothing while the GPU
    still works through queued kernels)."""
    out: dict[str, Measurement | None] = {}
    for r in latest_ranks(job):
        if r.status in ENDED or not feeds_itself(r):  # a later pipeline stage waits for activations
            continue
        h = r.history
        n = min(len(h.step_time_s), len(h.input_wait_s), max(rule.window_steps, 1))
        if n:
            if len(h.steps) >= n:
                last = h.steps[-n:]
                if min(last) <= INPUT_WARMUP_STEPS:  # past the warm-up (nearly always): all n count
                    n = sum(1 for s in last if s > INPUT_WARMUP_STEPS)
            else:  # a history of the shown columns only (a large job's): the steps up to r.step
                n = min(n, max(0, r.step - INPUT_WARMUP_STEPS))
            if not n:
                out[rank_target(r)] = None  # only the loader's start so far
                continue
        wait: float | None  # None: no history, only the probe's own fraction
        pause: float | None = None
        if n:
            # Each window's values once, as arrays that sum, search and slice in C: a view's
            # slice was made and walked again by every read below (thousands of ranks a share).
            steps = flat(h.step_time_s[-n:])
            waits = flat(h.input_wait_s[-n:])
            total = finite_sum(steps)
            wait = finite_sum(waits)
            if n >= PAUSE_MIN_STEPS and math.isfinite(wait) and (longest := max(waits)) > 0.5 * wait:
                # One step's wait is most of the window's: whatever ran between two steps (a
                # checkpoint, an eval) and is no loader's; the more workers advised would not help.
                pause = longest
                total -= steps[waits.index(longest)]
                wait -= longest
                n -= 1
            frac = safe_div(wait, total)
            covered = n
        elif finite(r.input_wait_frac):
            frac, covered = float(r.input_wait_frac), 0
            wait = None
        else:
            out[rank_target(r)] = None
            continue
        ev: dict[str, Any] = {
            "input_wait_pct": 100.0 * frac,
            "window_steps": covered,
            "input_wait_s_per_step": wait / n if n and wait is not None else None,
            "step_time_s": median_of(r, steps[len(steps) - n:]) if n else r.step_time_s,
            "device_idle_pct": device_idle_pct(r, now),
            "pause_left_out_s": pause,
        }
        out[rank_target(r)] = Measurement(
            value=ev["input_wait_pct"], evidence=ev, impact=clamp01(min(frac, ev["device_idle_pct"] / 100.0)),
            step=r.step, steps_covered=covered,
        )
    return out
