"""A rank hint that many ranks share is one line in the hints panel and the text report.

The hints come from the real engine over hint-factory snapshots (real dataclasses); the panel is
driven in the real app by a replay source. The snapshot itself keeps every rank's hint.
"""

from __future__ import annotations

import dataclasses

import pytest

from flowtop.export.textreport import render
from flowtop.monitor.hints import HintEngine
from flowtop.monitor.hints.groups import GROUP_AT, HintGroup, grouped, rank_ranges
from flowtop.monitor.snapshot import Hint, JobSnapshot
from synthetic.replay import synthetic_snapshot
from test_hints_factories import history, job, rank


def _waiting_job(waits: dict[int, float], n: int) -> JobSnapshot:
    """n ranks of 0.1 s steps; rank r waits waits[r] seconds of each (none where not listed)."""
    return job(*(rank(r, step=16, hist=history(16, 0.1, wait_s=waits.get(r, 0.0))) for r in range(n)))


def _hints(j: JobSnapshot) -> tuple[Hint, ...]:
    return HintEngine().evaluate(j, 0.0)


def test_rank_ranges_by_hand() -> None:
    assert rank_ranges([0, 1, 2, 3, 5]) == "0-3, 5"
    assert rank_ranges(list(range(4096))) == "0-4095"
    assert rank_ranges([1, 3, 5, 7, 9, 11, 13, 15]) == "1, 3, 5, 7, 9, 11, …"


def test_five_ranks_waiting_are_one_group_led_by_the_one_with_most_at_stake() -> None:
    # Ranks 0-3 wait 33 ms of 100, rank 5 waits 40 ms; rank 4 does not wait.
    j = _waiting_job({0: 0.033, 1: 0.033, 2: 0.033, 3: 0.033, 5: 0.040}, 6)
    hints = _hints(j)
    assert sorted(h.target for h in hints if h.id == "input_wait") == ["rank 0", "rank 1", "rank 2", "rank 3", "rank 5"]
    rows = grouped(hints, j.ranks)
    (group,) = [r for r in rows if isinstance(r, HintGroup)]
    assert not [r for r in rows if isinstance(r, Hint) and r.id == "input_wait"]  # all in the group
    assert group.label() == "5 ranks (0-3, 5)" and group.ranks == (0, 1, 2, 3, 5)
    assert group.lead.target == "rank 5" and group.lead.evidence["input_wait_pct"] == pytest.approx(40.0)
    assert [h.target for h in group.hints] == ["rank 0", "rank 1", "rank 2", "rank 3", "rank 5"]
    # The text report: one line for the five, naming the rank with the most at stake.
    snap = synthetic_snapshot(120, with_kernels=False)
    text = render(dataclasses.replace(snap, jobs=(dataclasses.replace(j, hints=hints),)))
    hint_lines = [line for line in text.splitlines() if line.startswith("  [")]
    assert len(hint_lines) == len(rows)  # one line per panel row, not per hint
    assert sum("5 ranks (0-3, 5), most at stake: rank 5 waits for input 40 % of each step" in line
               for line in hint_lines) == 1


def test_fewer_ranks_than_the_group_size_stay_apart() -> None:
    waiting = {r: 0.033 for r in range(GROUP_AT - 1)}
    j = _waiting_job(waiting, GROUP_AT + 1)
    rows = grouped(_hints(j), j.ranks)
    assert not any(isinstance(r, HintGroup) for r in rows)
    assert sorted(r.target for r in rows if isinstance(r, Hint) and r.id == "input_wait") == [
        f"rank {r}" for r in range(GROUP_AT - 1)]


@pytest.mark.asyncio
async def test_the_hints_panel_shows_4096_rank_hints_as_one_expandable_line() -> None:
    from flowtop.tui.app import FlowtopApp
    from flowtop.tui.widgets.hints_panel import HintsPanel
    from synthetic.replay import ReplaySource

    base = synthetic_snapshot(120, with_kernels=False)
    j = base.jobs[0]
    ranks = tuple(dataclasses.replace(j.ranks[0], rank=r) for r in range(4096))
    same = [Hint("launch_bound", "warning", "rank", f"rank {r}", "launches outrun short kernels",
                 {"short_pct": 80.0}, "use CUDA graphs", 0.2 + (0.1 if r == 17 else 0.0)) for r in range(4096)]
    job_hint = Hint("attention_flops_note", "info", "job", "", "attention counted causal", {}, "none", 0.0)
    snap = dataclasses.replace(base, jobs=(dataclasses.replace(j, ranks=ranks, world_size=4096,
                                                               hints=(*same, job_hint)),))
    app = FlowtopApp(ReplaySource([snap], advance=False), refresh_s=0)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        panel = app.screen.query_one(HintsPanel)
        assert panel.border_title == "hints (4,097)" and panel.option_count == 2
        first = panel.get_option_at_index(0)
        assert first.prompt.plain.startswith(
            "▸ WARN 4,096 ranks (0-4095), most at stake: rank 17: launches outrun short kernels (impact 30%)")
        panel.toggle(str(first.id))
        await pilot.pause()
        expanded = panel.get_option_at_index(0).prompt.plain
        assert "fix: use CUDA graphs" in expanded


def test_a_hint_whose_rank_is_gone_is_counted_after_the_known_ranks_and_never_leads_a_tie() -> None:
    # An ended hint of a process the monitor forgot (to make room) keeps its target, which no rank
    # of the job names any more: counted in the group, not listed, and not its lead on equal impact.
    j = _waiting_job({}, 8)
    same = [Hint("input_wait", "warning", "rank", f"rank {r}", "waits", {}, "fix", 0.2) for r in (9, 0, 1, 2)]
    (group,) = grouped(same, j.ranks)
    assert isinstance(group, HintGroup)
    assert group.lead.target == "rank 0" and group.ranks == (0, 1, 2)
    assert group.label() == "4 ranks (0-2, …)" and group.hints[-1].target == "rank 9"


@pytest.mark.asyncio
async def test_the_panel_redraws_a_group_whose_ranks_changed_under_the_same_hints() -> None:
    from textual.app import App, ComposeResult

    from flowtop.tui.widgets.hints_panel import HintsPanel

    class _One(App[None]):
        def compose(self) -> ComposeResult:
            yield HintsPanel()

    hints = [Hint("input_wait", "warning", "rank", f"rank {r}", "waits", {}, "fix", 0.2) for r in range(5)]
    eight = _waiting_job({}, 8).ranks
    app = _One()
    async with app.run_test(size=(80, 10)) as pilot:
        panel = app.query_one(HintsPanel)
        panel.show(hints, eight, 0.0)
        await pilot.pause()
        assert panel.get_option_at_index(0).prompt.plain.startswith("▸ WARN 5 ranks (0-4), most at stake:")
        panel.show(hints, eight[1:], 0.0)  # rank 0's process is gone: same hints, other ranks
        await pilot.pause()
        assert panel.get_option_at_index(0).prompt.plain.startswith("▸ WARN 5 ranks (1-4, …), most at stake:")


@pytest.mark.asyncio
async def test_the_cursor_stays_on_its_hint_when_a_group_forms_or_splits() -> None:
    from textual.app import App, ComposeResult

    from flowtop.tui.widgets.hints_panel import HintsPanel

    class _One(App[None]):
        def compose(self) -> ComposeResult:
            yield HintsPanel()

    def waits(ranks: range) -> list[Hint]:
        return [Hint("input_wait", "warning", "rank", f"rank {r}", f"rank {r} waits", {}, "fix", 0.2) for r in ranks]

    hang = Hint("hang_all", "critical", "job", "", "all ranks stopped", {}, "fix", 1.0)
    ranks = _waiting_job({}, 8).ranks
    app = _One()
    async with app.run_test(size=(80, 12)) as pilot:
        panel = app.query_one(HintsPanel)
        panel.show([hang, *waits(range(3))], ranks, 0.0)  # three: apart
        await pilot.pause()
        panel.highlighted = 3  # rank 2's hint
        panel.show([hang, *waits(range(5))], ranks, 0.0)  # five: one group, below the hang
        await pilot.pause()
        assert panel.option_count == 2 and panel.highlighted == 1
        panel.show([hang, *waits(range(2))], ranks, 0.0)  # two again: the cursor on the first of them
        await pilot.pause()
        assert panel.option_count == 3 and panel.highlighted == 1
        assert panel.get_option_at_index(1).prompt.plain.endswith("WARN rank 0 waits (impact 20%)")


@pytest.mark.asyncio
async def test_the_panel_does_not_sort_and_group_again_for_the_same_hints() -> None:
    # Between two evaluations every snapshot carries the same hints tuple: a refresh must not
    # sort and group thousands of hints again on the UI thread (new hints, or other ranks, do).
    from textual.app import App, ComposeResult

    from flowtop.tui.widgets.hints_panel import HintsPanel

    class _One(App[None]):
        def compose(self) -> ComposeResult:
            yield HintsPanel()

    hints = tuple(Hint("input_wait", "warning", "rank", f"rank {r}", "waits", {}, "fix", 0.2) for r in range(5))
    ranks = _waiting_job({}, 8).ranks
    app = _One()
    async with app.run_test(size=(80, 10)) as pilot:
        panel = app.query_one(HintsPanel)
        panel.show(hints, ranks, 0.0)
        await pilot.pause()
        rows = panel._rows
        panel.show(hints, ranks, 0.0)
        assert panel._rows is rows
        panel.show(tuple(hints), ranks[1:], 0.0)  # other ranks: grouped again
        assert panel._rows is not rows and "1-4, …" in panel.get_option_at_index(0).prompt.plain


@pytest.mark.asyncio
async def test_a_new_top_hint_is_shown_from_its_first_line_when_the_list_is_not_read() -> None:
    """A critical hint that came above the highlighted one, with the list unfocused, was shown
    with its first line scrolled out of view for 30 s at 80×24: the highlight had followed the
    old first hint to the second line (a new user's trial). Unfocused, the list stays on its
    first line; focused, the line under the cursor is kept (above)."""
    from textual.app import App, ComposeResult
    from textual.widgets import Input

    from flowtop.tui.widgets.hints_panel import HintsPanel

    class _Two(App[None]):
        def compose(self) -> ComposeResult:
            yield Input()  # takes the focus, as the rank table does
            yield HintsPanel()

    wait = Hint("input_wait", "warning", "rank", "rank 3", "rank 3 waits", {}, "fix", 0.2)
    hang = Hint("hang_all", "critical", "job", "", "all ranks stopped " + "and the others wait " * 8, {}, "fix", 1.0)
    app = _Two()
    async with app.run_test(size=(80, 12)) as pilot:
        panel = app.query_one(HintsPanel)
        panel.show([wait], (), 0.0)
        await pilot.pause()
        panel.show([hang, wait], (), 0.0)
        await pilot.pause()
        assert not panel.has_focus and panel.highlighted == 0 and panel.scroll_y == 0


def test_a_hint_line_names_its_rank_once() -> None:
    """A trial: the hints panel read 'WARN rank 2: rank 2: the optimizer takes 18 % ...' and the
    text report 'most at stake rank 1: rank 1: ...': each renderer added the target before a
    summary that begins with it. Both read flowtop.monitor.hints.groups.hint_line now."""
    from flowtop.tui.widgets.hints_panel import hint_prompt

    said = "the optimizer takes 18 % of the step in unfused kernels"
    opt = [Hint("optimizer_unfused", "warning", "rank", f"rank {r}", f"rank {r}: {said}", {}, "fuse it",
                0.18 if r == 1 else 0.1) for r in range(6)]
    plain = Hint("launch_bound", "warning", "rank", "rank 2", "launches outrun short kernels", {}, "graphs", 0.1)
    assert hint_prompt(opt[2], False, 0.0).plain == f"▸ WARN rank 2: {said} (impact 10%)"
    assert hint_prompt(plain, False, 0.0).plain == "▸ WARN rank 2: launches outrun short kernels (impact 10%)"
    j = _waiting_job({}, 6)
    snap = synthetic_snapshot(120, with_kernels=False)
    for hints, line in (
            (opt, f"  [warning] 6 ranks (0-5), most at stake: rank 1: {said} -> fuse it"),
            (opt[2:3], f"  [warning] rank 2: {said} -> fuse it"),
            ([plain], "  [warning] rank 2: launches outrun short kernels -> graphs")):
        text = render(dataclasses.replace(snap, jobs=(dataclasses.replace(j, hints=tuple(hints)),)))
        assert [x for x in text.splitlines() if x.startswith("  [")] == [line]
    (group,) = grouped(opt, j.ranks)
    assert hint_prompt(group, False, 0.0).plain == f"▸ WARN 6 ranks (0-5), most at stake: rank 1: {said} (impact 18%)"
