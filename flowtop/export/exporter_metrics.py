"""What the exporter writes per rank, per job and per node: name, unit, help and where the value
comes from in a snapshot (flowtop.export.exporter builds the families from these tables; the README's
metric list is held to a real scrape by tests/test_prometheus.py). No Textual.
"""

from __future__ import annotations

from typing import Any, Callable

from flowtop.monitor.snapshot import JobSnapshot, RankSnapshot
from flowtop.monitor.telemetry import GPU_UTIL, TENSOR, fraction


def _flops(attr: str) -> Callable[[Any], float | None]:
    return lambda x: getattr(x.flops, attr) if x.flops is not None else None


def _busy(r: RankSnapshot) -> float | None:
    anatomy = getattr(r.kernels, "anatomy", None)
    return getattr(anatomy, "busy_frac", None)


# (name without the unit, unit, help, value of a rank); a None value leaves the sample out.
RANK_GAUGES: tuple[tuple[str, str, str, Callable[[RankSnapshot], float | None]], ...] = (
    ("flowtop_rank_model_flops_per_second", "", "Model FLOP/s of the rank (MFU's numerator)", _flops("flops_per_s")),
    ("flowtop_rank_executed_flops_per_second", "", "Executed FLOP/s (HFU's numerator: recompute included)",
     _flops("executed_flops_per_s")),
    ("flowtop_rank_mfu", "ratio", "Model FLOP/s / dense peak of the dtype in use", _flops("mfu")),
    ("flowtop_rank_hfu", "ratio", "Executed FLOP/s / dense peak of the dtype in use", _flops("hfu")),
    ("flowtop_rank_peak_flops_per_second", "", "Dense peak FLOP/s the rank's MFU is against", _flops("peak_flops")),
    # Not a cut rank's (as last heard): the rank map's step-time cell and the node's max leave it out.
    ("flowtop_rank_step", "seconds", "Median wall time of the rank's recent steps (absent while unheard "
     "behind a silent relay)", lambda r: r.step_time_s if r.cut is None else None),
    ("flowtop_rank_device_step", "seconds", "Device (CUDA event) time of the latest step", lambda r: r.device_time_s),
    ("flowtop_rank_tokens_per_second", "", "Tokens per second (0 while stalled or stale; absent while unheard "
     "behind a silent relay)", lambda r: r.tokens_per_s),
    ("flowtop_rank_tokens_per_step", "", "Tokens entering the first embedding per step", lambda r: r.tokens_per_step),
    ("flowtop_rank_input_wait", "ratio", "Share of the step spent waiting for input", lambda r: r.input_wait_frac),
    ("flowtop_rank_device_busy", "ratio", "Share of the last kernel window's step with device work", _busy),
    ("flowtop_rank_gpu_utilization", "ratio", "NVML GPU utilisation", lambda r: fraction(r.telemetry, GPU_UTIL)),
    ("flowtop_rank_tensor_active", "ratio", "GPM tensor-pipe activity", lambda r: fraction(r.telemetry, TENSOR)),
    ("flowtop_rank_probe_overhead", "ratio", "The probe's own training-thread time / step",
     lambda r: r.probe_overhead_frac),
    ("flowtop_rank_step_index", "", "The rank's latest step", lambda r: r.step),
)
RANK_COUNTERS: tuple[tuple[str, str, Callable[[RankSnapshot], int]], ...] = (
    ("flowtop_rank_lost_messages", "Probe messages lost on the way (sequence gaps)", lambda r: r.lost_messages),
    ("flowtop_rank_dropped_messages", "Messages the probe's bounded queue dropped", lambda r: r.dropped_messages),
)
JOB_GAUGES: tuple[tuple[str, str, str, Callable[[JobSnapshot], float | None]], ...] = (
    # The job's figures are over its heard ranks: those unheard behind a silent or closed relay
    # (flowtop_job_unheard_ranks) are left out of the sums and the peaks alike.
    ("flowtop_job_model_flops_per_second", "", "Model FLOP/s summed over the job's heard ranks",
     _flops("flops_per_s")),
    ("flowtop_job_executed_flops_per_second", "", "Executed FLOP/s summed over the job's heard ranks",
     _flops("executed_flops_per_s")),
    ("flowtop_job_mfu", "ratio", "Job MFU: sum of model FLOP/s / sum of peaks, over the heard ranks", _flops("mfu")),
    ("flowtop_job_hfu", "ratio", "Job HFU: sum of executed FLOP/s / sum of peaks, over the heard ranks",
     _flops("hfu")),
    ("flowtop_job_peak_flops_per_second", "", "Sum of the heard ranks' dense peaks", _flops("peak_flops")),
    ("flowtop_job_step", "seconds", "The slowest heard rank's median step time (absent with every rank unheard)",
     lambda j: j.step_time_s),
    ("flowtop_job_tokens_per_second", "", "Tokens per second of the job's heard ranks, counted once per "
     "data-parallel replica (summed over every rank where no mesh is known; the JSON's tokens_per_s_basis says which)",
     lambda j: j.tokens_per_s),
    ("flowtop_job_step_index", "", "Lowest step among the live heard ranks", lambda j: j.step),
    ("flowtop_job_world_size", "", "World size the ranks report", lambda j: j.world_size),
    ("flowtop_job_ranks_seen", "", "Distinct rank numbers that said hello", lambda j: j.ranks_seen),
    ("flowtop_job_rank_conflicts", "", "Rank numbers claimed by more than one live process",
     lambda j: j.rank_conflicts),
    ("flowtop_job_unheard_ranks", "", "Rank processes unheard behind a silent or closed node relay: the job's "
     "FLOP/s, MFU and tokens/s leave them out (with their data-parallel replicas where the mesh is known)",
     lambda j: len(j.unheard)),
)
#: Per-node aggregates (flowtop.monitor.rankview.NodeGroup) of a job above the rank cap.
NODE_GAUGES: tuple[tuple[str, str, str, Callable[[Any], float | None]], ...] = (
    ("flowtop_node_ranks", "", "Rank processes on the node", lambda g: len(g.ranks)),
    ("flowtop_node_model_flops_per_second", "", "Model FLOP/s summed over the node's ranks", lambda g: g.flops_per_s),
    ("flowtop_node_tokens_per_second", "", "Tokens per second summed over the node's ranks",
     lambda g: g.tokens_per_s),
    ("flowtop_node_mfu_min", "ratio", "Lowest MFU among the node's ranks", lambda g: g.mfu_min),
    ("flowtop_node_mfu_median", "ratio", "Median MFU of the node's ranks", lambda g: g.mfu_median),
    ("flowtop_node_step_max", "seconds", "Slowest median step time among the node's heard ranks",
     lambda g: g.step_time_max),
    ("flowtop_node_input_wait_max", "ratio", "Largest input-wait share among the node's ranks",
     lambda g: g.input_wait_max),
    ("flowtop_node_step_lag_max", "", "Most steps a rank of the node is behind the job's lead", lambda g: g.max_lag),
    ("flowtop_node_step_index_min", "", "Lowest step among the node's ranks", lambda g: g.step_min),
)
#: (name, unit, help, JobPercentiles field): percentiles across the job's running ranks.
JOB_QUANTILES = (
    ("flowtop_job_rank_step", "seconds", "Percentiles of the ranks' median step times", "step_time_s"),
    ("flowtop_job_rank_mfu", "ratio", "Percentiles of the ranks' MFU (stalled ranks count 0)", "mfu"),
    ("flowtop_job_rank_input_wait", "ratio", "Percentiles of the ranks' input-wait shares", "input_wait_frac"),
)
