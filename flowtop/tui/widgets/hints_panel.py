"""HintsPanel: bottleneck hints by severity and impact; Enter expands one. Rank hints that many
ranks share are one line (flowtop.monitor.hints.groups)."""

from __future__ import annotations

from typing import Any, Iterable

from rich.text import Text
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from flowtop.monitor.format import ended_note
from flowtop.monitor.hints import HintGroup, group_key, grouped, hint_line
from flowtop.monitor.rankfilter import hint_filter
from flowtop.monitor.snapshot import Hint, RankSnapshot
from flowtop.tui.widgets._format import (
    SEVERITY_ORDER,
    SEVERITY_STYLE,
    SEVERITY_TAG,
    evidence_text,
    fmt_pct,
)


def hint_key(h: Hint) -> str:
    """Identity of a hint across snapshots (the same problem on the same target)."""
    return f"{h.id}|{h.scope}|{h.target}"


def ordered(hints: Iterable[Hint]) -> list[Hint]:
    """Active before ended, then most severe first, then largest share of step time at stake."""
    return sorted(hints, key=lambda h: (h.ended, SEVERITY_ORDER.get(h.severity, 9), -h.impact, h.target, h.id))


def row_key(row: Hint | HintGroup) -> str:
    """Identity of a panel line across snapshots."""
    return row.key if isinstance(row, HintGroup) else hint_key(row)


def hint_prompt(row: Hint | HintGroup, expanded: bool, now: float) -> Text:
    """One hint (or a group: its ranks, then its leading hint): a summary line, plus its evidence
    and fix when expanded; a hang's growing seconds as of ``now`` (the snapshot's ``taken_at``)."""
    h = row.lead if isinstance(row, HintGroup) else row
    text = Text()
    text.append("▾ " if expanded else "▸ ", style="dim")
    text.append(SEVERITY_TAG.get(h.severity, h.severity[:4].upper()), style=SEVERITY_STYLE.get(h.severity, ""))
    line = hint_line(row, now)  # the text report's words (flowtop.monitor.hints.groups)
    if line.where:
        text.append(f" {line.where}:", style="bold")
        text.append(f" {line.summary}")
    elif h.target and line.summary.startswith(h.target):  # the summary's subject, bold as a target was
        text.append(f" {h.target}", style="bold")
        text.append(line.summary[len(h.target):])
    else:
        text.append(f" {line.summary}")
    if h.impact > 0:
        text.append(f" (impact {fmt_pct(h.impact, 0)})", style="dim")
    if expanded:
        text.append("\n    evidence: ", style="dim")
        text.append(evidence_text(h.evidence_at(now)) or "–")
        text.append("\n    fix: ", style="dim")
        text.append(h.action, style="green")
        text.append("\n    f: show its ranks in the table", style="dim")
    if h.ended:
        # Its rank or job finished: kept as the run's diagnosis, dimmed so it reads as history.
        text.append(f" {ended_note(h.first_step, h.last_step)}", style="italic")
        text.stylize("dim")
    return text


class HintsPanel(OptionList):
    """The job's hints, one per line; Enter toggles evidence and action of one, ``f`` asks the
    screen to filter the rank table to the ranks the highlighted line is about."""

    BORDER_TITLE = "hints"
    BINDINGS = [Binding("f", "show_ranks", "Its ranks")]

    class ShowRanks(Message):
        """Show the ranks of a hint line: ``text`` is the rank filter that selects them, ``what``
        the line in words (for the screen's notice)."""

        def __init__(self, text: str, what: str) -> None:
            self.text = text
            self.what = what
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.expanded: set[str] = set()
        self._hints: list[Hint] = []
        self._rows: list[Hint | HintGroup] = []
        self._shown: tuple[object, ...] | None = None
        self._source: tuple[object, tuple[int, ...]] | None = None  # the hints and rank numbers shown
        self._now = 0.0  # taken_at of the snapshot shown (a hang hint's seconds grow with it)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        # A resize from the wide layout to 80 columns lays the panel out once at width 0 before
        # the narrow layout applies (the 82-column map beside it takes the whole row), and
        # wrapping its lines at width 0 raised in Rich, ending the app (a new user's trial).
        return super().get_content_height(container, viewport, max(width, 1))

    def show(self, hints: Iterable[Hint], ranks: Iterable[RankSnapshot], now: float) -> None:
        """Render ``hints`` (``ranks``: the job's, which name the ranks of a group) as of monitor
        time ``now`` (the snapshot's ``taken_at``); expansion and the highlighted line survive
        updates."""
        ranks = tuple(ranks)
        self._now = now
        # The model hands every snapshot between two evaluations the same hints tuple: sorting
        # and grouping thousands of rank hints again at each 2 Hz refresh is skipped then (a
        # hang's seconds still move on: _show_rows compares the lines' texts).
        source = (hints, tuple(r.rank for r in ranks))
        if self._source is not None and source[0] is self._source[0] and source[1] == self._source[1]:
            self._show_rows()
            return
        self._source = source
        self._hints = ordered(hints)
        self._rows = grouped(self._hints, ranks)
        self._show_rows()

    def _show_rows(self) -> None:
        keys = [row_key(row) for row in self._rows]
        self.expanded &= set(keys)
        # a group's label follows the job's ranks too, not only its hints
        labels = tuple(row.label() for row in self._rows if isinstance(row, HintGroup))
        # a hang's line says its seconds at this snapshot's time (Hint.summary_at)
        leads = (row.lead if isinstance(row, HintGroup) else row for row in self._rows)
        growing = tuple(h.summary_at(self._now) for h in leads if h.clock is not None)
        state = (tuple(self._hints), labels, frozenset(self.expanded), growing)
        if state == self._shown:
            return  # nothing changed: keep the list (and the terminal) quiet
        self._shown = state
        current = self.highlighted_option.id if self.highlighted_option is not None else None
        ended = sum(h.ended for h in self._hints)
        total = len(self._hints)
        count = f"{total - ended:,} + {ended:,} ended" if ended else f"{total:,}"
        self.border_title = f"hints ({count})" if total else "hints"
        if not self._rows:
            self.set_options([Option(Text("no hints: nothing stands out", style="dim"), id="none", disabled=True)])
            return
        self.set_options(Option(hint_prompt(row, k in self.expanded, self._now), id=k)
                         for row, k in zip(self._rows, keys))
        # While the user reads the list (it has focus) keep the same line under the cursor when
        # the order changes, or the line that now holds its hint (a group formed or split); else
        # stay on the first: a critical hint that came above the highlighted one was shown with
        # its first line scrolled out of view for 30 s (a new user's trial at 80×24).
        self.highlighted = self._row_of(current, keys) if self.has_focus else 0

    def _row_of(self, key: str | None, keys: list[str]) -> int:
        if key in keys:
            return keys.index(key)
        for i, row in enumerate(self._rows):
            for h in row.hints if isinstance(row, HintGroup) else (row,):
                if key in (hint_key(h), group_key(h)):
                    return i
        return 0

    def toggle(self, key: str) -> None:
        """Expand or collapse the line with key ``key``."""
        if key in self.expanded:
            self.expanded.discard(key)
        else:
            self.expanded.add(key)
        self._show_rows()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id and event.option.id != "none":
            self.toggle(event.option.id)

    def action_show_ranks(self) -> None:
        """``f``: the ranks of the highlighted line, as a filter for the screen to apply."""
        i = self.highlighted
        if i is None or not 0 <= i < len(self._rows):
            return
        row = self._rows[i]
        hints = row.hints if isinstance(row, HintGroup) else (row,)
        lead = row.lead if isinstance(row, HintGroup) else row
        what = f"{lead.id}: {row.label()}" if isinstance(row, HintGroup) else f"{lead.id} {lead.target}".strip()
        self.post_message(self.ShowRanks(hint_filter(hints), what))
