"""The fields of each message kind and their checks: the table :func:`probe.wire.decode`
validates a frame's fields against (the envelope is :mod:`probe.wire`'s own).

Apart from the package's encoding and decoding code because it is data, not logic: one entry per
kind, one line per field, each with the comment that says what the field means; a new field is
added here and nowhere else.
"""

from __future__ import annotations

from typing import Any

from probe.wire.checks import (
    Check, _coords, _counts, _flat_map, _int, _int_list, _int_lists, _num, _num_map, _opt, _str, _str_list,
)
from probe.wire.flops import MIX_PEAK_KINDS, PEAK_KINDS
from probe.wire.hello import LAST_STEP_CHECK, STEP_AGE_CHECK
from probe.wire.kernels import KERNEL_MAX_NAME, KERNEL_MAX_NAMES, _kernel_acts, _kernel_ops

#: Most step records one "steps"/"stepcols" frame may carry (a rank flushes every FLOWTOP_FLUSH_S anyway).
MAX_BATCH = 512


def _step_records(v: Any) -> bool:
    """A "steps" batch: 1..MAX_BATCH maps, each a valid "step" message's fields."""
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_BATCH:
        return False
    schema = SCHEMA["step"]
    for rec in v:
        if not isinstance(rec, dict):
            return False
        for name, (required, check) in schema.items():
            if name in rec:
                if not check(rec[name]):
                    return False
            elif required:
                return False
    return True


# kind -> {field: (required, check)}
SCHEMA: dict[str, dict[str, tuple[bool, Check]]] = {
    "hello": {
        "local_rank": (True, _int(0, 1 << 20)),
        "world_size": (True, _int(1, 1 << 24)),
        "device": (True, _str(256)),
        "probe_version": (True, _str(64)),
        "argv": (False, _str_list(64, 1024)),
        # Where the rank came from: "argument", a launcher variable ("RANK", ...), "process
        # group" or "none" (nothing said: rank 0 by default, which several processes may claim).
        "rank_source": (False, _str(32)),
        # Parallel coordinates of this rank (probe.steps.parallel): role ("dp", "tp", "pp", "cp", "ep")
        # -> [rank, size], read from the device mesh and the pipeline stage; where they came from;
        # the pipeline stage indices this rank runs. Absent: not known (the monitor then sums tokens).
        "coords": (False, _coords),
        "coords_source": (False, _str(256)),
        "pp_stages": (False, _int_list(64)),
        # The rank's last completed step and the seconds since that boundary when this hello was
        # built (added within 1.3; probe.steps.tracker.StepTracker.hello_step): a monitor started
        # while the rank hangs in a collective knows how long it has (flowtop.monitor.rankstate).
        # Absent before the first step and between a sweep's models.
        "last_step": (False, LAST_STEP_CHECK),
        "step_age_s": (False, STEP_AGE_CHECK),
    },
    "step": {
        "step": (True, _int()),
        "wall_s": (True, _num(0, 1e7)),
        # Device time of step ``dstep`` (CUDA events are read a few steps late).
        "device_s": (False, _opt(_num(0, 1e7))),
        "dstep": (False, _opt(_int())),
        "tokens": (True, _int()),
        "input_wait_s": (False, _opt(_num(0, 1e7))),
        "lead_s": (False, _opt(_num(0, 1e7))),
        "micro_batches": (False, _int(0, 1 << 20)),
        "probe_s": (False, _opt(_num(0, 1e7))),
        # Compute time of this rank's pipeline stage(s) in a recent step: its forward and backward
        # chunks, waits for neighbour stages excluded (probe.steps.pipeline); absent outside pipelines.
        "stage_s": (False, _opt(_num(0, 1e7))),
        "drops": (True, _int()),
        # Monitor commands this rank refused so far (rate limit or malformed).
        "commands_refused": (False, _int()),
        # Monitor commands it dropped unread so far: over its bound (probe.transport.gate), a flood.
        "commands_dropped": (False, _int()),
    },
    # Several step records of one rank in one frame (MINOR 2): a rank sends at most one frame
    # per flush interval whatever its step rate. Each record has the "step" fields.
    "steps": {
        "records": (True, _step_records),
    },
    # Step records as columns (MINOR 3, probe.wire.steps): validated as a whole by
    # probe.wire.steps.decode_fields, not field by field.
    "stepcols": {},
    "bye": {
        "reason": (True, _str(256)),
        "steps": (True, _int()),
        "drops": (True, _int()),
    },
    "flops": {
        "step": (True, _int()),
        "model_flops": (True, _num(0, 1e30)),
        "executed_flops": (True, _num(0, 1e30)),
        "estimated_flops": (False, _opt(_num(0, 1e30))),
        "estimate_source": (False, _opt(_str(256))),
        "attention": (True, lambda v: v in ("full", "causal")),
        # The counted step's attention calls: all causal, all bidirectional, or both (absent: not read)
        "attention_masking": (False, lambda v: v in ("causal", "bidirectional", "mixed")),
        "dtype": (True, _str(16)),
        "peak_flops": (False, _opt(_num(0, 1e30))),
        "peak_source": (True, _str(512)),
        "peak_kind": (False, lambda v: v in PEAK_KINDS),
        "uncounted": (True, _counts()),
        # FLOP-like size per uncounted op in the step (probe.flops.uncounted), to weigh them by
        "uncounted_size": (False, _counts()),
        "tokens": (True, _int()),
        "signature": (False, _str(4096)),
        "cost_s": (False, _opt(_num(0, 1e7))),
        # False: the figures are the model-shape estimate, not a count (compiled code forbids one)
        "counted": (False, lambda v: isinstance(v, bool)),
        # How model FLOPs were derived where they are not a plain count (e.g. a bounded backward)
        "model_note": (False, _str(256)),
        # Mesh and placements under DTensor parallelism; the figures are then this rank's local ones
        "parallel": (False, _str(256)),
        # Precision (probe.flops.precision): [model, executed] FLOPs per operand dtype label, and the
        # dense peak of each label on this device (a label without one is absent)
        "flops_by_dtype": (False, _num_map(32, 16, width=2)),
        "peak_by_dtype": (False, _num_map(32, 16)),
        # Where those peaks come from (wire 1.4): a peak kind, or "mixed" where they differ
        "peak_by_dtype_kind": (False, lambda v: v in MIX_PEAK_KINDS),
        # MoE (probe.flops.moe): tokens per local expert of each MoE layer in the counted step
        "expert_load": (False, _int_lists(256, 128, 4096)),
        # Non-padding tokens of the counted step (the root's attention_mask), beside "tokens"
        "nonpad_tokens": (False, _int()),
    },
    "kernels": {
        "window": (True, _int()),
        "step": (True, _int()),
        "device": (True, lambda v: v in ("cuda", "cpu")),
        "step_dur_us": (True, _num(0, 1e13)),
        "typical_step_us": (False, _num(0, 1e13)),
        # Raw records of the profiled step, times in µs from the window start; the monitor
        # links and attributes them (flowtop.monitor.kernels.trace.window_from_wire).
        "names": (True, _str_list(KERNEL_MAX_NAMES, KERNEL_MAX_NAME)),
        "ops": (True, _kernel_ops),
        "acts": (True, _kernel_acts),
        "cost_s": (False, _opt(_num(0, 1e7))),
    },
    "telemetry": {
        "gpu": (True, _flat_map()),
        "proc": (True, _flat_map()),
        "reasons": (False, _flat_map()),
    },
    # A node relay's own figures (flowtop.tools.relay), about once a second beside the rank frames it
    # forwards. Not a rank: the monitor keeps relays apart (flowtop.monitor.relays). Envelope: job "",
    # rank 0, the relay's host and pid.
    "relay": {
        "relay": (True, _str(300)),  # relay id "host:pid:nonce" (its batches' stamps name it)
        "listen": (True, _str(1024)),  # where its ranks connect
        "upstream": (True, _str(1024)),
        "ranks": (True, _int(0, 1 << 20)),  # rank connections now
        "frames_in": (True, _int()),
        "frames_out": (True, _int()),
        "bytes_in": (True, _int()),
        "bytes_out": (True, _int()),
        "drops": (True, _int()),  # frames it dropped (upstream away past the age limit, queue full)
        "queued": (True, _int()),
        "commands": (True, _int()),  # monitor commands carried down
        "link_ups": (True, _int()),  # upstream connections made (1 + reconnects)
        "uptime_s": (True, _num(0, 1e10)),
        "closing": (False, lambda v: isinstance(v, bool)),  # its last report: it hands over or ends
        "hosted_by": (False, _str(64)),  # "flowtop relay" or "flowtop run"
        # Monitor commands it dropped unread so far: over the wire's bound (probe.wire.command_bound), a flood.
        "commands_dropped": (False, _int()),
    },
}
