"""A finished rank or job keeps its last hints, marked ended with the steps they held for.

The engine and the model are the real ones; the snapshots come from the hint factories (real
dataclasses) or from validated wire messages. The end-to-end run is in test_hints_e2e.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flowtop.monitor.hints import HintEngine
from synthetic.replay import synthetic_snapshot
from flowtop.monitor.snapshot import Hint, MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json
from flowtop.export.textreport import render
from flowtop.tui.widgets.hints_panel import HintsPanel, hint_prompt
from flowtop.monitor.wiring import make_model
from probe.wire import RankKey, decode, encode
from snapshot_schema import assert_valid_snapshot
from test_hints_factories import flops, history, job, rank

WAIT = history(16, 0.1, wait_s=0.033)  # steps 1..16, 33 % of each step waiting for input


def _only(hints: tuple[Hint, ...], rule: str) -> Hint:
    (h,) = [h for h in hints if h.id == rule]
    return h


def test_a_rank_that_says_bye_keeps_its_hints_marked_ended() -> None:
    engine = HintEngine()
    running = job(rank(0, step=16, hist=WAIT), rank(1, step=16, hist=history(16)))
    live = _only(engine.evaluate(running, 0.0), "input_wait")
    # The measure's window is the last 10 steps: 7..16.
    assert (live.ended, live.first_step, live.last_step) == (False, 7, 16)
    assert live.evidence["input_wait_pct"] == pytest.approx(33.0) and live.severity == "critical"
    # Rank 0 finishes, rank 1 runs on (and makes a new hint of its own): rank 0's is kept, ended.
    r1 = rank(1, step=30, hist=history(30, wait_s=0.02, first=1))
    after = engine.evaluate(job(rank(0, step=16, hist=WAIT, status="done"), r1), 1.0)
    ended = [h for h in after if h.ended]
    assert [(h.id, h.target, h.first_step, h.last_step) for h in ended] == [("input_wait", "rank 0", 7, 16)]
    assert ended[0].summary == live.summary and ended[0].evidence == live.evidence  # frozen as shown
    assert after[-1] is ended[0]  # after the active hints
    assert [(h.target, h.ended) for h in after if h.id == "input_wait"] == [("rank 1", False), ("rank 0", True)]
    # Every rank done: the job's hints are all kept, ended, and nothing is measured any more.
    done = job(rank(0, step=16, hist=WAIT, status="done"), dataclasses.replace(r1, status="done"), status="done")
    final = engine.evaluate(done, 2.0)
    assert final and all(h.ended for h in final)
    assert {(h.target, h.first_step, h.last_step) for h in final} == {("rank 0", 7, 16), ("rank 1", 21, 30)}
    assert engine.evaluate(done, 500.0) == final  # they stay until the job is evicted ...
    engine.forget("job1")
    assert engine.evaluate(done, 501.0) == ()  # ... and go with it


def test_job_hints_end_with_the_job_and_a_restart_supersedes_an_ended_hint() -> None:
    engine = HintEngine()
    fl = flops(uncounted={"aten::my_op": 3})
    engine.evaluate(job(rank(0, step=16, hist=WAIT, fl=fl), fl=fl), 0.0)
    final = engine.evaluate(job(rank(0, step=16, hist=WAIT, fl=fl, status="done"), fl=fl, status="done"), 1.0)
    assert {h.id for h in final} == {"input_wait", "uncounted_ops"} and all(h.ended for h in final)
    assert _only(final, "uncounted_ops").last_step == 16
    # The rank comes back (a new incarnation) and waits again: its live hint replaces the ended one.
    again = engine.evaluate(job(rank(0, step=16, hist=WAIT, incarnation=1), fl=fl), 2.0)
    waits = [h for h in again if h.id == "input_wait"]
    assert len(waits) == 1 and not waits[0].ended


def test_ended_hints_in_json_text_and_the_hints_panel() -> None:
    engine = HintEngine()
    engine.evaluate(job(rank(0, step=16, hist=WAIT)), 0.0)
    done = job(rank(0, step=16, hist=WAIT, status="done"), status="done")
    done = dataclasses.replace(done, hints=engine.evaluate(done, 1.0))
    snap = MonitorSnapshot(1.0, "tcp://127.0.0.1:5759", (done,), 17, 0)
    data = to_json(snap)
    assert_valid_snapshot(data)
    (h,) = data["jobs"][0]["hints"]
    assert (h["id"], h["ended"], h["first_step"], h["last_step"]) == ("input_wait", True, 7, 16)
    assert "  [critical] (ended, steps 7–16) rank 0 waits for input 33 % of each step -> " in render(snap)
    prompt = hint_prompt(done.hints[0], expanded=False, now=1.0)
    assert prompt.plain.endswith("rank 0 waits for input 33 % of each step (impact 33%) (ended, steps 7–16)")
    assert any("dim" in str(span.style) and span.start == 0 and span.end == len(prompt.plain) for span in prompt.spans)
    assert [h.ended for h in _panel_order(done.hints)] == [True]


def _panel_order(hints: tuple[Hint, ...]) -> list[Hint]:
    from flowtop.tui.widgets.hints_panel import ordered

    return ordered(hints)


@pytest.mark.asyncio
async def test_hints_panel_shows_ended_hints_dimmed_after_the_active_ones() -> None:
    from flowtop.tui.app import FlowtopApp
    from synthetic.replay import ReplaySource

    base = synthetic_snapshot(120, with_kernels=False)
    j = base.jobs[0]
    live = Hint("input_wait", "warning", "rank", "rank 1", "rank 1 waits for input 6 % of each step", {}, "fix", 0.06)
    ended = dataclasses.replace(live, id="straggler", severity="critical", target="rank 0", impact=0.5,
                                summary="rank 0 is 60 % slower", ended=True, first_step=40, last_step=118)
    snap = dataclasses.replace(base, jobs=(dataclasses.replace(j, hints=(ended, live)),))
    app = FlowtopApp(ReplaySource([snap], advance=False), refresh_s=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        panel = app.screen.query_one(HintsPanel)
        assert panel.border_title == "hints (1 + 1 ended)"
        texts = [panel.get_option_at_index(i).prompt for i in range(panel.option_count)]
        plains = [getattr(t, "plain", str(t)) for t in texts]
        # The ended critical hint comes after the active warning, whatever its severity.
        assert "rank 1 waits for input" in plains[0] and "(ended" not in plains[0]
        assert plains[1].endswith("rank 0 is 60 % slower (impact 50%) (ended, steps 40–118)")


class _Feeder:
    def __init__(self, model: Any) -> None:
        self.model, self.seq = model, {}  # type: ignore[var-annotated]

    def send(self, key: RankKey, kind: str, now: float, **fields: Any) -> None:
        seq = self.seq[key] = self.seq.get(key, -1) + 1
        self.model.ingest(decode(encode(kind, key, seq, 1.0, fields)), now)


def test_a_bye_takes_a_last_look_so_a_snapshot_taken_only_at_the_end_keeps_the_hint() -> None:
    """No tick ran while the rank trained (a training shorter than the tick cadence, a monitor
    started late): the hints come from the look the model takes at a bye, and the first tick
    after it marks them ended."""
    model = make_model()
    f = _Feeder(model)
    key = RankKey("headless", "h", 7, 0, 0)
    f.send(key, "hello", 0.0, local_rank=0, world_size=1, device="cpu (test)", probe_version="t")
    for step in range(1, 17):
        f.send(key, "step", 0.1 * step, step=step, wall_s=0.1, tokens=64, drops=0, input_wait_s=0.033)
    f.send(key, "bye", 1.7, reason="exit", steps=16, drops=0)
    before = model.snapshot(2.0)  # a pure read: the last look's hint, not ended yet (no tick)
    assert _only(before.jobs[0].hints, "input_wait").ended is False
    snap = model.tick(2.0)  # the first tick ever
    assert model.snapshot(2.1).jobs[0].hints == snap.jobs[0].hints  # snapshots read the tick's hints
    (j,) = snap.jobs
    assert j.status == "done"
    h = _only(j.hints, "input_wait")
    assert (h.ended, h.first_step, h.last_step, h.target) == (True, 7, 16, "rank 0")
    assert h.evidence["input_wait_pct"] == pytest.approx(33.0)
    assert_valid_snapshot(to_json(snap))
