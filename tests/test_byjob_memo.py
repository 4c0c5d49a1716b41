"""Figures of a kept job snapshot (the same object from tick to tick, flowtop.monitor.endedjobs)
are computed once, not for every snapshot shown or scraped: the TUI's rank view (order, filter,
node groups), the percentile line and the exporter's percentiles and node figures."""

from __future__ import annotations

import dataclasses

import pytest

from flowtop.export import rank_series
from flowtop.export.exporter import ExportPolicy, snapshot_families
from flowtop.monitor import rankstats, rankview
from flowtop.monitor.byjob import ByJob
from flowtop.monitor.rankview import ViewSpec, build_view
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot, RankSnapshot


def _job(name: str = "j", ranks: int = 16) -> JobSnapshot:
    rs = tuple(RankSnapshot(rank=r, host=f"h{r // 4}", pid=100 + r, local_rank=r % 4, incarnation=0,
                            device="cpu", status="live", step=10, step_time_s=0.1 + 0.01 * r, device_time_s=None,
                            tokens_per_step=None, tokens_per_s=None, input_wait_frac=0.01 * r, heard_at=1.0,
                            lost_messages=0, dropped_messages=0, probe_overhead_frac=None)
               for r in range(ranks))
    return JobSnapshot(job=name, world_size=ranks, ranks=rs, step=10, step_time_s=0.25, tokens_per_s=None,
                       flops=None, status="running")


def _counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_percentiles_of_the_same_snapshot_are_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, rankstats, "percentiles")
    job = _job()
    first = rankstats.job_percentiles(job)
    assert rankstats.job_percentiles(job) is first and len(calls) == 3  # step time, MFU, wait: once
    again = rankstats.job_percentiles(dataclasses.replace(job))  # a new snapshot: computed again
    assert again == first and len(calls) == 6


def test_the_rank_view_of_the_same_snapshot_and_spec_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, rankview, "node_group")
    job, spec = _job(), ViewSpec()
    view = build_view(job, spec)
    groups = [row.group for row in view.rows if isinstance(row, rankview.NodeRow)]
    assert len(groups) == 4 and len(calls) == 4
    again = build_view(job, ViewSpec())  # an equal spec
    assert again is view and [row.group for row in again.rows if isinstance(row, rankview.NodeRow)] == groups
    assert len(calls) == 4  # the node rows kept their groups
    assert build_view(job, dataclasses.replace(spec, reverse=True)) is not view  # another spec
    assert build_view(dataclasses.replace(job), spec) is not view  # another snapshot


def test_the_exporters_node_figures_of_the_same_snapshot_are_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, rank_series, "node_group")
    job = _job(ranks=16)
    snap = MonitorSnapshot(taken_at=2.0, listen="", jobs=(job,), received=0, rejected=0)
    policy = ExportPolicy(max_ranks=4)  # node series, not rank series
    first = snapshot_families(snap, policy)
    assert len(calls) == 4
    later = MonitorSnapshot(taken_at=2.5, listen="", jobs=(job,), received=0, rejected=0)  # the next tick's, the job kept
    assert first and snapshot_families(later, policy)
    assert len(calls) == 4


def test_by_job_remembers_the_last_object_per_name_and_forgets_the_oldest_name() -> None:
    memo: ByJob[int] = ByJob(size=2)
    a, b, c = object(), object(), object()
    assert memo.get("a", a, lambda: 1) == 1 and memo.get("a", a, lambda: 2) == 1
    assert memo.get("a", b, lambda: 3) == 3  # another object of the same name
    memo.get("b", b, lambda: 4)
    memo.get("c", c, lambda: 5)  # "a" was the oldest
    assert memo.get("a", b, lambda: 6) == 6 and memo.get("c", c, lambda: 7) == 5
