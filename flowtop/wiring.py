"""Builds the monitor's model with its collaborators (kernel aggregation, hints)."""

from __future__ import annotations

from typing import Any

from flowtop.model import Model, RankState


def _aggregate_kernels(st: RankState, fields: dict[str, Any]) -> None:
    """Aggregate one probe kernel window into the rank's latest and cumulative tables."""
    from flowtop.kernels import aggregate, trace

    window = trace.window_from_wire(fields)
    stats = aggregate.aggregate(window)
    st.kernels = stats
    if st.kernels_cumulative is None:
        st.kernels_cumulative = aggregate.CumulativeKernels()
    st.kernels_cumulative.add(stats)


def _merge(windows: dict[int, Any]) -> Any:
    from flowtop.kernels import aggregate

    return aggregate.merge_ranks(windows)


def make_model(peak_override_flops: float | None = None) -> Model:
    """A :class:`Model` wired to kernel aggregation and the hints engine."""
    try:
        from flowtop.hints.engine import HintEngine

        engine: Any = HintEngine()
    except ImportError:
        engine = None
    return Model(
        peak_override_flops=peak_override_flops,
        kernel_aggregator=_aggregate_kernels,
        hint_engine=engine,
        job_kernels=_merge,
    )
