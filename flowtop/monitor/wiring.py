"""Builds the monitor's model with its collaborators (kernel tables, hints)."""

from __future__ import annotations

from typing import Any, Mapping

from flowtop import settings
from flowtop.monitor.model import Model
from flowtop.monitor.rankkernels import KernelTables


def hint_overrides_from_env(environ: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Hint rule overrides the user set in the environment (``FLOWTOP_HANG_S``: :mod:`flowtop.settings`;
    a bad value is ignored with a warning there)."""
    hang_s = settings.HANG_S.read(environ)
    return {} if hang_s is None else {"hang": {"floor_s": hang_s}}


def make_model(
    peak_override_flops: float | None = None,
    hint_overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Model:
    """A :class:`Model` wired to kernel tables (built inline until a collector or a recording
    moves them to a worker) and the hints engine.

    ``hint_overrides`` tunes hint rules (see :class:`flowtop.monitor.hints.HintEngine`); they apply on top
    of those from the environment (``FLOWTOP_HANG_S``).
    """
    overrides: dict[str, dict[str, Any]] = hint_overrides_from_env()
    for key, values in (hint_overrides or {}).items():
        overrides[key] = {**overrides.get(key, {}), **values}
    try:
        from flowtop.monitor.hints.engine import HintEngine
    except ImportError:
        engine: Any = None
    else:
        engine = HintEngine(overrides=overrides or None)
    return Model(
        peak_override_flops=peak_override_flops,
        kernels=KernelTables(),
        hint_engine=engine,
    )
