"""Parallel coordinates (issue 14 part 3): the probe reads dp/tp/pp/cp/ep rank and size from real
CPU device meshes (4 gloo processes, tests/parallel_coords_worker.py), the hello carries them
(validated on the wire), and the monitor counts a job's tokens once per data-parallel replica from
them (real Model, real wire frames; the end-to-end runs are in tests/test_recipes.py: TP 2, PP 2,
CP 2, DDP, FSDP2)."""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from flowtop.monitor import parallelism
from flowtop.monitor.model import Model
from flowtop.tui.screens.rank_detail_screen import coords_text
from flowtop.monitor.snapshot_json import to_json
from flowtop.export.textreport import render
from probe import wire
from probe.wire import RankKey, WireError
from snapshot_schema import assert_valid_snapshot

if not torch.distributed.is_available():  # pragma: no cover - CPU wheels have gloo
    pytest.skip("torch.distributed unavailable", allow_module_level=True)

KEY = RankKey("j", "h", 1, 0, 0)
HELLO = {"local_rank": 0, "world_size": 4, "device": "cpu", "probe_version": "x"}


# --- wire --------------------------------------------------------------------------------------

def test_hello_coordinates_round_trip() -> None:
    fields = dict(HELLO, coords={"dp": [1, 2], "tp": [0, 2]}, coords_source="mesh (dp=2, tp=2)", pp_stages=[0, 2])
    assert dict(wire.decode(wire.encode("hello", KEY, 0, 1.0, fields)).fields) == fields


@pytest.mark.parametrize("bad", [{"xp": [0, 2]}, {"tp": [2, 2]}, {"tp": [0, 0]}, {"tp": [-1, 2]}, {"tp": [0]},
                                 {"tp": "0/2"}, {"tp": [True, 2]}, [["tp", 0, 2]]])
def test_bad_coordinates_are_refused(bad: Any) -> None:
    with pytest.raises(WireError, match="coords"):
        wire.decode(wire.encode("hello", KEY, 0, 1.0, dict(HELLO, coords=bad)))


def test_stage_time_is_an_optional_step_field() -> None:
    step = {"step": 1, "wall_s": 0.1, "tokens": 0, "drops": 0, "stage_s": 0.05}
    assert wire.decode(wire.encode("steps", KEY, 0, 1.0, {"records": [step]})).fields["records"][0]["stage_s"] == 0.05
    with pytest.raises(WireError, match="stage_s"):
        wire.decode(wire.encode("step", KEY, 0, 1.0, dict(step, stage_s=-1.0)))


# --- the probe on real meshes ------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import parallel_coords_worker as w

    out = tmp_path_factory.mktemp("coords")
    mp.spawn(w.worker, args=(_free_port(), str(out)), nprocs=4, join=True)
    return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(4)]


def test_coordinates_from_the_process_groups_alone(four_ranks: list[dict[str, Any]]) -> None:
    """A (pp 2, cp 2) mesh nobody holds: DeviceMesh's "mesh_pp"/"mesh_cp" groups say it all."""
    for r, res in enumerate(four_ranks):
        g = res["groups_only"]
        assert g["dims"] == [["cp", r % 2, 2], ["pp", r // 2, 2]]
        assert g["coords"] == {"dp": [0, 1], "pp": [r // 2, 2], "cp": [r % 2, 2]}, g["source"]


@pytest.mark.parametrize(("scenario", "expect"), [
    ("dp_tp", lambda r: {"dp": [r // 2, 2], "tp": [r % 2, 2]}),
    ("hsdp", lambda r: {"dp": [r, 4]}),  # dp_replicate × dp_shard, major first: 2·(r // 2) + r % 2
    ("pp_tp", lambda r: {"dp": [0, 1], "pp": [r // 2, 2], "tp": [r % 2, 2]}),
    ("expert", lambda r: {"dp": [r, 4], "ep": [r % 2, 2]}),  # the expert mesh adds ep only
])
def test_coordinates_from_meshes(four_ranks: list[dict[str, Any]], scenario: str, expect: Any) -> None:
    for r, res in enumerate(four_ranks):
        got = res[scenario]
        assert got["complete"] and got["coords"] == expect(r), got["source"]
        if scenario != "expert":
            assert got["meshes_found"] == 1  # held three levels down; a flattened view is the same root


def test_an_expert_mesh_over_the_whole_world_makes_the_global_rank_its_data_index() -> None:
    """The simplest expert parallelism, a 1-D ``ep`` mesh over every rank, read "dp … (rank not
    known)" and its expert load pooled "(the ranks' ep coordinates fit no expert-parallel
    grouping)" (a new user's trial). With no tp, pp or cp every rank is a replica of its own,
    so its global rank is its data index: one ep group, as the module doc's rule gives."""
    from flowtop.monitor.parallelism import ep_groups
    from probe.steps.parallel import Dim, Found, coordinates
    from test_hints_factories import rank

    coords = [coordinates(None, Found(), r, 2, groups=[Dim("ep", r, 2)]) for r in range(2)]
    assert [c.roles for c in coords] == [{"dp": (0, 2), "ep": (0, 2)}, {"dp": (1, 2), "ep": (1, 2)}]
    assert all(c.complete and c.source.endswith("dp = world 2 / (tp·pp·cp) = 2, the global rank") for c in coords)
    ranks = [dataclasses.replace(rank(r), coords=c.roles) for r, c in enumerate(coords)]
    found = ep_groups(ranks)
    assert found is not None and [[r.rank for r in g] for g in found[0]] == [[0, 1]]
    # with tp the data index is not the global rank: still unknown
    tp = coordinates(None, Found(), 1, 4, groups=[Dim("tp", 1, 2)])
    assert "dp" not in tp.roles and "(rank not known)" in tp.source


def test_a_dim_of_unknown_role_makes_the_layout_unknown(four_ranks: list[dict[str, Any]]) -> None:
    for res in four_ranks:
        got = res["unknown_dim"]
        assert not got["complete"] and got["coords"] is None
        assert got["source"].startswith("unknown: mesh dim 'foo' has no known role (mesh (dp=2, foo=2))")


# --- the monitor: tokens once per data-parallel replica -----------------------------------------

def _job(layout: list[dict[str, list[int]] | None], tokens: list[int], flops: list[float | None] | None = None,
         stage_s: list[float] | None = None, extra: list[dict[str, Any]] | None = None) -> tuple[Model, Any]:
    """A job of len(layout) ranks fed real wire frames: hello (with coords where given), 10 steps of
    0.5 s with ``tokens[r]`` tokens each, a flops message when ``flops[r]`` is given (with the
    fields of ``extra[r]`` added)."""
    m = Model()
    n = len(layout)

    def send(rank: int, kind: str, fields: dict[str, Any], seq: int, t: float) -> None:
        m.ingest(wire.decode(wire.encode(kind, RankKey("job", "h", 100 + rank, rank, 0), seq, t, fields)), t)

    for r, coords in enumerate(layout):
        hello = dict(HELLO, local_rank=r, world_size=n)
        if coords is not None:
            hello.update(coords=coords, coords_source="test layout")
            if "pp" in coords:
                hello["pp_stages"] = [coords["pp"][0]]
        send(r, "hello", hello, 0, 0.0)
        for s in range(1, 11):
            step = {"step": s, "wall_s": 0.5, "tokens": tokens[r], "drops": 0}
            if stage_s is not None:
                step["stage_s"] = stage_s[r]
            send(r, "step", step, s, s * 0.5)
        if flops is not None and flops[r] is not None:
            send(r, "flops", {"step": 2, "model_flops": flops[r], "executed_flops": flops[r], "attention": "full",
                              "dtype": "fp32", "peak_flops": 1e12, "peak_source": "test", "uncounted": {},
                              "tokens": tokens[r], **(extra[r] if extra else {})}, 11, 5.0)
    return m, m.snapshot(5.2).jobs[0]


def test_dp2_tp2_counts_each_replica_once() -> None:
    """4 ranks, each 1,000 tokens per 0.5 s step (2,000 tokens/s): the two TP ranks of a replica
    embed the same tokens, so the job has 2 replicas × 2,000 = 4,000 tokens/s, not 8,000."""
    layout = [{"dp": [r // 2, 2], "tp": [r % 2, 2]} for r in range(4)]
    m, job = _job(layout, [1000] * 4, flops=[4e9] * 4)
    assert job.tokens_per_s == pytest.approx(4000.0) and job.tokens_basis == parallelism.TOKENS_ONCE
    # FLOP/s are Σ over all ranks (each counts its local half): 4 × 4e9 / 1,000 × 2,000 tokens/s
    assert job.flops.flops_per_s == pytest.approx(4 * 8e12 / 1000)
    assert job.flops.flops_per_token == pytest.approx(8e6)  # Σ 4 × 4e9 FLOPs ÷ 2 replicas × 1,000 tokens
    data = to_json(m.snapshot(5.2))
    assert_valid_snapshot(data)
    ranks = data["jobs"][0]["ranks"]
    assert ranks[3]["coords"] == {"dp": {"rank": 1, "size": 2}, "tp": {"rank": 1, "size": 2}}
    assert data["jobs"][0]["tokens_per_s_basis"] == parallelism.TOKENS_ONCE
    assert coords_text(job.ranks[3]).plain == "parallel dp 1/2 · tp 1/2"


def test_cp_shards_are_summed_and_pp_takes_the_first_stage() -> None:
    """pp 2 × cp 2: stage 0's two cp ranks embed 500 tokens each (halves of the same sequences),
    stage 1 embeds none: 2 × 1,000 tokens/s."""
    layout = [{"dp": [0, 1], "pp": [r // 2, 2], "cp": [r % 2, 2]} for r in range(4)]
    _, job = _job(layout, [500, 500, 0, 0])
    assert job.tokens_per_s == pytest.approx(2000.0)


def test_unknown_layout_sums_every_rank_and_says_so() -> None:
    layout: list[Any] = [{"dp": [0, 1], "tp": [r, 2]} for r in range(2)] + [None, None]
    _, job = _job(layout, [1000] * 4)
    assert job.tokens_per_s == pytest.approx(8000.0)
    assert job.tokens_basis == "tokens summed over all ranks (no mesh known on 2 of 4 ranks)"
    _, job = _job([None, None], [1000, 1000])
    assert job.tokens_basis == parallelism.TOKENS_SUMMED and job.tokens_per_s == pytest.approx(4000.0)


def test_pipeline_stages_per_data_parallel_replica() -> None:
    """dp 2 × pp 2 (ranks 0, 1 = stage 0 of replicas 0, 1; ranks 2, 3 = stage 1): a stage's FLOPs
    per step are one replica's (Σ ÷ 2); its compute time the median over its ranks."""
    layout = [{"dp": [r % 2, 2], "pp": [r // 2, 2]} for r in range(4)]
    m, job = _job(layout, [1000, 1000, 0, 0], flops=[3e9, 3e9, 5e9, 5e9], stage_s=[0.2, 0.22, 0.3, 0.34])
    assert job.tokens_per_s == pytest.approx(4000.0)
    s0, s1 = job.stages
    assert (s0.pp_rank, s0.stages, s0.ranks, s1.ranks) == (0, (0,), (0, 1), (2, 3))
    assert (s0.model_flops_per_step, s1.model_flops_per_step) == (3e9, 5e9)
    assert s0.flops_share == pytest.approx(3 / 8) and s1.stage_time_s == pytest.approx(0.32)
    text = render(m.snapshot(5.2))
    assert "  tokens/s: tokens once per data-parallel replica" in text
    m_none, job_none = _job(layout, [0] * 4)  # no rank saw an embedding: no tokens/s, nothing to qualify
    assert job_none.tokens_per_s is None and "tokens/s:" not in render(m_none.snapshot(5.2))
    stale = m_none.snapshot(60.0)  # silent since 5 s: stale ranks whose tokens were never known
    assert {r.status for r in stale.jobs[0].ranks} == {"stale"}
    assert all(r.tokens_per_s is None and r.tokens_per_step is None for r in stale.jobs[0].ranks)
    assert stale.jobs[0].tokens_per_s is None and "tokens/s:" not in render(stale)
    # stage 0's ranks embed their tokens (0 while stale), stage 1's never see any (unknown)
    assert [r.tokens_per_s for r in sorted(m.snapshot(60.0).jobs[0].ranks, key=lambda r: r.rank)] == [0.0, 0.0, None, None]
    assert "  pp 1 (stage 1, ranks 2,3): 5.00GFLOP/step (62.5% of the pipeline)  compute 320ms/step  step 500ms" in text
    assert_valid_snapshot(to_json(m.snapshot(5.2)))


@pytest.mark.asyncio
async def test_rank_detail_shows_the_coordinates() -> None:
    """The detail screen's title gains a third line with the rank's coordinates and stage figures
    (synthetic ranks, which have none, keep their two lines: the goldens do not change)."""
    import dataclasses

    from flowtop.tui.app import FlowtopApp
    from synthetic.replay import ReplaySource, synthetic_stream
    from flowtop.tui.screens.rank_detail_screen import RankDetailScreen

    def with_coords(snap: Any) -> Any:
        job = snap.jobs[0]
        ranks = tuple(dataclasses.replace(r, coords={"dp": (0, 1), "pp": (r.rank, 2)}, pp_stages=(r.rank,),
                                          stage_time_s=0.00735) for r in job.ranks)
        return dataclasses.replace(snap, jobs=(dataclasses.replace(job, ranks=ranks),))

    app = FlowtopApp(ReplaySource([with_coords(s) for s in synthetic_stream()], advance=False), refresh_s=0)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("down", "d")  # rank 0 (worst first)
        await pilot.pause()
        assert isinstance(app.screen, RankDetailScreen) and app.screen.rank == 0
        title = app.screen.query_one("#detail-title")
        assert title.size.height == 3
        assert str(title.render()).splitlines()[2] == "parallel dp 0/1 · pp 0/2  stage 0  stage compute/step 7.35ms"


def test_stage_timer_on_a_real_pipeline_stage(tmp_path: Path) -> None:
    """probe.steps.pipeline.StageTimer wraps a real PipelineStage's chunk methods (one process, one stage,
    GPipe over 2 micro-batches whose forwards sleep 10 ms each): the step's compute time is at least
    the 20 ms slept, the stage is found on its forward's stack, and close() gives the stage its own
    methods back."""
    import parallel_coords_worker as w

    mp.spawn(w.stage_timer_worker, args=(_free_port(), str(tmp_path)), nprocs=1, join=True)
    res = json.loads((tmp_path / "stage_timer.json").read_text())
    assert res["first"] >= 0.02
    assert res["wrapped"] == ["backward_one_chunk", "backward_weight_one_chunk", "forward_one_chunk"]
    assert res["restored"] and res["after_close"] is None
    assert res["stages_found"] == [True]
    assert res["coords"] == {"coords_source": "pipeline stage 0 of 1; dp = world 1 / (tp·pp·cp) = 1",
                             "coords": {"dp": [0, 1]}, "pp_stages": [0]}  # pp of size 1 is not listed


# --- expert load per expert-parallel group --------------------------------------------------------

#: Tokens per local expert (2 local experts of one MoE layer per rank), chosen so that pooling
#: the ranks and grouping them disagree: group {0, 1} is even, group {2, 3} is not.
EP_LOADS = [[10, 10], [10, 10], [30, 2], [4, 4]]


def test_expert_load_is_taken_per_expert_parallel_group() -> None:
    """dp 4 × ep 2 (the expert mesh re-splits dp, ep innermost): ranks 0, 1 hold experts 0-3 of
    the layer for replica group 0, ranks 2, 3 the same experts for group 1. By hand, group {0, 1}:
    [10, 10, 10, 10], max/mean 10 / 10 = 1.0; group {2, 3}: [30, 2, 4, 4], 30 / (40 / 4) = 3.0 —
    the job shows 3.0, names ranks 2, 3 and counts the layer's 4 experts (pooling would say 8).
    Rank max/mean over all ranks: routed [20, 20, 32, 8], 32 / 20 = 1.6."""
    layout = [{"dp": [r, 4], "ep": [r % 2, 2]} for r in range(4)]
    extra = [{"expert_load": {"layers.0.moe": load}} for load in EP_LOADS]
    m, job = _job(layout, [100] * 4, flops=[1e9] * 4, extra=extra)
    x = job.flops.expert_load
    assert (x.groups, x.worst_group, x.experts, x.layers) == (2, (2, 3), 4, 1)
    assert x.max_over_mean == pytest.approx(3.0) and x.mean_max_over_mean == pytest.approx(3.0)
    assert x.worst_layer == "layers.0.moe"
    assert x.routed_tokens == 80 and x.ranks == 4 and x.rank_max_over_mean == pytest.approx(1.6)
    assert x.grouping.startswith("per expert-parallel group (2 groups of ep 2 over dp·cp")
    data = to_json(m.snapshot(5.2))
    assert_valid_snapshot(data)
    j = data["jobs"][0]["expert_load"]
    assert (j["groups"], j["worst_group"], j["max_over_mean"]) == (2, [2, 3], pytest.approx(3.0))
    r0 = data["jobs"][0]["ranks"][0]["expert_load"]  # a rank's own: no grouping
    assert (r0["groups"], r0["worst_group"], r0["grouping"], r0["max_over_mean"]) == (None, [], "", 1.0)
    from flowtop.tui.widgets.flops_panel import flops_text

    text = flops_text(job.ranks[2].flops, job.flops).plain  # the rank detail's FLOP panel
    assert "experts job max/mean 3.00  worst of 2 EP groups: ranks 2-3; rank max/mean 1.60 (routed tokens)" in text


def test_pooling_would_hide_an_uneven_group() -> None:
    """The same ranks with rank 3 swapped for an even one: group {2, 3} is [30, 2, 16, 16] →
    30 / 16 = 1.875 by hand, while pooling all 8 experts [10, 10, 10, 10, 30, 2, 16, 16] reads
    30 / 13 = 2.31 (the even group's light experts lower the mean). Without coordinates the
    job pools, and says so."""
    loads = [[10, 10], [10, 10], [30, 2], [16, 16]]
    extra = [{"expert_load": {"moe": load}} for load in loads]
    _, job = _job([{"dp": [r, 4], "ep": [r % 2, 2]} for r in range(4)], [100] * 4, flops=[1e9] * 4, extra=extra)
    assert job.flops.expert_load.max_over_mean == pytest.approx(30 / 16)
    _, pooled = _job([None] * 4, [100] * 4, flops=[1e9] * 4, extra=extra)
    x = pooled.flops.expert_load
    assert x.max_over_mean == pytest.approx(30 / 13) and x.experts == 8
    assert (x.groups, x.worst_group, x.grouping) == (None, (), parallelism.POOLED_UNKNOWN)


def test_expert_groups_without_expert_parallelism_and_with_experts_over_tp() -> None:
    """dp 2 with every expert on every rank (no ep): each rank is its own group, by hand
    rank 1's [30, 2] → 30 / 16 = 1.875. dp 2 × tp 2 with ep 4 spanning dp and tp (experts split
    over tp too): ep rank = 2·dp + tp, one group of all 4 ranks."""
    extra = [{"expert_load": {"moe": load}} for load in ([10, 10], [30, 2])]
    _, job = _job([{"dp": [r, 2]} for r in range(2)], [100] * 2, flops=[1e9] * 2, extra=extra)
    x = job.flops.expert_load
    assert (x.groups, x.worst_group, x.max_over_mean) == (2, (1,), pytest.approx(1.875))
    assert x.grouping.startswith("per rank (2; no expert parallelism")
    layout = [{"dp": [r // 2, 2], "tp": [r % 2, 2], "ep": [r, 4]} for r in range(4)]
    extra = [{"expert_load": {"moe": load}} for load in EP_LOADS]
    _, job = _job(layout, [100] * 4, flops=[1e9] * 4, extra=extra)
    x = job.flops.expert_load
    assert (x.groups, x.worst_group, x.experts) == (1, (0, 1, 2, 3), 8)
    assert x.max_over_mean == pytest.approx(30 / 10) and "over dp·cp·tp" in x.grouping
    # ep coordinates that fit neither grouping: pooled, and said so
    misfit = [{"dp": [r, 4], "ep": [(r + 1) % 2, 2]} for r in range(4)]
    _, job = _job(misfit, [100] * 4, flops=[1e9] * 4, extra=[{"expert_load": {"moe": load}} for load in EP_LOADS])
    assert job.flops.expert_load.grouping == parallelism.POOLED_MISFIT


def test_snapshot_text_shows_coordinates_mfu_bf16_and_expert_groups() -> None:
    """`flowtop snapshot` text: a coords column and, for a job whose mix is not pure bf16, the
    bf16-equivalent MFU beside MFU, job and ranks. dp 2 × tp 2, 1e9 model FLOPs per 0.5 s step
    of 100 tokens = 2e9 FLOP/s per rank. Rank 0: 8e8 fp8 FLOPs at 10 GF/s + 2e8 bf16 at 5 GF/s,
    ideal 0.08 + 0.04 = 0.12 s of 0.5 s = MFU 24.0 %, bf16-eq 2e9 / 5e9 = 40.0 %; ranks 1-3 all
    bf16 at 5 GF/s: 40.0 % both. Job: Σ 8e9 FLOP/s ÷ Σ mix peaks (1e9 / 0.12 + 3 × 5e9 =
    23.33e9) = 34.3 %; bf16-eq 8e9 / 20e9 = 40.0 %."""
    layout = [{"dp": [r // 2, 2], "tp": [r % 2, 2]} for r in range(4)]
    fp8 = {"flops_by_dtype": {"fp8_e4m3": [8e8, 8e8], "bf16": [2e8, 2e8]},
           "peak_by_dtype": {"fp8_e4m3": 10e9, "bf16": 5e9}}
    bf16 = {"flops_by_dtype": {"bf16": [1e9, 1e9]}, "peak_by_dtype": {"bf16": 5e9}}
    m, job = _job(layout, [100] * 4, flops=[1e9] * 4, extra=[fp8, bf16, bf16, bf16])
    assert job.ranks[0].flops.mfu == pytest.approx(0.24) and job.ranks[0].flops.mfu_bf16 == pytest.approx(0.4)
    assert job.flops.mfu == pytest.approx(8e9 / (1e9 / 0.12 + 15e9)) and job.flops.mfu_bf16 == pytest.approx(0.4)
    text = render(m.snapshot(5.2))
    assert "  model 8.00GFLOP/s  MFU 34.3%  MFU bf16-eq 40.0%  HFU" in text
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank "))
    assert lines[head].split() == ["rank", "host", "step", "time", "tok/s", "FLOP/s", "MFU", "bf16eq", "coords",
                                   "status"]
    assert lines[head + 1].split()[-5:] == ["24.0%", "40.0%", "dp0", "tp0", "live"]
    assert lines[head + 4].split()[-5:] == ["40.0%", "40.0%", "dp1", "tp1", "live"]
    # all bf16 and no mesh: the table as before
    _, plain = _job([None, None], [100] * 2, flops=[1e9] * 2, extra=[bf16, bf16])
    from flowtop.monitor.snapshot import MonitorSnapshot

    bare = render(MonitorSnapshot(taken_at=0.0, listen="x", received=0, rejected=0, jobs=(plain,)))
    assert "bf16" not in bare.split("]")[-1] and "coords" not in bare
    # the expert load line: the worst EP group, by its ranks
    ep = [{"dp": [r, 4], "ep": [r % 2, 2]} for r in range(4)]
    m, _ = _job(ep, [100] * 4, flops=[1e9] * 4, extra=[{"expert_load": {"moe": load}} for load in EP_LOADS])
    text = render(m.snapshot(5.2))
    assert ("  experts: max/mean 3.00 tokens per expert (worst: ranks 2-3, layer moe); rank max/mean 1.60; "
            "per expert-parallel group (2 groups of ep 2 over dp·cp") in text
    assert "dp1 ep1" in text  # rank 1's coordinates
