"""The snapshot's documented, versioned JSON form (README "Snapshot JSON"; its JSON Schema ships
in the package): what `flowtop snapshot --json`, `flowtop demo --headless`, the metrics
endpoint's /snapshot.json and recordings' readers print. No Textual.

Durations that grow with the clock (ages, stalls) are said at the snapshot's ``taken_at``.
Instants (``taken_at``, a rank's ``ended_at``) are all on the monitor's clock
(flowtop.monitor.clock: monotonic, its own pauses left out), not the wall clock: ``taken_at -
ended_at`` is how long ago a rank ended, and two instants' difference is the same in a replay as
live; a replay's instants themselves count from the recording's start (its times are kept so),
the live monitor's from its own. The monitor keeps no wall-clock anchor to convert them with.
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from typing import Any, Mapping, Sequence

from flowtop.monitor.snapshot import (EXECUTED_FLOPS_NOTE, FLOPS_PER_S_NOTE, MODEL_FLOPS_NOTE, FlopsView, Hint,
                                      JobSnapshot, MonitorSnapshot, RankSnapshot, RelaySnapshot, StageView,
                                      TelemetryView, ending_time, first_ending)
from flowtop.monitor import parallelism
from flowtop.monitor.relayviews import NO_COUNT_REASON, unheard_hosts

#: Version of the JSON snapshot layout (bump MINOR for added fields, a field that may now be null
#: (1.7's tokens_per_step; the schema file says which fields are nullable), or a new value of an
#: enumeration (1.8: the "failed" status of ranks and jobs; 1.13: the "stopped" status, a job's
#: ``stopped_by``; 1.14: a rank's ``ended_at``, a job's ``first_ending``).
SCHEMA = "flowtop.snapshot/1.14"
#: The JSON Schema (draft 2020-12) of that layout, shipped in the package.
SCHEMA_FILE = "schema/snapshot.schema.json"


def json_schema() -> dict[str, Any]:
    """The JSON Schema every ``to_json`` result satisfies (every field required, null where a
    value can be unknown, no field it does not name)."""
    return json.loads(resources.files("flowtop").joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def jsonable(obj: Any) -> Any:
    """Make a value JSON-safe: dataclasses to dicts (their fields, and the properties a class lists
    in ``JSON_DERIVED``), NaN/inf to None, tuples (and sequences whose class sets ``JSON_LIST``) to lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        for name in getattr(obj, "JSON_DERIVED", ()):  # properties computed rather than stored
            out[name] = jsonable(getattr(obj, name))
        return out
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or getattr(obj, "JSON_LIST", False):  # or a table of columns
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


#: FLOP fields of a rank and of a job in the JSON, in this order (README "Snapshot JSON").
FLOP_FIELDS: tuple[str, ...] = (
    "flops_per_step", "executed_flops_per_step", "estimated_flops_per_step", "estimate_source",
    "estimate_ratio", "flops_per_s", "executed_flops_per_s", "mfu", "hfu", "peak_flops", "peak_source",
    "dtype", "attention_convention", "flops_per_token", "uncounted_ops", "counted_at_step", "mfu_reason",
    "counted", "model_note", "uncounted_size", "parallel", "mfu_bf16", "precision", "expert_load",
    "nonpad_tokens", "nonpad_frac", "attention_masking", "peak_kind",
)


def _flops_json(f: FlopsView | None, taken_at: float) -> dict[str, Any]:
    """Every FLOP field, always: ``null`` where unknown (a reader must not guess at absences);
    a stall's ``mfu_reason`` as of ``taken_at``."""
    if f is None:
        d: dict[str, Any] = dict.fromkeys(FLOP_FIELDS)
        d["mfu_reason"] = NO_COUNT_REASON
        return d
    d = jsonable(f)
    d["flops_per_step"] = d.pop("model_flops_per_step")
    d["estimate_ratio"] = f.estimate_ratio
    d["mfu_reason"] = f.reason_at(taken_at)
    from flowtop.monitor.moe_load import load_json

    d["expert_load"] = load_json(f.expert_load)  # the summary; per-layer tables stay in memory
    return {k: d[k] for k in FLOP_FIELDS}


def rank_json(r: RankSnapshot, taken_at: float, with_kernels: bool = True) -> dict[str, Any]:
    """JSON form of one rank of a snapshot taken at ``taken_at`` (ages are relative to it)."""
    d: dict[str, Any] = {
        "rank": r.rank,
        "host": r.host,
        "pid": r.pid,
        "local_rank": r.local_rank,
        "incarnation": r.incarnation,
        "device": r.device,
        "status": r.status,
        "step": r.step,
        "step_time_s": r.step_time_s,
        "device_time_s": r.device_time_s,
        "tokens_per_step": r.tokens_per_step,
        "tokens_per_s": r.tokens_per_s,
        "input_wait_frac": r.input_wait_frac,
        "age_s": r.age_s(taken_at),
        "behind_s": r.behind_s,
        "lost_messages": r.lost_messages,
        "dropped_messages": r.dropped_messages,
        "probe_overhead_frac": r.probe_overhead_frac,
        "bye_reason": r.bye_reason,
        # when it said bye, on taken_at's clock (snapshot.RankSnapshot.ended_at); null until its bye came
        "ended_at": r.ended_at,
        "commands_refused": r.commands_refused,
        "commands_dropped": r.commands_dropped,
        "conflict": jsonable(r.conflict),
        "relay": r.relay,
        "status_reason": r.status_reason_at(taken_at),
        "coords": {role: {"rank": rk, "size": sz} for role, (rk, sz) in r.coords.items()} if r.coords else None,
        "coords_source": r.coords_source,
        "pp_stages": list(r.pp_stages),
        "stage_time_s": r.stage_time_s,
    }
    d.update(_flops_json(r.flops, taken_at))
    d["telemetry"] = _telemetry_json(r.telemetry, taken_at)
    # Present always; null before a window arrives and where left out (the demo's compact JSON).
    d["kernels"] = jsonable(r.kernels) if with_kernels else None
    return jsonable(d)


def first_ending_json(ranks: Sequence[RankSnapshot]) -> dict[str, Any] | None:
    """The job's cause of ending (snapshot.first_ending: of its failed and stopped ranks, the
    first to say bye by its send time): which process (its incarnation: a restart's), its status
    and bye reason, and when (on ``taken_at``'s clock, as its rank's ``ended_at``); null where
    none failed or was stopped (running, or every ending a clean "done")."""
    first = first_ending(ranks)
    if first is None:
        return None
    return {"rank": first.rank, "host": first.host, "pid": first.pid, "incarnation": first.incarnation,
            "status": first.status, "bye_reason": first.bye_reason, "ended_at": ending_time(first)}


#: Fields of a hint in the JSON, in this order (README "Snapshot JSON").
HINT_FIELDS: tuple[str, ...] = ("id", "severity", "scope", "target", "summary", "evidence", "action", "impact",
                                "ended", "first_step", "last_step")


def hint_json(h: Hint, taken_at: float) -> dict[str, Any]:
    """JSON form of one hint of a snapshot taken at ``taken_at`` (a clock's figures as of then)."""
    d = {name: getattr(h, name) for name in HINT_FIELDS}
    d["summary"], d["evidence"] = h.summary_at(taken_at), h.evidence_at(taken_at)
    return jsonable(d)


def _telemetry_json(t: TelemetryView | None, taken_at: float) -> dict[str, Any] | None:
    if t is None:
        return None
    return {"device": jsonable(t.device), "host": jsonable(t.host), "reasons": jsonable(t.reasons),
            "age_s": t.age_s(taken_at)}


def _stage_json(s: StageView) -> dict[str, Any]:
    return {"pp_rank": s.pp_rank, "stages": list(s.stages), "ranks": list(s.ranks),
            "flops_per_step": s.model_flops_per_step, "flops_share": s.flops_share,
            "stage_time_s": s.stage_time_s, "step_time_s": s.step_time_s}


@dataclasses.dataclass(frozen=True, slots=True)
class PeakPerRank:
    """A job's peak as ``ranks`` × one rank's ``flops``: the job's ``peak_source`` describes that
    one rank's peak (a trial read a 1-core estimate beside a 6-rank sum as the job's)."""

    ranks: int
    flops: float


def peak_per_rank(job: JobSnapshot) -> PeakPerRank | None:
    """The job's summed peak split into equal ranks; None without a peak or where the ranks'
    peaks differ (the sum is then all there is)."""
    f = job.flops
    if f is None or not f.peak_flops:
        return None
    # The ranks whose peaks the sum holds: not those unheard, nor their replica (parallelism.whole_replicas).
    counted, _ = parallelism.whole_replicas(job.ranks)
    per_rank = {r.flops.peak_flops for r in counted if r.flops is not None and r.flops.peak_flops}
    if len(per_rank) != 1:
        return None
    (peak,) = per_rank
    ranks = f.peak_flops / peak
    # the sum is of floats: equal peaks sum to a multiple up to rounding
    if round(ranks) >= 1 and abs(ranks - round(ranks)) < 1e-6 * ranks:
        return PeakPerRank(round(ranks), peak)
    return None


def to_json(snap: MonitorSnapshot, with_kernels: bool = True) -> dict[str, Any]:
    """The documented JSON snapshot (``schema`` names its version)."""
    jobs = []
    for j in snap.jobs:
        job: dict[str, Any] = {
            "job": j.job,
            "world_size": j.world_size,
            "ranks_seen": j.ranks_seen,
            "status": j.status,
            "stopped_by": list(j.stopped_by),  # what ended its stopped ranks ("SIGTERM"); [] where none
            "first_ending": first_ending_json(j.ranks),
            "step": j.step,
            "step_time_s": j.step_time_s,
            "tokens_per_s": j.tokens_per_s,
            "tokens_per_s_basis": j.tokens_basis,
            "rank_conflicts": j.rank_conflicts,
            # Ranks cut off behind a silent or closed relay: the job's figures leave them out.
            "unheard_ranks": len(j.unheard),
            "unheard_relays": list(unheard_hosts([r.cut for r in j.ranks])),
            "pipeline_stages": [_stage_json(s) for s in j.stages],
        }
        split = peak_per_rank(j)
        job["peak_ranks"] = split.ranks if split else None
        job["peak_per_rank_flops"] = split.flops if split else None
        job.update(_flops_json(j.flops, snap.taken_at))
        if j.flops is None:  # what its figures would be over: no rank heard is not "no FLOP count yet"
            job["mfu_reason"] = j.no_count_reason
        job["ranks"] = [rank_json(r, snap.taken_at, with_kernels) for r in j.ranks]
        job["hints"] = [hint_json(h, snap.taken_at) for h in j.hints]
        jobs.append(job)
    return jsonable(
        {
            "schema": SCHEMA,
            "taken_at": snap.taken_at,
            "listen": snap.listen,
            "conventions": {
                "model_flops": MODEL_FLOPS_NOTE,
                "executed_flops": EXECUTED_FLOPS_NOTE,
                "flops_per_s": FLOPS_PER_S_NOTE,
            },
            "received": snap.received,
            "rejected": snap.rejected,
            "rejected_reasons": dict(snap.rejected_reasons),
            "ranks_evicted_for_room": snap.ranks_evicted_for_room,
            "relays": [relay_json(r) for r in snap.relays],
            "jobs": jobs,
        }
    )


#: Fields of a relay in the JSON snapshot, in this order (README "Snapshot JSON").
RELAY_FIELDS: tuple[str, ...] = tuple(RelaySnapshot.__dataclass_fields__)


def relay_json(r: RelaySnapshot) -> dict[str, Any]:
    """JSON form of one relay (every field, null where unknown)."""
    return {name: getattr(r, name) for name in RELAY_FIELDS}
