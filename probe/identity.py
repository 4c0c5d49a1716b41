"""Who this process is: job, rank, world size and incarnation, from the launcher's env."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from probe import config
from probe import wire
from probe.wire import RankKey


# --- parallel roles (probe.steps.parallel's coordinates, probe.flops.dtensor's layout) ----------

ROLES = ("dp", "tp", "pp", "cp", "ep")

#: Mesh dim names by role. dp components (replicate × shard) combine into one dp coordinate.
NAMES = {
    "dp": ("dp", "dp_replicate", "dp_shard", "fsdp", "ddp", "hsdp", "replicate", "shard", "data",
           "data_parallel"),
    "tp": ("tp", "tensor", "tensor_parallel", "mp", "model_parallel"),
    "pp": ("pp", "pipe", "pipeline", "pipeline_parallel"),
    "cp": ("cp", "context", "context_parallel"),
    "ep": ("ep", "expert", "expert_parallel"),
}
ROLE_OF = {name: role for role, names in NAMES.items() for name in names}


@dataclass(frozen=True)
class Identity:
    """Job identity of one training process."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    incarnation: int
    #: Where the rank came from: "argument", a launcher variable ("RANK", "SLURM_PROCID", ...),
    #: "process group" (torch.distributed, when the launcher set none) or "none" (rank 0 by default).
    rank_source: str = "argument"
    #: Training processes of this job on this host (a CPU rank's share of the cores).
    local_world_size: int = 1

    @property
    def key(self) -> RankKey:
        """The wire key of this rank."""
        return RankKey(self.job, self.host, self.pid, self.rank, self.incarnation)


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(env.get(name, default))
    except (TypeError, ValueError):
        return default
    return value if value >= 0 else default


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        if name in env:
            return _int_env(env, name, default)
    return default


_RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


@dataclass(frozen=True)
class GroupInfo:
    """torch.distributed's default process group as this process sees it."""

    rank: int
    world_size: int
    init_method: str | None  # "tcp://host:port", "file://...", "env://"; None when not known


def process_group() -> GroupInfo | None:
    """The default process group, if torch.distributed has one up (never initialises one).

    Launchers such as Lightning's DDP launcher and the ``mp.spawn`` + ``init_process_group(rank=)``
    pattern set no ``RANK``: the group is then the only place the rank is written down."""
    try:
        if "torch.distributed" not in sys.modules:
            return None
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if not dist.is_available() or not dist.is_initialized():
            return None
        method = getattr(c10d, "_default_pg_init_method", None)
        return GroupInfo(int(dist.get_rank()), int(dist.get_world_size()),
                         str(method) if method else None)
    except Exception:  # a half-built group must not stop the probe
        return None


def from_env(
    env: Mapping[str, str] | None = None,
    job: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    group: Callable[[], GroupInfo | None] = process_group,
) -> Identity:
    """Identity from torchrun's variables, explicit arguments taking precedence.

    Job id: explicit ``job``, else ``FLOWTOP_JOB``, else torchrun's
    ``TORCHELASTIC_RUN_ID`` (shared by all ranks of one launch), else
    ``MASTER_ADDR:MASTER_PORT``, else Slurm's job and step id, else ``host:pid``
    for a single process. Rank and sizes: torchrun's variables, else Slurm's, else
    Open MPI's, else torch.distributed's default process group (``group``), which also
    names the job by its init method when nothing else does.
    """
    e = os.environ if env is None else env
    host = config.host_name(e)  # FLOWTOP_HOST: a simulated node (several on one machine)
    pid = os.getpid()
    # torchrun first, then Slurm's srun and Open MPI's mpirun (launchers that set no RANK).
    source = "argument" if rank is not None else next((n for n in _RANK_VARS if n in e), "none")
    pg = group() if source == "none" else None
    if pg is not None:
        source = "process group"
    r = rank if rank is not None else (pg.rank if pg else _first_int(e, _RANK_VARS, 0))
    ws = world_size if world_size is not None else max(
        1, pg.world_size if pg else _first_int(e, ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"), 1)
    )
    lr = local_rank if local_rank is not None else _first_int(
        e, ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"), 0
    )
    run_id = e.get("TORCHELASTIC_RUN_ID", "")
    if job is not None and wire.job_id_problem(job):  # attach(job=...): made printable, or no id at all
        job = "".join(c if c.isprintable() else "?" for c in job).strip()[:256] or None
    if job is None:
        job = config.JOB.read(e)
    if job is None and run_id and run_id.lower() != "none":
        job = run_id
    if job is None and e.get("MASTER_ADDR") and e.get("MASTER_PORT"):
        job = f"{e['MASTER_ADDR']}:{e['MASTER_PORT']}"
    if job is None and e.get("SLURM_JOB_ID"):
        job = f"slurm-{e['SLURM_JOB_ID']}.{e.get('SLURM_STEP_ID', '0')}"
    if job is None and pg is not None and pg.init_method and pg.init_method != "env://":
        job = f"pg:{pg.init_method}"
    if job is None and ws > 1 and "OMPI_COMM_WORLD_RANK" in e:
        job = f"mpi-{e.get('OMPI_MCA_orte_hnp_uri', host).split(';')[0][:64]}"
    if job is None:
        job = f"{host}:{pid}"
    return Identity(
        job=job[:256],
        rank=r,
        local_rank=lr,
        world_size=max(ws, r + 1),
        host=host[:256],
        pid=pid,
        incarnation=_int_env(e, "TORCHELASTIC_RESTART_COUNT", 0),
        rank_source=source,
        local_world_size=_local_world_size(e, pg, max(ws, r + 1)),
    )


_LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


def _local_world_size(e: Mapping[str, str], pg: GroupInfo | None, world_size: int) -> int:
    """Ranks on this host: the launcher's count, else all of them when the job's rendezvous is
    this host's loopback (mp.spawn and Lightning's launcher on one machine), else 1."""
    n = _first_int(e, ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"), 0)
    if n > 0:
        return n
    where = e.get("MASTER_ADDR", "")
    if pg is not None and pg.init_method and "://" in pg.init_method:
        where = pg.init_method.split("://", 1)[1].rsplit(":", 1)[0] or where
    return world_size if where.lower() in _LOOPBACK else 1
