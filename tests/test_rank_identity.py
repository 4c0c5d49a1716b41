"""Rank identity when the launcher says nothing: the process group names the rank.

Lightning's DDP launcher and the ``mp.spawn`` + ``init_process_group(rank=...)`` pattern set
no ``RANK``; two processes must never both speak as rank 0 of one job."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import probed_env
from monitor_thread import MonitorThread
from probe import identity


def test_the_process_group_names_rank_job_and_local_ranks() -> None:
    group = identity.GroupInfo(rank=1, world_size=2, init_method="tcp://127.0.0.1:29512")
    ident = identity.from_env({}, group=lambda: group)
    assert (ident.rank, ident.world_size, ident.rank_source) == (1, 2, "process group")
    assert ident.job == "pg:tcp://127.0.0.1:29512"  # the same string in every rank
    assert ident.local_world_size == 2  # a loopback rendezvous: both ranks share this host


def test_launcher_variables_win_over_the_process_group() -> None:
    group = identity.GroupInfo(rank=1, world_size=2, init_method="env://")
    ident = identity.from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                               "MASTER_ADDR": "n1", "MASTER_PORT": "1"}, group=lambda: group)
    assert (ident.rank, ident.world_size, ident.rank_source, ident.local_world_size) == (3, 8, "RANK", 4)
    remote = identity.from_env({"MASTER_ADDR": "node7", "MASTER_PORT": "1"}, group=lambda: group)
    # env:// with a remote rendezvous: the job is MASTER_ADDR:PORT, one rank on this host known
    assert (remote.job, remote.rank, remote.local_world_size) == ("node7:1", 1, 1)


def test_nothing_said_is_rank_zero_and_says_so() -> None:
    ident = identity.from_env({}, group=lambda: None)
    assert (ident.rank, ident.rank_source, ident.local_world_size) == (0, "none", 1)


_SPAWN = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch import nn
    import probe

    def rank_main(rank, port):
        os.environ.pop("RANK", None)
        probe.attach()  # before the process group: the README's pattern, first line of the rank
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 64)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(12):
            x = torch.randint(0, 64, (2, 8))
            model(x).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank_main, args=(int(sys.argv[1]),), nprocs=2)
""")


def test_attach_before_init_process_group_reidentifies_each_rank(monitor: MonitorThread, tmp_path: Path) -> None:
    from flowtop.tools.demo.launch import free_port_pair

    script = tmp_path / "spawn_train.py"
    script.write_text(_SPAWN)
    env = probed_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_TELEMETRY="0", OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, str(script), str(free_port_pair())], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    snap = monitor.wait_for(lambda s: any(j.job.startswith("pg:") and len(j.ranks) == 2
                                          and all(r.status == "done" for r in j.ranks) for j in s.jobs), 15)
    job = next(j for j in snap.jobs if j.job.startswith("pg:tcp://127.0.0.1:"))
    assert sorted(r.rank for r in job.ranks) == [0, 1]
    assert len({r.pid for r in job.ranks}) == 2
    assert all(r.step == 12 and r.tokens_per_step == 16 for r in job.ranks)
    # The provisional identities (rank 0 of "host:pid" jobs) said bye when the group named them.
    provisional = [r for j in snap.jobs if j is not job for r in j.ranks]
    assert all(r.status == "done" and (r.bye_reason or "").startswith("re-identified as rank")
               for r in provisional), [(r.status, r.bye_reason) for r in provisional]


def test_a_cpu_ranks_peak_counts_its_share_of_the_host(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os

    import torch

    from probe.flops import accounting

    # A 16-core host, unpinned, torch using 16 threads in each of two spawned ranks.
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert accounting.cpu_cores_of_rank(1) == 16
    assert accounting.cpu_cores_of_rank(2) == 8  # two ranks never both claim all 16 cores
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # torchrun's OMP_NUM_THREADS=1
    assert accounting.cpu_cores_of_rank(2) == 1
    # Pinned to 4 cores (taskset/numactl/Slurm binding): the set is the rank's own ...
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert accounting.cpu_cores_of_rank(4) == 4
    # ... up to its share of the host: 8 ranks' sets of 4 on 16 cores overlap (2 each in all)
    assert accounting.cpu_cores_of_rank(8) == 2
