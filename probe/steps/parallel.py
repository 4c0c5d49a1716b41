"""Parallel coordinates of this rank: dp/tp/pp/cp/ep rank and size (issue 14 part 3).

The monitor needs them to count a job's tokens once per data-parallel replica: tensor-parallel
ranks and pipeline stages of one replica see the same tokens (only stage 0 embeds them), context-
parallel ranks see shards of the same sequences. They travel in the hello (``coords``).

torch keeps no registry of device meshes, so they are gathered where a training process holds them:

* the stack of the first training forward (:func:`scan_stack`): the training loop's locals and its
  module's globals, two levels deep (``mesh``, ``parallel_dims.world_mesh``, a schedule's stage);
  a ``PipelineStage`` is on that stack too, since the schedule calls the stage module from it;
* the model's DTensor parameters (their root mesh) and FSDP2's mesh;
* process groups whose description is ``mesh_<dim>``: DeviceMesh names the groups of every dim
  of a mesh that does not span the whole world (pp, cp, dp_replicate dims no parameter uses);
* a DDP / FSDP1 wrapper's process group (data parallel without a mesh).

Dims are mapped to roles by name (torchtitan's and the usual spellings). A mesh with an ``ep``
dim gives only ep: its other data dims re-split dp × cp for the experts. A dim whose name has no
known role makes the layout unknown: then no ``coords`` are sent and the monitor sums the tokens
of every rank, saying so. dp is derived from the world size when no dim names it.

Everything here runs at the first training step and never raises. The process groups of the
wrappers met are kept alive by :mod:`probe.steps.keepgroups`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

from probe.identity import NAMES, ROLE_OF, ROLES
#: Most objects the stack scan looks at (a bound on its cost, whatever the loop holds).
SCAN_LIMIT = 20_000


@dataclass(frozen=True)
class Dim:
    """One parallel dimension this rank belongs to: its name, this rank's index, its size."""

    name: str
    rank: int
    size: int


@dataclass(frozen=True)
class Coordinates:
    """This rank's place in the job's parallel layout.

    ``roles``: role -> (rank, size) for the roles known with their rank (sizes of 1 included for
    dp; tp/pp/cp/ep only when present). ``complete``: the layout is known (every dim has a role and
    the sizes fit the world), so tokens can be counted once per data-parallel replica. ``source``
    says where it came from, or why the layout is unknown."""

    roles: dict[str, tuple[int, int]]
    source: str
    complete: bool
    pp_stages: tuple[int, ...] = ()

    def size(self, role: str) -> int:
        """This rank's degree in ``role`` (1 where the role is absent). Known even where the
        layout as a whole is not (a cp dim beside a dim of unknown role still says cp)."""
        return self.roles.get(role, (0, 1))[1]

    def hello_fields(self) -> dict[str, Any]:
        """The hello's optional fields (probe.wire): ``coords`` only when complete."""
        out: dict[str, Any] = {"coords_source": self.source[:256]}
        if self.complete:
            out["coords"] = {r: [rk, sz] for r, (rk, sz) in self.roles.items()}
        if self.pp_stages:
            out["pp_stages"] = list(self.pp_stages[:64])
        return out


@dataclass
class Found:
    """Meshes and pipeline stages the stack scan met (identity-deduplicated)."""

    meshes: list[Any] = field(default_factory=list)
    stages: list[Any] = field(default_factory=list)
    #: DDP / FSDP1 wrappers (the model the step tracker hooks may be the module inside one).
    wrappers: list[Any] = field(default_factory=list)

    def add_mesh(self, mesh: Any) -> None:
        root = _root_mesh(mesh)
        # Equal, not only identical: FSDP2's sharded parameters carry a mesh equal to its own.
        if not any(_same_mesh(m, root) for m in self.meshes):
            self.meshes.append(root)

    def add_stage(self, stage: Any) -> None:
        if all(s is not stage for s in self.stages):
            self.stages.append(stage)


def _classes() -> tuple[Any, Any, Any, tuple[type, ...]]:
    """DeviceMesh, the pipeline stage base, the schedule base and the data-parallel wrappers (DDP,
    FSDP1), where their modules are loaded (nothing can be one of them otherwise, and importing
    them here would cost every process)."""
    mesh = getattr(sys.modules.get("torch.distributed.device_mesh"), "DeviceMesh", None)
    stage = getattr(sys.modules.get("torch.distributed.pipelining.stage"), "_PipelineStageBase", None)
    sched = getattr(sys.modules.get("torch.distributed.pipelining.schedules"), "_PipelineSchedule", None)
    ddp = getattr(sys.modules.get("torch.nn.parallel.distributed"), "DistributedDataParallel", None)
    fsdp1 = getattr(sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel"),
                    "FullyShardedDataParallel", None)
    return mesh, stage, sched, tuple(c for c in (ddp, fsdp1) if c is not None)


def _same_mesh(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def _root_mesh(mesh: Any) -> Any:
    try:
        return mesh._get_root_mesh()
    except Exception:  # noqa: BLE001 - another torch: the mesh as found
        return mesh


def scan_stack(frame: Any, found: Found | None = None, max_frames: int = 64) -> Found:
    """Meshes and pipeline stages held by the frames from ``frame`` outwards: their locals (a
    module frame's are its globals) and, two levels down, attributes, dicts and lists of them."""
    found = found if found is not None else Found()
    mesh_cls, stage_cls, sched_cls, wrappers = _classes()
    kinds = tuple(c for c in (mesh_cls, stage_cls, sched_cls) if c is not None) + wrappers
    if not kinds:
        return found
    budget = [SCAN_LIMIT]
    seen: set[int] = set()

    def visit(value: Any) -> None:
        # Depth first, in order, with a stack: a recursive closure would refer to itself, a
        # cycle that would keep what it found (the user's DDP model) until a garbage collection.
        stack: list[tuple[Any, int]] = [(value, 2)]
        while stack and budget[0] > 0:
            v, depth = stack.pop()
            if id(v) in seen:
                continue
            budget[0] -= 1
            seen.add(id(v))
            if isinstance(v, kinds):
                _found_one(found, v, mesh_cls, stage_cls, wrappers)
                continue
            if depth <= 0 or isinstance(v, (str, bytes, int, float, bool, type(None), type)) or callable(v):
                continue
            if isinstance(v, dict):
                items: list[Any] = list(v.values())[:64]
            elif isinstance(v, (list, tuple)):
                items = list(v[:64])
            elif _is_plain_object(v):
                items = list(vars(v).values())[:128]
            else:
                continue
            stack.extend((x, depth - 1) for x in reversed(items))

    f = frame
    for _ in range(max_frames):
        if f is None or budget[0] <= 0:
            break
        try:
            values = list(f.f_locals.values())
        except Exception:  # noqa: BLE001 - a frame that cannot show its locals
            values = []
        for v in values:
            visit(v)
        f = f.f_back
    return found


def _found_one(found: Found, v: Any, mesh_cls: Any, stage_cls: Any, wrappers: tuple[type, ...]) -> None:
    """Note a mesh, a stage, a data-parallel wrapper or a schedule's stages in ``found``."""
    if mesh_cls is not None and isinstance(v, mesh_cls):
        found.add_mesh(v)
    elif stage_cls is not None and isinstance(v, stage_cls):
        found.add_stage(v)
    elif isinstance(v, wrappers):
        if all(w is not v for w in found.wrappers):
            found.wrappers.append(v)
    else:  # a schedule: its stage, or its stages (interleaved schedules)
        for s in [getattr(v, "_stage", None), *list(getattr(v, "_stages", None) or ())]:
            if stage_cls is not None and isinstance(s, stage_cls):
                found.add_stage(s)


def _is_plain_object(v: Any) -> bool:
    """An instance whose attributes may hold a mesh (a trainer, ParallelDims); not a module object,
    a tensor or an nn.Module (a model's attributes are its layers: no mesh there, many objects)."""
    if not hasattr(v, "__dict__") or type(v).__module__ in ("builtins", "types"):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, (torch.Tensor, torch.nn.Module)):
        return False
    return not isinstance(v, type(sys))


def mesh_dims(mesh: Any) -> list[Dim] | None:
    """This rank's dims of ``mesh`` (None when the rank is not in it)."""
    coord = mesh.get_coordinate()
    if coord is None:
        return None
    names = getattr(mesh, "mesh_dim_names", None) or tuple(f"dim_{i}" for i in range(mesh.ndim))
    return [Dim(str(n), int(c), int(s)) for n, c, s in zip(names, coord, mesh.shape)]


def group_dims(global_rank: int) -> list[Dim]:
    """Dims of the process groups DeviceMesh created for this rank (``group_desc`` "mesh_<dim>")."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    out: list[Dim] = []
    if c10d is None:
        return out
    for pg, ranks in dict(c10d._world.pg_group_ranks).items():
        desc = str(getattr(pg, "group_desc", "") or "")
        if desc.startswith("mesh_") and global_rank in ranks:
            out.append(Dim(desc[len("mesh_"):], int(ranks[global_rank]), len(ranks)))
    return out


def _combine(dims: list[Dim]) -> tuple[int, int]:
    """One coordinate of several dims of a role, mesh order major first (dp_replicate × dp_shard)."""
    rank, size = 0, 1
    for d in dims:
        rank, size = rank * d.size + d.rank, size * d.size
    return rank, size


def wrapper_group(root: Any) -> Any:
    """The process group of a DDP or FSDP1 wrapper around the model, else None."""
    name = type(root).__name__
    if name in ("DistributedDataParallel", "FullyShardedDataParallel"):
        return getattr(root, "process_group", None)
    return None


def coordinates(root: Any, found: Found | None, rank: int, world_size: int,
                groups: list[Dim] | None = None) -> Coordinates:
    """This rank's coordinates from what was found on the stack, the model and the process groups
    (``groups``: :func:`group_dims` of ``rank`` when None). Never raises (an unexpected structure
    gives an unknown layout, with the reason)."""
    try:
        return _coordinates(root, found or Found(), rank, world_size, group_dims(rank) if groups is None else groups)
    except Exception as exc:  # noqa: BLE001 - a label must never hurt training
        return Coordinates({}, f"unknown: {type(exc).__name__} while reading the mesh", False)


def _coordinates(root: Any, found: Found, rank: int, world_size: int, groups: list[Dim]) -> Coordinates:
    fsdp = None
    split: list[tuple[Any, int]] = []  # (root mesh, dim) some non-FSDP parameter is sharded on
    if root is not None:
        from probe.flops.accounting import unwrap
        from probe.flops.dtensor import _fsdp_mesh

        model = unwrap(root)
        dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
        if dtensor is not None:
            for p in model.parameters():
                if isinstance(p, dtensor):
                    found.add_mesh(p.device_mesh)
                    if _root_mesh(p.device_mesh) is p.device_mesh:  # an unsliced mesh: dims index it
                        split += [(p.device_mesh, i) for i, pl in enumerate(p.placements)
                                  if "Shard" in type(pl).__name__]
        fsdp = _fsdp_mesh(model)
        if fsdp is not None:
            found.add_mesh(fsdp)
    roles: dict[str, tuple[int, int]] = {}
    notes: list[str] = []
    unknown: list[str] = []
    for mesh in found.meshes:
        dims = mesh_dims(mesh)
        if dims is None:
            continue
        fsdp_root = fsdp is not None and _same_mesh(_root_mesh(fsdp), mesh)
        sharded = {i for m, i in split if _same_mesh(m, mesh)}

        def unnamed(i: int) -> str | None:
            # A mesh without dim names: FSDP2's own mesh is data parallel; a dim other parameters
            # are sharded on splits the matmuls (tensor parallel).
            return "dp" if fsdp_root else ("tp" if i in sharded else None)  # noqa: B023 - this iteration only

        named = [(ROLE_OF.get(d.name) or (unnamed(i) if d.name == f"dim_{i}" else None), d)
                 for i, d in enumerate(dims)]
        expert = any(role == "ep" for role, _ in named)
        notes.append("mesh (" + ", ".join(f"{d.name}={d.size}" for d in dims) + ")")
        by_role: dict[str, list[Dim]] = {}
        for role, d in named:
            if expert and role not in ("ep", "tp", "pp"):
                continue  # an expert mesh re-splits dp × cp: only its ep dim is new
            if role is None:
                unknown.append(d.name)
                continue
            by_role.setdefault(role, []).append(d)
        for role, ds in by_role.items():
            roles.setdefault(role, _combine(ds))
    group = [d for d in groups if d.name in ROLE_OF]
    by_role = {}
    for d in group:
        by_role.setdefault(ROLE_OF[d.name], []).append(d)
    for role, ds in by_role.items():
        if role in roles:
            continue
        exact = [d for d in ds if d.name == role]  # a flattened "dp" beside its components
        roles[role] = (exact[0].rank, exact[0].size) if exact else _combine(
            sorted(ds, key=lambda d: NAMES[role].index(d.name)))
        notes.append(f"process groups mesh_{'/'.join(d.name for d in ds)}")
    stages = sorted({int(s.stage_index) for s in found.stages})
    if found.stages and "pp" not in roles:
        s = found.stages[0]
        roles["pp"] = (int(s.group_rank), int(s.group_size))
        notes.append(f"pipeline stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))} "
                     f"of {int(s.num_stages)}")
    pg = next((g for g in (wrapper_group(w) for w in [root, *found.wrappers]) if g is not None), None)
    if "dp" not in roles and pg is not None:
        import torch.distributed as dist

        size = int(dist.get_world_size(pg))
        # A wrapper that also spans the cp (or other) ranks is not one replica per rank: not dp.
        if size * math.prod(roles[r][1] for r in ("tp", "pp", "cp") if r in roles) == world_size:
            roles["dp"] = (int(dist.get_rank(pg)), size)
            notes.append("data-parallel wrapper's process group")
    if unknown:
        return Coordinates(roles, f"unknown: mesh dim {', '.join(map(repr, unknown))} has no known role "
                           f"({'; '.join(notes)})", False, tuple(stages))
    if not roles:
        if world_size <= 1:
            return Coordinates({"dp": (0, 1)}, "a single process", True)
        return Coordinates({}, "unknown: no device mesh, pipeline stage or data-parallel wrapper found",
                           False, tuple(stages))
    degree = math.prod(roles[r][1] for r in ("tp", "pp", "cp") if r in roles)
    if world_size % degree:
        return Coordinates(roles, f"unknown: tp·pp·cp = {degree} does not divide the world size {world_size} "
                           f"({'; '.join(notes)})", False, tuple(stages))
    if "dp" in roles and roles["dp"][1] * degree != world_size:
        return Coordinates(roles, f"unknown: dp·tp·pp·cp = {roles['dp'][1] * degree} is not the world size "
                           f"{world_size} ({'; '.join(notes)})", False, tuple(stages))
    if "dp" not in roles:
        dp = world_size // degree
        if dp == 1:
            roles["dp"] = (0, 1)
        elif degree == 1:  # every rank a replica of its own (an ep mesh over the world): its rank is its index
            roles["dp"] = (rank, dp)
        notes.append(f"dp = world {world_size} / (tp·pp·cp) = {dp}" + (
            "" if dp == 1 else ", the global rank" if degree == 1 else " (rank not known)"))
    ordered = {r: roles[r] for r in ROLES if r in roles and (r == "dp" or roles[r][1] > 1)}
    return Coordinates(ordered, "; ".join(notes), True, tuple(stages))
