"""Plain-text rendering of a snapshot (``flowtop snapshot`` without ``--json``)."""

from __future__ import annotations

from typing import Sequence

from flowtop.monitor.format import attention_shown, ended_note, fmt_coords, fmt_ranks, fmt_si
from flowtop.monitor.format import fmt_pct as pct
from flowtop.monitor.format import fmt_time as seconds
from flowtop.monitor.hints import HintGroup, grouped, hint_line
from flowtop.monitor.moe_load import ExpertLoad
from flowtop.monitor.precision import bf16_eq_differs
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot, RankSnapshot, RelaySnapshot
from flowtop.monitor.snapshot_json import peak_per_rank


def si(value: float | None) -> str:
    """A plain count with an SI prefix."""
    return fmt_si(value)


def flops_rate(value: float | None) -> str:
    """FLOP/s with prefix."""
    return fmt_si(value, "FLOP/s")


def render(snap: MonitorSnapshot) -> str:
    """A compact table per job, the same figures the TUI shows."""
    lines: list[str] = []
    if not snap.jobs:
        lines.append(f"no probes heard on {snap.listen} (received {snap.received}, rejected {snap.rejected})")
    for job in snap.jobs:
        f = job.flops
        lines.append(
            f"job {job.job}  ranks {job.ranks_seen}/{job.world_size}  step {job.step}  "
            f"step {seconds(job.step_time_s)}  tokens/s {si(job.tokens_per_s)}  {job.status_text}"
        )
        mixed = any(r.flops is not None and bf16_eq_differs(r.flops.precision, r.flops.mfu_bf16) for r in job.ranks)
        if f is not None:
            bf16 = f"  MFU bf16-eq {pct(f.mfu_bf16)}" if mixed else ""
            lines.append(
                f"  model {flops_rate(f.flops_per_s)}  MFU {pct(f.mfu)}{bf16}  HFU {pct(f.hfu)}  "
                f"[{f.dtype}, attention {attention_shown(f)}, {job_peak(job)}]"
                + (f"  ({job.over_phrase})" if job.over_phrase else "")  # some ranks unheard: left out
            )
            if f.expert_load is not None:
                lines.append(f"  experts: {_experts(f.expert_load)}")
        elif job.over_phrase:  # no figures while ranks are unheard: say why, as the TUI header does
            lines.append(f"  MFU n/a ({job.no_count_reason})")
        if job.tokens_basis and job.tokens_per_s is not None:  # how a figure counts, where there is one
            lines.append(f"  tokens/s: {job.tokens_basis}")
        for s in job.stages:
            stages = ",".join(map(str, s.stages)) or "?"
            share = pct(s.flops_share)
            lines.append(f"  pp {s.pp_rank} (stage {stages}, ranks {','.join(map(str, s.ranks))}): "
                         f"{si(s.model_flops_per_step)}FLOP/step ({share} of the pipeline)  "
                         f"compute {seconds(s.stage_time_s)}/step  step {seconds(s.step_time_s)}")
        lines.extend(_rank_lines(job, mixed, snap.taken_at))
        lost = sum(r.lost_messages for r in job.ranks)
        dropped = sum(r.dropped_messages for r in job.ranks)
        if lost or dropped:
            lines.append(f"  messages: {lost} missing (sequence gaps: lost in transit or refused here), "
                         f"{dropped} dropped by the probes' queues (the oldest, while nothing took them: "
                         "no monitor yet, a dead relay, or one behind)")
        for row in grouped(job.hints, job.ranks):  # a hint many ranks share: one line
            h = row.lead if isinstance(row, HintGroup) else row
            ended = f" {ended_note(h.first_step, h.last_step)}" if h.ended else ""
            lines.append(f"  [{h.severity}]{ended} {hint_line(row, snap.taken_at).text()} -> {h.action}")
    if snap.relays:
        replaced = replaced_relays(snap.relays)
        lines.append(f"relays: {len(snap.relays)} ({relay_states(snap.relays, replaced)})")
        lines.extend(_relay_line(x, x.relay in replaced) for x in snap.relays)
    return "\n".join(lines)


def _relay_line(x: RelaySnapshot, replaced: bool) -> str:
    """A relay's line. ``ranks``: whose latest frame came through it (the JSON's), the monitor's
    own count; the rest is the relay's own figures, from its latest report. Before its first (no
    ``listen``: every report names it) it has none: "no report yet", not the 0s of the JSON (a
    successor read "(0 connected)  frames 0/0  drops 0" beside its predecessor). Connections are
    said of a live relay only: a silent or closed one's are as it last reported, gone with it (a
    replaced relay read "ranks 0 (1 connected)" until the monitor forgot it, 10 minutes on)."""
    head = f"  {x.host[:24]:<24} pid {x.pid:<7} {x.status:<6} ranks {x.ranks:>3}"
    tail = f"heard {seconds(x.age_s)} ago{'  replaced by a newer relay of its host' if replaced else ''}"
    if x.listen is None:
        return f"{head} (no report yet)  {tail}"
    connected = f" ({x.ranks_connected} connected)" if x.status == "live" and x.ranks_connected != x.ranks else ""
    flood = f"  commands dropped {x.commands_dropped:,} (a flood)" if x.commands_dropped else ""
    return f"{head}{connected}  frames {x.frames_in}/{x.frames_out}  drops {x.drops}{flood}  {tail}"


def replaced_relays(relays: Sequence[RelaySnapshot]) -> set[str]:
    """Ids of the silent or closed relays whose host has one on the same address heard after them
    (live, or closed since: a job's end): replaced (another flowtop run took the node's socket
    over), not a node that went dark. The monitor lists
    a relay until it has been silent for FORGET_AFTER_S (flowtop.monitor.relays), so 3 nodes read
    'relays: 4 (3 live, 1 silent)' after one relay's host was killed, as if a fourth node were
    missing (a trial). Two relays of one host on two addresses serve different ranks: neither
    replaces the other."""
    newest: dict[tuple[str, str], float] = {}  # (host, address) -> the least age of its relays
    for x in relays:
        if x.listen:
            key = (x.host, x.listen)
            newest[key] = min(newest.get(key, x.age_s), x.age_s)
    return {x.relay for x in relays
            if x.status != "live" and x.listen and newest[(x.host, x.listen)] < x.age_s}


def relay_states(relays: Sequence[RelaySnapshot], replaced: set[str]) -> str:
    """'3 live, 1 silent: replaced on node1 by a newer relay': counts by status, and of the silent
    and closed ones, which were replaced and on which hosts (at most 3 named)."""
    parts = []
    for st in ("live", "silent", "closed"):
        these = [x for x in relays if x.status == st]
        if not these:
            continue
        part = f"{len(these)} {st}"
        hosts = sorted({x.host for x in these if x.relay in replaced})
        if hosts:
            n = sum(x.relay in replaced for x in these)
            named = ", ".join(hosts[:3]) + (", …" if len(hosts) > 3 else "")
            part += f": {'' if n == len(these) else f'{n} '}replaced on {named} by a newer relay"
        parts.append(part)
    return ", ".join(parts)



def job_peak(job: JobSnapshot) -> str:
    """The peak the job's MFU divides by, a sum over its ranks, and where a rank's comes from:
    'peak 2 × 78GFLOP/s (per rank: estimated: 1 core × ...)' (the line had said only the rank's
    source, as if it were the job's); 'summed over the ranks' where their peaks differ."""
    f = job.flops
    if f is None:
        return "peak n/a"
    source = f" (per rank: {f.peak_source})" if f.peak_source else ""
    if not f.peak_flops:
        return f"peak n/a{source}"
    split = peak_per_rank(job)  # the JSON's peak_ranks and peak_per_rank_flops
    if split is not None:
        return f"peak {split.ranks} × {flops_rate(split.flops)}{source}"
    return f"peak {flops_rate(f.peak_flops)} summed over the ranks{source}"


def _rank_lines(job: JobSnapshot, mixed: bool, now: float) -> list[str]:
    """The rank table: MFU with the bf16-equivalent beside it when the job's precision mix is not
    pure bf16, and the parallel coordinates when the job has them (as in the TUI's rank table)."""
    coords = any(r.coords for r in job.ranks)
    width = max(6, max((len(fmt_coords(r.coords)) for r in job.ranks), default=0))
    bf16 = f" {'bf16eq':>6}" if mixed else ""
    out = [f"  {'rank':>4} {'host':<16} {'step':>7} {'time':>9} {'tok/s':>8} {'FLOP/s':>10} {'MFU':>6}{bf16}  "
           + (f"{'coords':<{width}}  " if coords else "") + "status"]
    for r in job.ranks:
        rf = r.flops
        place = f"{fmt_coords(r.coords) or '?':<{width}}  " if coords else ""
        out.append(
            f"  {r.rank:>4} {r.host[:16]:<16} {r.step:>7} {seconds(r.step_time_s):>9} {si(r.tokens_per_s):>8} "
            f"{flops_rate(rf.flops_per_s if rf else None):>10} {pct(rf.mfu if rf else None):>6}"
            + (f" {pct(rf.mfu_bf16 if rf else None):>6}" if mixed else "")
            + f"  {place}{r.status}" + (f" ({why})" if (why := _why(r, now)) else "")
        )
    return out


def _experts(x: ExpertLoad) -> str:
    """The job's expert load: max/mean of its worst expert-parallel group (flowtop.monitor.parallelism)."""
    ratio = "n/a" if x.max_over_mean is None else f"{x.max_over_mean:.2f}"
    rank_ratio = "n/a" if x.rank_max_over_mean is None else f"{x.rank_max_over_mean:.2f}"
    worst = f" (worst: ranks {fmt_ranks(x.worst_group)}, layer {x.worst_layer})" if x.worst_group else ""
    return (f"max/mean {ratio} tokens per expert{worst}; rank max/mean {rank_ratio}; "
            f"{x.grouping or 'one rank'}")


def _why(r: RankSnapshot, now: float) -> str:
    """What a rank's status cell adds: its status reason at ``now`` (a relay's silence, with its
    seconds), for a failed rank the exception it ended of (its bye), for a stopped one the signal
    that ended it ("stopped (SIGTERM)": a launcher stopping the survivors of a crash, scancel, preemption)."""
    if r.status in ("failed", "stopped") and r.bye_reason:
        return r.bye_reason
    return r.status_reason_at(now)
