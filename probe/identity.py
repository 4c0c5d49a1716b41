"""Who this process is: job, rank, world size and incarnation, from the launcher's env."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping

from probe.wire import RankKey


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


def from_env(
    env: Mapping[str, str] | None = None,
    job: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
) -> Identity:
    """Identity from torchrun's variables, explicit arguments taking precedence.

    Job id: explicit ``job``, else ``FLOWTOP_JOB``, else torchrun's
    ``TORCHELASTIC_RUN_ID`` (shared by all ranks of one launch), else
    ``MASTER_ADDR:MASTER_PORT``, else Slurm's job and step id, else ``host:pid``
    for a single process. Rank and sizes: torchrun's variables, else Slurm's, else
    Open MPI's.
    """
    e = os.environ if env is None else env
    host = socket.gethostname()
    pid = os.getpid()
    # torchrun first, then Slurm's srun and Open MPI's mpirun (launchers that set no RANK).
    r = rank if rank is not None else _first_int(e, ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"), 0)
    ws = world_size if world_size is not None else max(
        1, _first_int(e, ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"), 1)
    )
    lr = local_rank if local_rank is not None else _first_int(
        e, ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"), 0
    )
    run_id = e.get("TORCHELASTIC_RUN_ID", "")
    if job is None:
        job = e.get("FLOWTOP_JOB") or None
    if job is None and run_id and run_id.lower() != "none":
        job = run_id
    if job is None and e.get("MASTER_ADDR") and e.get("MASTER_PORT"):
        job = f"{e['MASTER_ADDR']}:{e['MASTER_PORT']}"
    if job is None and e.get("SLURM_JOB_ID"):
        job = f"slurm-{e['SLURM_JOB_ID']}.{e.get('SLURM_STEP_ID', '0')}"
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
    )
