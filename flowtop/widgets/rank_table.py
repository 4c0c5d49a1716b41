"""RankTable: one row per rank process of a job, updated in place."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from flowtop.snapshot import JobSnapshot, RankSnapshot
from flowtop.widgets import _telemetry as tm
from flowtop.widgets._format import (
    NA,
    activity_style,
    fmt_int,
    fmt_pct,
    fmt_si,
    fmt_time,
    mfu_style,
    status_text,
    styled,
)

# (key, label, width). Widths sum to 59; with one cell of padding either side the
# table is 79 columns wide: an 80-column SSH terminal keeps one for the scrollbar.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("rank", "rank", 4),
    ("host", "host", 11),
    ("step", "step", 6),
    ("step_time", "step t", 7),
    ("tokens", "tok/s", 6),
    ("flops", "FLOP/s", 6),
    ("mfu", "MFU", 6),
    ("gpu", "GPU%", 4),
    ("tensor", "TC%", 4),
    ("status", "state", 5),
)


def row_key(r: RankSnapshot) -> str:
    """Stable key of one rank process (a restart gets a new row)."""
    return f"{r.rank}:{r.host}:{r.pid}:{r.incarnation}"


def rank_cells(r: RankSnapshot) -> list[Text]:
    """The row of one rank, in :data:`COLUMNS` order."""
    f = r.flops
    mfu = f.mfu if f else None
    stale = r.status != "live"
    dim = "dim" if r.status == "done" else ""
    tensor = tm.fraction(r.telemetry, tm.TENSOR)
    gpu = tm.fraction(r.telemetry, tm.GPU_UTIL)
    rank = str(r.rank) if r.incarnation == 0 else f"{r.rank}.{r.incarnation}"
    step_style = "yellow" if r.status == "stale" else dim
    # Another process claims this rank too (see the rank_conflict hint): mark both rows.
    rank_cell = styled(rank + "!", "bold red") if r.conflict else styled(rank, "bold" if not stale else dim)
    return [
        rank_cell,
        # The first label of a host name tells nodes apart; the domain rarely does.
        Text(_short_host(r.host), style=dim, no_wrap=True, overflow="ellipsis"),
        styled(fmt_int(r.step), step_style),
        styled(fmt_time(r.step_time_s), dim),
        styled(fmt_si(r.tokens_per_s), dim),
        styled(fmt_si(f.flops_per_s if f else None), dim),
        styled(fmt_pct(mfu), dim or mfu_style(mfu)),
        styled(NA if gpu is None else f"{gpu * 100:.0f}", dim),
        styled(NA if tensor is None else f"{tensor * 100:.0f}", dim or activity_style(tensor)),
        status_text(r.status),
    ]


class RankTable(DataTable):
    """Live per-rank table; rows keep their place and the cursor survives updates."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._order: list[str] = []
        self._ranks: dict[str, RankSnapshot] = {}

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            justify = "left" if key in ("host", "status") else "right"
            self.add_column(Text(label, justify=justify), key=key, width=width)

    @property
    def selected(self) -> RankSnapshot | None:
        """The rank under the cursor (None on an empty table)."""
        if not self._order or self.cursor_row < 0 or self.cursor_row >= len(self._order):
            return None
        return self._ranks.get(self._order[self.cursor_row])

    def rank_for_key(self, key: str) -> RankSnapshot | None:
        """The rank shown in row ``key``."""
        return self._ranks.get(key)

    def show(self, job: JobSnapshot | None) -> None:
        """Render the ranks of ``job`` sorted by rank, then incarnation."""
        ranks = sorted(job.ranks, key=lambda r: (r.rank, r.incarnation, r.pid)) if job else []
        order = [row_key(r) for r in ranks]
        self._ranks = dict(zip(order, ranks))
        if order == self._order:
            # Same rows: update cells so the cursor and scroll position stay put.
            for key, r in zip(order, ranks):
                for (col, _, _), cell in zip(COLUMNS, rank_cells(r)):
                    self.update_cell(key, col, cell)
            return
        selected = self._order[self.cursor_row] if 0 <= self.cursor_row < len(self._order) else None
        self.clear()
        for key, r in zip(order, ranks):
            self.add_row(*rank_cells(r), key=key)
        self._order = order
        if selected in order:
            self.move_cursor(row=order.index(selected), animate=False, scroll=True)


def _short_host(host: str) -> str:
    """The first label of a host name (nodes differ there); IP addresses stay whole."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return host.split(".")[0]
