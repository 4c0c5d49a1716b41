"""Ranks of tests/test_parallel_coords.py: 4 gloo processes build real CPU device meshes (no training)
and read their coordinates with probe.steps.parallel, each scenario from one source alone (the stack, the
process groups), so that one scenario's groups do not leak into another's answer. Every rank writes
``rank<r>.json`` into ``out``: scenario name -> {"coords", "complete", "source"}."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from probe.steps import parallel


class ParallelDims:
    """Like torchtitan's: the trainer holds an object that holds a dict of meshes."""

    def __init__(self, meshes: dict[str, Any]) -> None:
        self._meshes = meshes


def _result(c: parallel.Coordinates) -> dict[str, Any]:
    return {"coords": c.hello_fields().get("coords"), "complete": c.complete, "source": c.source,
            "roles": {k: list(v) for k, v in c.roles.items()}}


def _groups_only(rank: int) -> dict[str, Any]:
    """A (pp 2, cp 2) mesh nobody holds any more: only its process groups ("mesh_pp", "mesh_cp")
    are left to read."""
    init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "cp"))
    dims = parallel.group_dims(rank)
    return {"dims": sorted([d.name, d.rank, d.size] for d in dims),
            **_result(parallel.coordinates(None, parallel.Found(), rank, 4, groups=dims))}


def _on_stack(rank: int, names: tuple[str, ...], flatten: str = "") -> dict[str, Any]:
    """A mesh held three levels deep by a local (object -> dict -> mesh), found by the stack scan."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    meshes = {"world": mesh}
    if flatten:
        meshes[flatten] = mesh[names]._flatten(flatten)  # a flattened view: its root is the same mesh
    dims = ParallelDims(meshes)  # noqa: F841 - held on this frame for scan_stack
    found = parallel.scan_stack(sys._getframe())
    out = _result(parallel.coordinates(None, found, rank, 4, groups=[]))
    out["meshes_found"] = len(found.meshes)
    return out


def _expert(rank: int) -> dict[str, Any]:
    """torchtitan's MoE layout on 4 ranks: a dense (dp 4) mesh and an expert (efsdp 2, ep 2) mesh that
    re-splits the same ranks: dp from the first, only ep from the second."""
    dense = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    sparse = init_device_mesh("cpu", (2, 2), mesh_dim_names=("efsdp", "ep"))
    found = parallel.Found()
    found.add_mesh(dense)
    found.add_mesh(sparse)
    return _result(parallel.coordinates(None, found, rank, 4, groups=[]))


def worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    res = {"groups_only": _groups_only(rank),
           "dp_tp": _on_stack(rank, ("dp", "tp")),
           "hsdp": _on_stack(rank, ("dp_replicate", "dp_shard"), flatten="dp"),
           "pp_tp": _on_stack(rank, ("pp", "tp")),
           "unknown_dim": _on_stack(rank, ("dp", "foo")),
           "expert": _expert(rank)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def stage_timer_worker(rank: int, port: int, out: str) -> None:
    """One process, one pipeline stage (first and last): probe.steps.pipeline.StageTimer around a real
    PipelineStage under ScheduleGPipe, then closed; and the stage found on the stack of its forward."""
    import time

    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from probe.steps.pipeline import METHODS, StageTimer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    seen: list[Any] = []

    class Slow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not seen:  # what the probe's forward listener does at the first training forward
                seen.append(parallel.scan_stack(sys._getframe()))
            time.sleep(0.01)  # 10 ms per micro-batch forward: the timer must see at least that
            return self.lin(x)

    stage = PipelineStage(Slow(), 0, 1, torch.device("cpu"))
    timer = StageTimer([stage])
    sched = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda y, t: ((y - t) ** 2).mean())
    x, t = torch.randn(4, 8), torch.randn(4, 8)
    sched.step(x, target=t)
    first = timer.take()
    wrapped = sorted(n for n in METHODS if n in vars(stage))
    timer.close()
    restored = not any(n in vars(stage) for n in METHODS)
    sched.step(x, target=t)  # after close: the class's own methods, nothing timed
    found = seen[0]
    coords = parallel.coordinates(stage.submod, found, 0, 1, groups=[])
    Path(out, "stage_timer.json").write_text(json.dumps({
        "first": first, "after_close": timer.take(), "wrapped": wrapped, "restored": restored,
        "stages_found": [s is stage for s in found.stages], "coords": coords.hello_fields()}))
    dist.destroy_process_group()
