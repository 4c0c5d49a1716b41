"""A kernel window's rows: :class:`KernelStat`, and :class:`KernelTable`, the columns a window
holds them in (split from :mod:`flowtop.monitor.kernels.aggregate`, which builds them and re-exports
both). No Textual.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Callable, Generic, TypeVar, overload

from flowtop.monitor.sanitize import interned


def _setstate_interned(self: Any, state: tuple[Any, ...]) -> None:
    """Unpickling (a window built in the monitor's builder process, flowtop.monitor.kernel_worker):
    its names interned again, as the builder interned them (kernel names of any length), so that
    thousands of ranks' tables share one string per kernel name instead of a copy each (~34 KB a
    rank for a GPT's windows)."""
    for f, value in zip(fields(self), state):
        object.__setattr__(self, f.name, interned(value, longest=None))


@dataclass(frozen=True, slots=True)  # a window holds them as columns (KernelTable), made as read
class KernelStat:
    """One kernel name (or CPU operator) in a window."""

    __setstate__ = _setstate_interned

    name: str
    short: str
    category: str
    calls: int
    total_us: float
    share: float
    flops: float | None
    tflops: float | None
    op: str  # the launching operator with the most time ("" when unknown)

    #: Derived fields the snapshot JSON carries too (flowtop.monitor.snapshot).
    JSON_DERIVED = ("mean_us",)

    @property
    def mean_us(self) -> float:
        """Mean device time per call: derived, not stored."""
        return self.total_us / self.calls if self.calls else 0.0

    @property
    def low(self) -> str:
        """The full name lower-cased, for the hints' pattern tests (as KernelRow.low: the hints scan
        a window's own stats, flowtop.monitor.hints.facts)."""
        return self.name.lower()


R = TypeVar("R")


class ColumnRecords(Sequence[R]):
    """The sequence protocol of a table held as columns (the garbage collector walks one object
    where a tuple of records made dozens, flowtop.monitor.gcpolicy): an immutable sequence of the
    records, made as they are read. A subclass says the record's class (:meth:`_make`) and its
    columns in the record's field order (:meth:`_cols`; by default its slots, in order)."""

    __slots__ = ()
    #: The snapshot JSON writes it as the list of its rows (flowtop.monitor.snapshot_json.jsonable).
    JSON_LIST = True
    #: Per slot (in the record's field order): the array typecode its column is held in, or ""
    #: for a tuple (text, or numbers that may be None).
    TYPECODES: tuple[str, ...] = ()

    def _fill(self, rows: Iterable[R]) -> None:
        """Set each slot to its column of ``rows`` (the record's fields in order, as TYPECODES says)."""
        rows = tuple(rows)
        slots: tuple[str, ...] = type(self).__slots__
        fields_ = fields(self._make())  # type: ignore[arg-type]
        self._set({slot: [getattr(r, f.name) for r in rows] for slot, f in zip(slots, fields_)})

    def _set(self, columns: Mapping[str, Iterable[object]]) -> None:
        """Set each slot to its column in ``columns`` (by slot name, every slot), held as TYPECODES
        says: an array of its typecode, else a tuple. The one place a table's columns are made."""
        slots: tuple[str, ...] = type(self).__slots__
        if set(columns) != set(slots):
            raise ValueError(f"{type(self).__name__} columns {sorted(columns)} are not its slots {sorted(slots)}")
        for slot, code in zip(slots, self.TYPECODES, strict=True):
            values = columns[slot]
            setattr(self, slot, array(code, values) if code else tuple(values))

    def _make(self) -> Callable[..., R]:
        raise NotImplementedError

    def _cols(self) -> tuple[Sequence[Any], ...]:
        slots: tuple[str, ...] = type(self).__slots__
        return tuple(getattr(self, name) for name in slots)

    def __len__(self) -> int:
        cols = self._cols()
        return len(cols[0]) if cols else 0

    @overload
    def __getitem__(self, i: int) -> R: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[R, ...]: ...

    def __getitem__(self, i: int | slice) -> R | tuple[R, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        return self._make()(*[c[i] for c in self._cols()])

    def __iter__(self) -> Iterator[R]:
        return map(self._make(), *self._cols())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (ColumnRecords, tuple, list)):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({tuple(self)!r})"


class KernelTable(ColumnRecords[KernelStat]):
    """A window's kernels, largest time first, as columns: an immutable sequence of
    :class:`KernelStat` made as they are read (the hints scan a window once, flowtop.monitor.hints).

    Every rank holds its latest window: as a tuple of ~40 KernelStat it was ~40 objects a rank for
    the garbage collector to walk at each full collection (flowtop.monitor.gcpolicy); as columns it
    is the table, six tuples (strings and numbers or None: untracked once a collection has seen
    them) and three arrays, whose floats are no objects of their own either."""

    __slots__ = ("names", "shorts", "categories", "calls", "total_us", "share", "flops", "tflops", "ops")

    TYPECODES = ("", "", "", "q", "d", "d", "", "", "")  # flops, tflops: None where no call carried FLOPs
    names: tuple[str, ...]
    shorts: tuple[str, ...]
    categories: tuple[str, ...]
    calls: array[int]
    total_us: array[float]
    share: array[float]
    flops: tuple[float | None, ...]
    tflops: tuple[float | None, ...]
    ops: tuple[str, ...]

    def __init__(self, rows: Iterable[KernelStat] = ()) -> None:
        self._fill(rows)

    def __reduce__(self) -> tuple[Any, ...]:
        # Unpickled (from the builder process) with its names interned again, as KernelStat was.
        return (_table_of, (self.names, self.shorts, self.categories, self.calls, self.total_us, self.share,
                            self.flops, self.tflops, self.ops))

    def _make(self) -> type[KernelStat]:
        return KernelStat


_NAMED = frozenset(("names", "shorts", "categories", "ops"))


def _table_of(*columns: Any) -> KernelTable:
    """A pickled :class:`KernelTable` again, its strings interned (see _setstate_interned)."""
    table = KernelTable.__new__(KernelTable)
    for name, value in zip(KernelTable.__slots__, columns):
        setattr(table, name, interned(value, longest=None) if name in _NAMED else value)
    return table


class Rows(ColumnRecords[R], Generic[R]):
    """A window's small record lists (its categories, its idle gaps) as columns, a tuple a field:
    an immutable sequence of the records made as they are read.

    Every rank holds its latest window; as tuples of records they were a dozen objects a rank for
    the garbage collector to walk; the columns hold only strings, numbers, None and tuples of them,
    which a collection untracks once it has seen them, so what stays is this one object."""

    __slots__ = ("_cls", "_columns")

    def __init__(self, cls: type[R], rows: Iterable[R] = ()) -> None:
        rows = tuple(rows)
        self._cls = cls
        self._columns = tuple(tuple([getattr(r, f.name) for r in rows]) for f in fields(cls))  # type: ignore[arg-type]

    def __reduce__(self) -> tuple[Any, ...]:
        # Unpickled (from the builder process) with its strings interned again, as the records were.
        return (_rows_of, (self._cls, self._columns))

    def _make(self) -> type[R]:
        return self._cls

    def _cols(self) -> tuple[Sequence[Any], ...]:
        return self._columns


def _rows_of(cls: type[R], columns: tuple[tuple[Any, ...], ...]) -> Rows[R]:
    """Pickled :class:`Rows` again, their strings interned (see _setstate_interned)."""
    rows: Rows[R] = Rows.__new__(Rows)
    rows._cls = cls
    rows._columns = interned(columns, longest=None)
    return rows
