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
from typing import Any, Iterator, NamedTuple

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
            return ArraySeq(self._blocks, self._start + lo, max(0, hi - lo)) if hi > lo else _EMPTY
        return self[operator.index(i)]  # an int subclass (a bool, a NumPy integer)

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(itertools.chain.from_iterable(self._blocks), self._start, self._start + self._n)

    def __reversed__(self) -> Iterator[Any]:
        return reversed(tuple(self))

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
    """An immutable sequence of ``(a[i], b[i])`` pairs over two equally long :class:`ArraySeq`."""

    __slots__ = ("a", "b")

    def __init__(self, a: ArraySeq, b: ArraySeq) -> None:
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
        self._view: tuple[int, ArraySeq] | None = None

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
            take = min(n - done, BLOCK - len(self._tail))
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
        held = len(self)
        n = held if n is None else max(0, min(n, held))
        if self._view is not None and self._view[0] == n:
            return self._view[1]
        blocks = tuple(self._blocks) + ((self._tail,) if self._tail else ())  # appended to only: no copy
        total = self._n
        if not blocks:
            blocks = (array(self.typecode),)
        seq = ArraySeq(blocks, total - n, n)
        self._view = (n, seq)
        return seq

    def tail(self, n: int) -> list[Any]:
        """The last ``n`` values as a list (a transient copy)."""
        return list(self.view(n)) if n > 0 else []

    @property
    def nbytes(self) -> int:
        """Bytes held by the values (blocks and the part-filled one)."""
        return (sum(len(b) for b in self._blocks) + len(self._tail)) * array(self.typecode).itemsize


class StepRecord(NamedTuple):
    """One step record of a rank as :class:`StepRing` hands it out (a NamedTuple: read by name,
    and still equal to the plain tuple of its fields)."""

    step: int
    wall_s: float
    tokens: int
    input_wait_s: float | None  # None: the probe sent none
    recv: float  # monitor time the record's frame arrived
    lead_s: float | None  # step boundary -> end of its last forward; None: not sent


# tuple.__new__ without the NamedTuple's argument parsing: StepRing builds one per status check.
_record = StepRecord._make


#: The "known" flags of a record that sent both its input wait and its lead (see StepRing).
_BOTH_SENT = array("b", [3])


def _known(col: array | None, n: int) -> tuple[array, bytes]:
    """An optional column as the ring stores it (0.0 where not sent) and one byte per record,
    1 where it was sent (NaN on the wire: not sent). Whole columns sent or not in C."""
    if col is None:
        return array("d", bytes(8 * n)), bytes(n)
    total = sum(col)
    if total == total:  # no NaN: every record sent it
        return col, b"\x01" * n
    values, sent = array("d", col), bytearray(n)
    for i, x in enumerate(col):
        if x == x:
            sent[i] = 1
        else:
            values[i] = 0.0
    return values, bytes(sent)


class StepRing:
    """A rank's recent steps, :class:`StepRecord` ``(step, wall_s, tokens, input_wait_s, recv, lead_s)``,
    in columns (~40 bytes a step instead of ~180 as tuples of Python numbers): step numbers and
    receive times of the last ``cap`` steps (aligning ranks by step), the other fields of the
    last ``recent``. ``len`` counts the former; indexing, iteration and :meth:`recent` give whole
    records of the latter (None where the probe sent no input wait or lead: stored as 0.0, the
    history's convention, with a flag byte saying which were sent).

    The columns are appended together in one call (the model's hot path: a step record), so the
    ring keeps their blocks itself rather than as separate :class:`Column` objects."""

    __slots__ = ("cap", "recent_cap", "_long", "_short", "_lt", "_st", "_nl", "_ns")

    #: Column numbers: step and recv (the last ``cap``), then those of the last ``recent``.
    STEP, RECV, WALL, TOKENS, WAIT, LEAD, KNOWN = range(7)

    def __init__(self, cap: int, recent: int) -> None:
        if not 0 < recent <= cap:
            raise ValueError(f"need 0 < recent <= cap, got {recent!r}, {cap!r}")
        self.cap, self.recent_cap = cap, recent
        self._long: list[tuple[array, ...]] = []  # full (step, recv) blocks (lists: smaller than deques)
        self._short: list[tuple[array, ...]] = []  # full (wall, tokens, wait, lead, known) blocks
        self._lt, self._st = self._tails()
        self._nl = self._ns = 0

    @staticmethod
    def _tails() -> tuple[tuple[array, ...], tuple[array, ...]]:
        return (array("q"), array("d")), (array("d"), array("q"), array("d"), array("d"), array("b"))

    def append(self, rec: tuple[int, float, int, float | None, float, float | None]) -> None:
        step, wall, tokens, wait, recv, lead = rec
        lt, st = self._lt, self._st
        lt[0].append(step)
        lt[1].append(recv)
        st[0].append(wall)
        st[1].append(tokens)
        st[2].append(wait or 0.0)
        st[3].append(lead or 0.0)
        st[4].append((wait is not None) | (lead is not None) << 1)
        self._nl += 1
        self._ns += 1
        self._appended()

    def extend(self, steps: array, wall: array, tokens: array, wait: array | None, lead: array | None,
               recv: float, start: int = 0, finite: bool = False) -> None:
        """Append the records ``start:`` of a frame's columns (step records as columns, see
        probe.wire.steps; NaN in ``wait``/``lead``: not sent), all received at ``recv``, block by
        block: the part-filled tails completed into a new block of their exact size (the tails
        themselves, which views share, are never written again), whole blocks sliced from the
        columns, the rest sliced into new tails. A 200-record frame (a 10 ms step at a 2 s pace)
        makes ~35 arrays instead of ~56: every block a copy, the tails only filled by appends
        (bench/ingest.py: this was 12 % of the data thread's samples at 4,096 ranks)."""
        if start:
            steps, wall, tokens = steps[start:], wall[start:], tokens[start:]
            wait = wait[start:] if wait is not None else None
            lead = lead[start:] if lead is not None else None
        n = len(steps)
        # ``finite``: the frame's decode found no NaN (a sum over 200 floats is ~3 µs a column)
        if wait is not None and lead is not None and (finite or (total := sum(wait) + sum(lead)) == total):
            known = _BOTH_SENT * n  # the common case: both columns whole (no NaN), in C
        else:
            wait, known_wait = _known(wait, n)
            lead, known_lead = _known(lead, n)
            # bit 0: input wait sent, bit 1: lead sent (see the "known" column), OR-ed in C
            known = array("b", (int.from_bytes(known_wait, "little") | int.from_bytes(known_lead, "little") << 1)
                          .to_bytes(n, "little"))
        recvs = array("d", [recv]) * n
        held = len(self._lt[0])
        if held and held + n < BLOCK:  # the common case: the tails alone grow (unrolled: ~1 µs a frame)
            (a, b), (c, d, e, f, g) = self._lt, self._st
            a.extend(steps)
            b.extend(recvs)
            c.extend(wall)
            d.extend(tokens)
            e.extend(wait)
            f.extend(lead)
            g.extend(known)
            self._nl += n
            self._ns += n
            return
        # typed: array[int] and array[float] join to object (array is invariant in its item)
        cols: tuple[array, ...] = (steps, recvs, wall, tokens, wait, lead, known)
        done = 0
        if held:  # completed: tail and values into a new block of its exact size
            done = min(n, BLOCK - held)
            tails = (*self._lt, *self._st)
            self._push([t + (c[:done] if done < n else c) for t, c in zip(tails, cols)], done)
        while n - done >= BLOCK:
            self._push([c[done:done + BLOCK] for c in cols], BLOCK)
            done += BLOCK
        if done < n:  # new tails of their own (a frame's columns are the frame's, not the ring's)
            rest = [c[done:] for c in cols]
            self._lt, self._st = (rest[0], rest[1]), tuple(rest[2:])
            self._nl += n - done
            self._ns += n - done
        else:
            self._lt, self._st = self._tails()

    def _push(self, block: list[array], new: int) -> None:
        """Keep a full block (exactly BLOCK values a column), ``new`` of whose values were not
        counted yet (the rest were the tails'), and drop the blocks that the caps no longer need.
        The tails are the caller's to reset."""
        self._long.append((block[0], block[1]))
        self._short.append(tuple(block[2:]))
        self._nl += new
        self._ns += new
        while self._nl - BLOCK >= self.cap:
            del self._long[0]
            self._nl -= BLOCK
        while self._ns - BLOCK >= self.recent_cap:
            del self._short[0]
            self._ns -= BLOCK

    def _appended(self) -> None:
        """After a record was appended to the tails: roll a full block (a copy of its exact size:
        see _exact)."""
        if len(self._lt[0]) == BLOCK:  # both tails fill together
            self._push([*_exact(self._lt), *_exact(self._st)], 0)  # their values are counted
            self._lt, self._st = self._tails()

    def __len__(self) -> int:
        return min(self._nl, self.cap)

    def __bool__(self) -> bool:
        return self._nl > 0

    @property
    def recent_len(self) -> int:
        """Records held with every field (at most ``recent``)."""
        return min(self._ns, self.recent_cap)

    def _where(self, col: int) -> tuple[list[tuple[array, ...]], tuple[array, ...], int, int, int]:
        """(blocks, tail, index in them, values held, values in blocks and tail) of a column."""
        if col < 2:
            return self._long, self._lt, col, min(self._nl, self.cap), self._nl
        return self._short, self._st, col - 2, min(self._ns, self.recent_cap), self._ns

    def column(self, col: int, n: int | None = None) -> ArraySeq:
        """The last ``n`` values of a column (all it keeps when None), as an immutable view that
        shares the full blocks. The wait and lead columns read 0.0 where the probe sent none.

        A new view each call, not one kept until the next append: the hints of a large job read
        every rank's whole history at each evaluation (Model._as_now), and views kept in 4,096
        rings left ~80 k objects alive for the garbage collector to walk until each rank's next
        frame (bench/ingest.py: young collections of 100-200 k objects, 30-130 ms each)."""
        blocks, tail, i, held, total = self._where(col)
        n = held if n is None else max(0, min(n, held))
        parts = tuple([b[i] for b in blocks])
        if tail[i]:
            # The live tail itself, not a copy: values are only ever appended, and the view
            # reads no further than the n it was made with (see ArraySeq).
            parts += (tail[i],)
        return ArraySeq(parts or (array("d"),), total - n, n)

    def history_columns(self, n: int) -> tuple[ArraySeq, ...]:
        """The views a rank's whole history reads, as :meth:`column` makes them: step, wall, wait
        and lead of the last ``n`` records (``n`` at most :attr:`recent_len`), then step and recv
        of every record kept. Two passes over the blocks (one per block list, the tails with
        them) instead of six: the hints take every rank's history at each share of a large
        job's rules (Model._as_now, 4,096 ranks at a time). An empty tail is the views' last
        block then, which they never read (values are only appended, a view reads no further
        than its length)."""
        step, recv = zip(*self._long, self._lt)
        wall, _, wait, lead, _ = zip(*self._short, self._st)
        nl, ns = self._nl, self._ns
        held = min(nl, self.cap)
        n = max(0, min(n, ns, self.recent_cap))
        return (ArraySeq(step, nl - n, n), ArraySeq(wall, ns - n, n), ArraySeq(wait, ns - n, n),
                ArraySeq(lead, ns - n, n), ArraySeq(step, nl - held, held), ArraySeq(recv, nl - held, held))

    def values(self, col: int, n: int) -> list[Any]:
        """The last ``n`` values of a column as a list (a transient copy; nothing is kept)."""
        blocks, tail, i, held, _ = self._where(col)
        n = min(n, held)
        if n <= 0:
            return []
        out = list(tail[i][-n:])
        b = len(blocks) - 1
        while len(out) < n and b >= 0:
            out[:0] = blocks[b][i][-(n - len(out)):]
            b -= 1
        return out

    def last(self) -> StepRecord:
        """The newest record (IndexError when empty)."""
        if not self._nl:
            raise IndexError("no steps")
        lt = self._lt if self._lt[0] else self._long[-1]
        st = self._st if self._st[0] else self._short[-1]
        known = st[4][-1]
        return _record((lt[0][-1], st[0][-1], st[1][-1], st[2][-1] if known & 1 else None, lt[1][-1],
                        st[3][-1] if known & 2 else None))

    def last_recv(self) -> float:
        """The newest record's receive time (IndexError when empty): what a status check reads
        of every rank at every tick, without making the whole record."""
        if not self._nl:
            raise IndexError("no steps")
        return (self._lt if self._lt[0] else self._long[-1])[1][-1]

    def recent(self, n: int) -> list[StepRecord]:
        """The last ``n`` (at most ``recent``) records, oldest first."""
        n = min(n, self._ns, self.recent_cap)
        if n <= 0:
            return []
        c = self.values
        return [_record((s, w, t, a if k & 1 else None, r, b if k & 2 else None))
                for s, w, t, a, r, b, k in zip(c(0, n), c(2, n), c(3, n), c(4, n), c(1, n), c(5, n), c(6, n))]

    def __getitem__(self, i: int) -> StepRecord:
        if i == -1:
            return self.last()
        return self.recent(self.recent_cap)[i]

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self.recent(self.recent_cap))

    @property
    def nbytes(self) -> int:
        """Bytes of the columns' values."""
        return sum(len(a) * a.itemsize for blk in (*self._long, *self._short, self._lt, self._st) for a in blk)


