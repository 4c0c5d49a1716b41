"""The rank view's order, cheaply (flowtop.monitor.rankview): worst-first node groups without
sorting every rank, and a flat view's rows made only when read.

No Textual. Sorting a job's 4,096 ranks worst first and then grouping them by host compares
ranks of different nodes 45,000 times a refresh, for an order of which the grouped view uses
only each node's own ranks and each node's worst one. :func:`node_order` sorts each node's
ranks and then the nodes by their worst rank: the same groups in the same order, from a sixth of
the comparisons.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, Sequence, TypeVar, overload

from flowtop.monitor.snapshot import RankSnapshot

R = TypeVar("R")
K = TypeVar("K", bound=Hashable)


def node_order(ranks: list[RankSnapshot], key: Callable[[RankSnapshot], tuple],
               reverse: bool = False) -> list[list[RankSnapshot]] | None:
    """Each host's ranks in the order ``sorted(ranks, key=key, reverse=reverse)`` gives them, the
    hosts in the order their first rank comes there (the order of grouping that sort by host).

    Both sorts are stable, as the one over all ranks is, so equal keys keep the ranks' order
    within a node; between nodes whose first ranks' keys are equal (a rank number two nodes'
    processes claim) that order is not known here: None, and the caller sorts every rank."""
    by_host: dict[str, list[RankSnapshot]] = {}
    for r in ranks:
        members = by_host.get(r.host)
        if members is None:
            by_host[r.host] = [r]
        else:
            members.append(r)
    firsts: list[tuple[tuple, list[RankSnapshot]]] = []
    for members in by_host.values():
        members.sort(key=key, reverse=reverse)
        firsts.append((key(members[0]), members))
    firsts.sort(key=lambda first: first[0], reverse=reverse)
    if any(a[0] == b[0] for a, b in zip(firsts, firsts[1:])):
        return None
    return [members for _, members in firsts]


class LazyRows(Sequence[R], Generic[R, K]):
    """Rows of ``ranks`` (in display order), each made by ``make`` when first read: a refresh of
    a flat view of 4,096 ranks reads the few on screen. :meth:`row_index` finds a row by its key
    (``key`` of its rank) without making any."""

    def __init__(self, ranks: list[RankSnapshot], make: Callable[[RankSnapshot], R],
                 key: Callable[[RankSnapshot], K]) -> None:
        self._ranks, self._make, self._key = ranks, make, key
        self._made: dict[int, R] = {}

    def __len__(self) -> int:
        return len(self._ranks)

    @overload
    def __getitem__(self, i: int) -> R: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[R, ...]: ...

    def __getitem__(self, i: int | slice) -> R | tuple[R, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self._ranks))))
        n = len(self._ranks)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(i)
        row = self._made.get(j)
        if row is None:
            row = self._made[j] = self._make(self._ranks[j])
        return row

    @property
    def made(self) -> int:
        """How many rows were made so far (read at least once)."""
        return len(self._made)

    def row_index(self) -> dict[K, int]:
        """Row key -> row index."""
        key = self._key
        return {key(r): i for i, r in enumerate(self._ranks)}
