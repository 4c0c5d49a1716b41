"""Compact per-rank series: bounded columns of machine numbers whose frozen views share storage.

A rank keeps hundreds of recent steps and sparkline samples. As a deque of tuples of Python
numbers that costs ~180 bytes a step (a tuple, and a float object per field), and every snapshot
copied it again into tuples for its immutable ``History`` (~100 KB a rank at 512 steps). Here a
:class:`Column` holds values in ``array`` blocks of :data:`BLOCK` (8 bytes a value): values are
only ever appended, never rewritten, so :meth:`Column.view` — an immutable, tuple-like
:class:`ArraySeq` of the last values — shares the blocks, the part-filled last one too (it reads
no further than the length it was made with), and is itself reused until the next append. Memory per column is at most
``(cap + BLOCK) × 8`` bytes however long the rank lives. No Textual.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Sequence
from typing import Any, Iterator

#: Values per block.
BLOCK = 64
_SHIFT, _MASK = BLOCK.bit_length() - 1, BLOCK - 1  # j // BLOCK and j % BLOCK as bit operations
assert 1 << _SHIFT == BLOCK, "BLOCK must be a power of two"


class ArraySeq(Sequence):
    """An immutable sequence over ``array`` blocks (all but the last exactly :data:`BLOCK` long:
    callers keep it so), from index ``start`` of the first block, ``n`` values; behaves like a tuple of numbers (index,
    slice, iterate, compare equal to a tuple or list with the same values, hash)."""

    __slots__ = ("_blocks", "_start", "_n", "_hash")

    def __init__(self, blocks: tuple[array, ...], start: int = 0, n: int | None = None) -> None:
        # Every block but the last holds exactly BLOCK values (Column and StepRing keep it so).
        skip = min(start // BLOCK, len(blocks) - 1)  # blocks wholly before ``start`` are left out
        if skip:
            blocks = blocks[skip:]
            start -= skip * BLOCK
        self._blocks = blocks
        self._start = start
        total = (len(blocks) - 1) * BLOCK + len(blocks[-1]) - start
        self._n = total if n is None else max(0, min(n, total))
        self._hash: int | None = None

    @classmethod
    def within(cls, blocks: tuple[array, ...], start: int, n: int) -> "ArraySeq":
        """``ArraySeq(blocks, start, n)`` for a caller that knows ``start + n`` is within the
        blocks (a ring's own counts, a slice of a view): no clamping, no ``min()`` calls. The
        histories of every rank of a large job are taken at each share of its rules (6 views a
        rank, Model._as_now) and the hints slice them: the constructor's checks were most of it."""
        seq = cls.__new__(cls)
        skip = start >> _SHIFT  # blocks wholly before ``start`` are left out, as __init__ does
        if skip:
            last = len(blocks) - 1
            if skip > last:
                skip = last
            blocks = blocks[skip:]
            start -= skip << _SHIFT
        seq._blocks, seq._start, seq._n, seq._hash = blocks, start, n, None
        return seq

    @classmethod
    def of(cls, typecode: str, values: Any) -> "ArraySeq":
        """A sequence of ``values`` in blocks of its own (BLOCK values each: indexing relies on it)."""
        flat = array(typecode, values)
        blocks = tuple(flat[i:i + BLOCK] for i in range(0, len(flat), BLOCK)) or (flat,)
        return cls(blocks)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if i.__class__ is int:  # the hints index thousands of ranks' series a round: no slice test first
            if i < 0:
                i += self._n
            if 0 <= i < self._n:
                j = self._start + i
                return self._blocks[j >> _SHIFT][j & _MASK]
            raise IndexError("ArraySeq index out of range")
        if isinstance(i, slice):
            lo, hi, stride = i.indices(self._n)
            if stride != 1:
                return tuple(self)[i]
            # lo <= hi <= len: within this view's blocks
            return ArraySeq.within(self._blocks, self._start + lo, hi - lo) if hi > lo else _EMPTY
        return self[operator.index(i)]  # an int subclass (a bool, a NumPy integer)

    def flat(self) -> Sequence[Any]:
        """The view's values as one array of their own (a copy made of a few slices of the
        blocks, in C). Iterating it is one C call a value: islice over a chain of the blocks was
        three, and stepped through the values before ``start`` too (the hints sort, sum and
        align every rank's series at each evaluation: a tenth of a 1,024-rank tick was there)."""
        blocks, start = self._blocks, self._start
        end = start + self._n
        first = blocks[0]
        if end <= len(first):  # within the first block: most slices of recent steps
            return first[start:end]
        last = (end - 1) >> _SHIFT
        out = first[start:]
        for b in blocks[1:last]:
            if b.typecode != out.typecode:  # blocks of mixed kinds (not a ring's): as they are
                return list(itertools.islice(itertools.chain.from_iterable(blocks), start, end))
            out += b
        tail = blocks[last][:end - (last << _SHIFT)]
        if tail.typecode != out.typecode:
            return list(itertools.islice(itertools.chain.from_iterable(blocks), start, end))
        out += tail
        return out

    def __iter__(self) -> Iterator[Any]:
        return iter(self.flat())

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self.flat())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (ArraySeq, tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def __repr__(self) -> str:
        return repr(tuple(self))

    @property
    def nbytes(self) -> int:
        """Bytes of the values this view can reach (shared blocks included)."""
        return sum(b.itemsize * len(b) for b in self._blocks)


_EMPTY = ArraySeq((array("d"),))


class PairSeq(Sequence):
    """An immutable sequence of ``(a[i], b[i])`` pairs over two equally long sequences (each an
    :class:`ArraySeq`, or a tuple or an array nobody writes)."""

    __slots__ = ("a", "b")
    #: Exported as a list of pairs, as the tuple it stands in for (snapshot_json.jsonable).
    JSON_LIST = True

    def __init__(self, a: Sequence[Any], b: Sequence[Any]) -> None:
        self.a, self.b = a, b

    def __len__(self) -> int:
        return len(self.a)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return PairSeq(self.a[i], self.b[i])
        return (self.a[i], self.b[i])

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return zip(self.a, self.b)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PairSeq, tuple, list)):
            return len(self) == len(other) and all(tuple(x) == tuple(y) for x, y in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


def _exact(arrays: tuple[array, ...]) -> tuple[array, ...]:
    """Full blocks copied to their exact size as they are kept: a tail that grew by appends and
    extends holds ~17 % more than its values (array's growth), and a block of 64 floats grown to
    75 is past the 512 bytes Python's allocator serves (one of glibc's, header and all); a slice
    is exactly its values. Views made before keep the tail they read (it is never written again)."""
    return tuple([a[:] for a in arrays])


class Column:
    """The last ``cap`` values appended, in blocks (see the module doc); ``typecode`` is an
    ``array`` type code ('d' floats, 'q' 64-bit integers)."""

    __slots__ = ("typecode", "cap", "_blocks", "_tail", "_n", "_view")

    def __init__(self, typecode: str, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"cap must be positive, got {cap!r}")
        self.typecode = typecode
        self.cap = cap
        self._blocks: list[array] = []  # a few: a list is smaller than a deque
        self._tail = array(typecode)
        self._n = 0  # values in blocks and tail (≥ the cap kept: whole blocks are dropped)
        # The last view (its length is the n it was made for): no (n, view) tuple, one object
        # fewer a column for the garbage collector (flowtop.monitor.gcpolicy) to walk.
        self._view: ArraySeq | None = None

    def append(self, value: Any) -> None:
        tail = self._tail
        tail.append(value)
        self._n += 1
        self._view = None
        if len(tail) == BLOCK:
            self._blocks.append(tail[:])  # exact size (see _exact)
            self._tail = array(self.typecode)
        blocks = self._blocks
        while blocks and self._n - len(blocks[0]) >= self.cap:
            self._n -= len(blocks.pop(0))

    def extend(self, values: Any) -> None:
        """Append ``values`` (an array of this type code, or a list) block by block, in C."""
        if not (isinstance(values, array) and values.typecode == self.typecode):
            values = array(self.typecode, values)
        if not values:
            return
        tail = self._tail
        if len(tail) + len(values) < BLOCK and len(values) <= self.cap:  # the common case: the tail alone
            tail.extend(values)
            self._n += len(values)
            self._view = None
            blocks = self._blocks
            while blocks and self._n - len(blocks[0]) >= self.cap:
                self._n -= len(blocks.pop(0))
            return
        if len(values) > self.cap:  # the older ones would be dropped at once: not written at all
            values = values[len(values) - self.cap:]
        done, n = 0, len(values)
        while done < n:
            take = BLOCK - len(self._tail)  # min() without its call (~0.7 k instructions: it parses keywords)
            if n - done < take:
                take = n - done
            self._tail.extend(values[done:done + take])
            done += take
            self._n += take
            self._view = None
            if len(self._tail) == BLOCK:
                self._blocks.append(self._tail[:])  # exact size (see _exact)
                self._tail = array(self.typecode)
        blocks = self._blocks
        while blocks and self._n - len(blocks[0]) >= self.cap:
            self._n -= len(blocks.pop(0))

    def __len__(self) -> int:
        return min(self._n, self.cap)

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[Any]:
        return iter(self.view())

    def last(self) -> Any:
        """The newest value (IndexError when empty)."""
        if self._tail:
            return self._tail[-1]
        if self._blocks:
            return self._blocks[-1][-1]
        raise IndexError("empty column")

    def view(self, n: int | None = None) -> ArraySeq:
        """The last ``n`` values (all kept when None), oldest first, as an immutable sequence that
        shares the full blocks; the same object until the next append."""
        held = self._n if self._n < self.cap else self.cap  # len(self), without the call (4 series a history)
        n = held if n is None else max(0, min(n, held))
        if self._view is not None and self._view._n == n:
            return self._view
        blocks = tuple(self._blocks) + ((self._tail,) if self._tail else ())  # appended to only: no copy
        total = self._n
        if not blocks:
            blocks = (array(self.typecode),)
        seq = ArraySeq(blocks, total - n, n)
        self._view = seq
        return seq

    def tail(self, n: int) -> list[Any]:
        """The last ``n`` values as a list (a transient copy)."""
        return list(self.view(n)) if n > 0 else []

    @property
    def nbytes(self) -> int:
        """Bytes held by the values (blocks and the part-filled one)."""
        return (sum(len(b) for b in self._blocks) + len(self._tail)) * array(self.typecode).itemsize


class Window:
    """The last ``cap`` values appended, in one array of exactly ``cap`` values written round
    and round, for a rank's figures read whole and never viewed (the medians of its probe's own
    time and of its pipeline stage's): :class:`Column` keeps ``cap`` to ``cap + BLOCK - 1`` values
    in blocks and a tail (each an array and its header) so that views can share them; nobody
    shares these. The array is made at the first value (a rank that never sends one holds none)
    at its final size: one block of Python's allocator (512 bytes for 64 doubles), never grown."""

    __slots__ = ("typecode", "cap", "_a", "_n", "_i")

    def __init__(self, typecode: str, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"cap must be positive, got {cap!r}")
        self.typecode = typecode
        self.cap = cap
        self._a: array | None = None
        self._n = 0  # values held (at most cap)
        self._i = 0  # where the next value goes (the oldest held once full)

    def extend(self, values: Any) -> None:
        """Append ``values`` (an array of this type code, or a list), older ones dropped."""
        if not (isinstance(values, array) and values.typecode == self.typecode):
            values = array(self.typecode, values)
        k, cap = len(values), self.cap
        if not k:
            return
        a = self._a
        if a is None:
            a = self._a = array(self.typecode, bytes(cap * array(self.typecode).itemsize))
        if k >= cap:  # the older ones would be overwritten at once
            a[:] = values[k - cap:]
            self._i, self._n = 0, cap
            return
        i = self._i
        first = cap - i if k > cap - i else k  # up to the array's end, then from its start
        a[i:i + first] = values[:first]
        if first < k:
            a[:k - first] = values[first:]
        self._i = (i + k) % cap
        n = self._n + k
        self._n = n if n < cap else cap

    def append(self, value: Any) -> None:
        self.extend([value])

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[Any]:
        """The values held, oldest first."""
        a = self._a
        if a is None:
            return iter(())
        if self._n < self.cap:
            return iter(a[:self._n])
        i = self._i
        return iter(a[i:] + a[:i] if i else a)
