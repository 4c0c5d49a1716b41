"""Where a round of the model's ticks spends its instructions: bench/tick_cost.py's run, with
the tick's main parts each called through a C function of its own, so that callgrind's
inclusive cost of that C function is the part's.

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no --toggle-collect=starmap_next \\
        --callgrind-out-file=/tmp/parts.cg "$(python -c 'import sys; print(sys.executable)')" \\
        bench/tick_parts.py --ranks 4096 --spread 8 --callgrind
    callgrind_annotate --inclusive=yes /tmp/parts.cg \\
        | grep -E 'starmap_next|filterfalse_next|dropwhile_next|takewhile_next|calliter_iternext|functools_reduce'

(the same arguments as tick_cost.py; run it from the checkout to measure, as tick_cost.py). The
parts, by the C function that calls each (nothing in flowtop calls these five):

* ``filterfalse_next``: ``Model._job_snapshot`` (a job's rank views, their relay marks, its figures)
* ``dropwhile_next``: the hint engine's ``evaluate`` (every rule measured at the tick)
* ``takewhile_next``: ``Model._view`` (which rank processes each job shows: the claims)
* ``calliter_iternext``: ``Model._as_now`` (the histories a share of the rules reads)
* ``functools_reduce``: ``Model._monitor_snapshot`` (the relays' rows, the snapshot record)

A part called inside another counts in both. The digest (``--digest`` without callgrind) is
tick_cost.py's: the wrappers change no result.

``--inside job`` (as the first argument): the parts of ``Model._job_snapshot`` instead, by the
same C functions in turn: the rank views (``RankViews.views``), the job's FLOP figures
(``accounting.job_flops``), the relay marks (``Relays.mark``), the replicas, tokens and stages
(``parallelism.whole_replicas``, ``job_tokens``, ``pipeline_stages``), and the kernel merge
and hinted ranks (``Model._merged_kernels``, ``Model._hot``).
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import tick_cost  # noqa: E402  (bench/tick_cost.py)


def _through(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, called from inside the C function that ``kind`` names."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        box: list[Any] = []

        def call(*_: Any) -> bool:
            box.append(fn(*args, **kwargs))
            return True

        if kind == "filterfalse":
            list(itertools.filterfalse(call, (0,)))
        elif kind == "dropwhile":
            list(itertools.dropwhile(call, (0,)))
        elif kind == "takewhile":
            list(itertools.takewhile(call, (0,)))
        elif kind == "calliter":
            next(iter(call, None))
        else:
            functools.reduce(call, (0, 0))
        return box[0]

    return wrapped


def instrument() -> None:
    """Route the parts through their C functions (see the module doc)."""
    from flowtop.monitor.hints.engine import HintEngine
    from flowtop.monitor.model import Model

    Model._job_snapshot = _through("filterfalse", Model._job_snapshot)  # type: ignore[method-assign]
    HintEngine.evaluate = _through("dropwhile", HintEngine.evaluate)  # type: ignore[method-assign]
    Model._view = _through("takewhile", Model._view)  # type: ignore[method-assign]
    Model._as_now = staticmethod(_through("calliter", Model._as_now))  # type: ignore[method-assign]
    Model._monitor_snapshot = _through("reduce", Model._monitor_snapshot)  # type: ignore[method-assign]


def instrument_job() -> None:
    """Route the parts of a job's snapshot through their C functions (see the module doc)."""
    from flowtop.monitor import accounting, parallelism
    from flowtop.monitor.model import Model
    from flowtop.monitor.rankviews import RankViews
    from flowtop.monitor.relays import Relays

    RankViews.views = _through("filterfalse", RankViews.views)  # type: ignore[method-assign]
    accounting.job_flops = _through("dropwhile", accounting.job_flops)
    Relays.mark = _through("takewhile", Relays.mark)  # type: ignore[method-assign]
    for name in ("whole_replicas", "job_tokens", "pipeline_stages"):
        setattr(parallelism, name, _through("calliter", getattr(parallelism, name)))
    Model._merged_kernels = _through("reduce", Model._merged_kernels)  # type: ignore[method-assign]
    Model._hot = _through("reduce", Model._hot)  # type: ignore[method-assign]


if __name__ == "__main__":
    if sys.argv[1:3] == ["--inside", "job"]:
        del sys.argv[1:3]
        instrument_job()
    else:
        instrument()
    raise SystemExit(tick_cost.main())
