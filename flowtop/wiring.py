"""Builds the monitor's model with its collaborators (kernel aggregation, hints)."""

from __future__ import annotations

from typing import Any, Mapping

from flowtop import settings
from flowtop.model import Model, RankState


def build_kernel_stats(fields: Mapping[str, Any]) -> Any:
    """One probe kernel window's table and anatomy. Pure (safe on a worker thread): the
    monitor builds large GPU windows (≈50 ms for a 940 M-parameter GPT's step) off its loop."""
    from flowtop.kernels import aggregate, trace

    return aggregate.aggregate(trace.window_from_wire(dict(fields)))


def apply_kernel_stats(st: RankState, stats: Any) -> None:
    """Make ``stats`` the rank's latest window and add it to its cumulative table."""
    from flowtop.kernels import merge

    st.kernels = stats
    if st.kernels_cumulative is None:
        st.kernels_cumulative = merge.CumulativeKernels()
    st.kernels_cumulative.add(stats)


def _aggregate_kernels(st: RankState, fields: dict[str, Any]) -> None:
    """Aggregate one probe kernel window into the rank's latest and cumulative tables."""
    apply_kernel_stats(st, build_kernel_stats(fields))


def _merge(tables: dict[int, Any]) -> Any:
    from flowtop.kernels import merge

    return merge.merge_cumulative(tables)


def hint_overrides_from_env(environ: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Hint rule overrides the user set in the environment (``FLOWTOP_HANG_S``: :mod:`flowtop.settings`;
    a bad value is ignored with a warning there)."""
    hang_s = settings.HANG_S.read(environ)
    return {} if hang_s is None else {"hang": {"floor_s": hang_s}}


def make_model(
    peak_override_flops: float | None = None,
    hint_overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Model:
    """A :class:`Model` wired to kernel aggregation and the hints engine.

    ``hint_overrides`` tunes hint rules (see :class:`flowtop.hints.HintEngine`); they apply on top
    of those from the environment (``FLOWTOP_HANG_S``).
    """
    overrides: dict[str, dict[str, Any]] = hint_overrides_from_env()
    for key, values in (hint_overrides or {}).items():
        overrides[key] = {**overrides.get(key, {}), **values}
    try:
        from flowtop.hints.engine import HintEngine
    except ImportError:
        engine: Any = None
    else:
        engine = HintEngine(overrides=overrides or None)
    return Model(
        peak_override_flops=peak_override_flops,
        kernel_aggregator=_aggregate_kernels,
        hint_engine=engine,
        job_kernels=_merge,
    )
