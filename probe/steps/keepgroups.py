"""Keeping the process groups of the DDP / FSDP1 wrappers the probe met, for the rest of the
process (:func:`keep_groups`, at the first training step's layout scan and at detach).

Apart from the parallel coordinates (:mod:`probe.steps.parallel`), which only read the wrappers:
this is about the groups' lifetime, a workaround for a gloo destructor that hangs or aborts when the
model is freed (see :func:`keep_groups`), with state of its own (the groups kept).
"""

from __future__ import annotations

import itertools
from typing import Any

from probe.steps.parallel import Found, wrapper_group


#: ids of the process groups :func:`keep_groups` kept.
_KEPT: set[int] = set()


def keep_groups(root: Any, found: Found) -> None:
    """Keep the process groups of the DDP / FSDP1 wrappers met (the root, those the layout scan
    found, those inside the root) for the rest of the process, as
    if the user kept them, and never release them, not even at interpreter finalization (the
    operating system reclaims them at exit).

    Why: the probe holds the model only weakly, so a wrapper's reducer may hold the last
    reference to a gloo process group, and the group's destructor joins gloo's worker threads
    wherever the model is freed, interpreter lock held. A worker that needs that lock to free a
    finished work's Python state then waits forever (seen: about 1 mp.spawn rank in 8 hung at the
    end of its function, tests/test_rank_identity.py; none in 16 runs with the groups kept), and
    during finalization the same destructor aborted the process ("terminate called without an
    active exception": CI, when the probe kept the model until then). In a run without the probe
    the group outlives the model too (alive after main() returned, with no Python referrer)."""
    import ctypes

    try:
        nested = _nested_wrappers(root)
    except Exception:  # noqa: BLE001 - a model whose modules() raises: the others are still kept
        nested = []
    for w in (root, *found.wrappers, *nested):
        for pg in _held_groups(w):
            if id(pg) not in _KEPT:
                _KEPT.add(id(pg))
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))


#: Most modules :func:`_nested_wrappers` looks at (at the layout scan's first step and at detach).
MAX_MODULES = 100_000


def _nested_wrappers(root: Any) -> list[Any]:
    """The DDP / FSDP1 wrappers inside ``root``: a submodule wrapped on its own (one part of a
    model trained over its own process group), FSDP1's auto-wrapped units: neither the root nor,
    as a rule, held by a variable of a frame the layout scan reads (:func:`scan_stack`)."""
    modules = getattr(root, "modules", None)
    if modules is None:
        return []
    return [m for m in itertools.islice(modules(), MAX_MODULES) if wrapper_group(m) is not None]


def _held_groups(wrapper: Any) -> list[Any]:
    """Every process group a DDP or FSDP1 wrapper holds: its own, and FSDP1's inter-node group
    under hybrid sharding (HYBRID_SHARD, _HYBRID_SHARD_ZERO2: the replicas' all-reduce)."""
    pg = wrapper_group(wrapper)
    if pg is None:
        return []
    fsdp1 = type(wrapper).__name__ == "FullyShardedDataParallel"
    inter = getattr(wrapper, "_inter_node_pg", None) if fsdp1 else None
    return [pg] if inter is None or inter is pg else [pg, inter]
