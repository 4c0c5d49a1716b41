"""A rank's recent step records as compact columns (see flowtop.monitor.compact). No Textual.

The model's hot path: every step frame's records land here in one :meth:`StepRing.extend`, and
the ticks read them back as views that share the ring's blocks.
"""

from __future__ import annotations

import struct
from array import array
from typing import Any, Iterator, NamedTuple

from flowtop.monitor.compact import _MASK, _SHIFT, BLOCK, ArraySeq


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


#: A float as the 8 bytes of a native double (an array('d')'s item).
_pack_d = struct.Struct("d").pack
#: The "known" flags of a record that sent both its input wait and its lead (see StepRing).
_BOTH_SENT = array("b", [3])
#: A full block of them (shared by every ring: a full block is never written again).
_KNOWN_BLOCK = _BOTH_SENT * BLOCK
#: Blocks of zeros of each column's type code, copied (a slice: exactly BLOCK values, no spare)
#: as a ring's new tails: see StepRing.
_ZQ, _ZD, _ZB = array("q", bytes(8 * BLOCK)), array("d", bytes(8 * BLOCK)), array("b", bytes(BLOCK))
#: An empty float array: ``_NO_D[:]`` is a new one without array()'s argument parsing.
_NO_D = array("d")
#: Zeros that complete ``k`` values to a block, by ``k`` (``values + _PAD_D[k]``: a new tail of its
#: final size in one concatenation): int64, float64, the "known" bytes.
_PAD_Q = tuple(_ZQ[k:] for k in range(BLOCK))
_PAD_D = tuple(_ZD[k:] for k in range(BLOCK))
_PAD_B = tuple(_ZB[k:] for k in range(BLOCK))
#: The tails of every ring that holds no value in its tails (none yet, or they just became a
#: block): shared, never written (a write to a ring's tails first makes its own, StepRing._own).
#: A rank that never steps held 3.8 KB of zeros in them (bench/ingest.py --memory, traced).
_NO_LT, _NO_ST = (_ZQ, _ZD), (_ZD, _ZQ, _ZD, _ZD, _ZB)


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
    ring keeps their blocks itself rather than as separate :class:`Column` objects.

    The tails are blocks of their final size from the start (BLOCK values, zeros past the
    ``_nl % BLOCK`` written: views never read past the n they were made with), written in place
    and kept as the full block once filled; a ring whose tails hold nothing shares :data:`_NO_LT`
    and :data:`_NO_ST` until its next write. Tails grown by ``array.extend`` were reallocated
    through Python's size classes (~8 to 512 bytes) as they filled, and 4,096 ranks' tails, each
    left at its own size, pinned pools of those classes that were otherwise empty: pymalloc's
    free blocks 56 MB -> 18 MB, RSS 66.0 -> 55.9 KB a rank (bench/ingest.py --memory 4096 --rss,
    py_free_classes), for 0.4 KB a rank more traced (42.8 -> 43.2: the tails' unwritten zeros)."""

    __slots__ = ("cap", "recent_cap", "_long", "_short", "_lt", "_st", "_nl", "_ns")

    #: Column numbers: step and recv (the last ``cap``), then those of the last ``recent``.
    STEP, RECV, WALL, TOKENS, WAIT, LEAD, KNOWN = range(7)

    def __init__(self, cap: int, recent: int) -> None:
        if not 0 < recent <= cap:
            raise ValueError(f"need 0 < recent <= cap, got {recent!r}, {cap!r}")
        self.cap, self.recent_cap = cap, recent
        self._long: list[tuple[array, ...]] = []  # full (step, recv) blocks (lists: smaller than deques)
        self._short: list[tuple[array, ...]] = []  # full (wall, tokens, wait, lead, known) blocks
        # the tails: (step, recv) and (wall, tokens, wait, lead, known), made at the first write (_own)
        self._lt: tuple[array, ...] = _NO_LT
        self._st: tuple[array, ...] = _NO_ST
        self._nl = self._ns = 0

    def __getstate__(self) -> tuple[object, ...]:
        """Slot values for copy and pickle, the shared empty tails as None: a copy holds new
        arrays where the shared ones were, which the identity test in append/extend would take
        for the ring's own and write into (and into every ring copied with it)."""
        shared = self._lt is _NO_LT
        return (self.cap, self.recent_cap, self._long, self._short, None if shared else self._lt,
                None if shared else self._st, self._nl, self._ns)

    def __setstate__(self, state: tuple[object, ...]) -> None:
        cap, recent, long_, short, lt, st, nl, ns = state
        self.cap, self.recent_cap = cap, recent  # type: ignore[assignment]
        self._long, self._short = long_, short  # type: ignore[assignment]
        self._lt, self._st = (_NO_LT, _NO_ST) if lt is None else (lt, st)  # type: ignore[assignment]
        self._nl, self._ns = nl, ns  # type: ignore[assignment]

    def _own(self) -> tuple[tuple[array, ...], tuple[array, ...]]:
        """The ring's own new tails, in place of the shared empty ones: a block of zeros a
        column, each of its final size (see the class doc)."""
        self._lt, self._st = tails = (_ZQ[:], _ZD[:]), (_ZD[:], _ZQ[:], _ZD[:], _ZD[:], _ZB[:])
        return tails

    def append(self, rec: tuple[int, float, int, float | None, float, float | None]) -> None:
        step, wall, tokens, wait, recv, lead = rec
        lt, st = self._lt, self._st
        h = self._nl & _MASK  # the values the tails hold
        if lt is _NO_LT:
            lt, st = self._own()
        lt[0][h] = step
        lt[1][h] = recv
        st[0][h] = wall
        st[1][h] = tokens
        st[2][h] = wait or 0.0
        st[3][h] = lead or 0.0
        st[4][h] = (wait is not None) | (lead is not None) << 1
        self._nl += 1
        self._ns += 1
        if h == _MASK:  # the tails are full: they are the block (their values are counted)
            self._push([*lt, *st], 0)
            self._lt, self._st = _NO_LT, _NO_ST

    def extend(self, steps: array, wall: array, tokens: array, wait: array | None, lead: array | None,
               recv: float, start: int = 0, finite: bool = False) -> None:
        """Append the records ``start:`` of a frame's columns (step records as columns, see
        probe.wire.steps; NaN in ``wait``/``lead``: not sent), all received at ``recv``, block by
        block: the part-filled tails filled in place and kept as the block (views that share them
        read no further than the n they were made with), whole blocks sliced from the columns,
        the rest copied into new tails of a block's size; only the blocks the caps keep are made
        (:meth:`_blocks`). A 200-record frame (a 10 ms step at a 2 s pace): ~45 k instructions
        here instead of ~76 k (bench/frame_cost.py), the tails only filled by appends."""
        if start:
            steps, wall, tokens = steps[start:], wall[start:], tokens[start:]
            wait = wait[start:] if wait is not None else None
            lead = lead[start:] if lead is not None else None
        n = len(steps)
        # ``finite``: the frame's decode found no NaN (a sum over 200 floats is ~3 µs a column)
        if wait is not None and lead is not None and (finite or (total := sum(wait) + sum(lead)) == total):
            known = _BOTH_SENT * n  # the common case: both columns whole (no NaN), in C
            both = True
        else:
            wait, known_wait = _known(wait, n)
            lead, known_lead = _known(lead, n)
            # bit 0: input wait sent, bit 1: lead sent (see the "known" column), OR-ed in C
            known = array("b", (int.from_bytes(known_wait, "little") | int.from_bytes(known_lead, "little") << 1)
                          .to_bytes(n, "little"))
            both = False
        held = self._nl & _MASK  # the values the tails hold
        hi = held + n
        if hi < BLOCK:  # the common case: the tails alone take them (unrolled: ~1 µs a frame)
            lt, st = self._lt, self._st
            if lt is _NO_LT:  # held is 0: no tails of its own yet
                lt, st = self._own()
            (a, b), (c, d, e, f, g) = lt, st
            a[held:hi] = steps
            # the receive times from bytes, no array() call (it parses its arguments: ~1.7 k
            # instructions of a frame's ~10 k here, callgrind)
            if n == 1:  # a record a frame (steps of 100 ms and more)
                b[held] = recv
            else:
                r = _NO_D[:]
                r.frombytes(_pack_d(recv) * n)
                b[held:hi] = r
            c[held:hi] = wall
            d[held:hi] = tokens
            e[held:hi] = wait
            f[held:hi] = lead
            g[held:hi] = known
            self._nl += n
            self._ns += n
            return
        if held and BLOCK < hi < 2 * BLOCK:  # the next common case: one block completed, the rest new tails
            done = BLOCK - held  # < n: the tails alone did not take them (unrolled, as above: ~2 k instructions)
            recvs = array("d", [recv]) * n
            (a, b), (c, d, e, f, g) = self._lt, self._st
            a[held:] = steps[:done]
            b[held:] = recvs[:done]
            c[held:] = wall[:done]
            d[held:] = tokens[:done]
            e[held:] = wait[:done]
            f[held:] = lead[:done]
            g[held:] = known[:done]
            # the filled tails (their tuples too) are the block: _push unrolled, a call and a
            # tuple fewer (~2 % of a 45-record frame, callgrind)
            self._long.append(self._lt)
            self._short.append(self._st)
            nl, ns = self._nl + done, self._ns + done
            while nl - BLOCK >= self.cap:
                del self._long[0]
                nl -= BLOCK
            while ns - BLOCK >= self.recent_cap:
                del self._short[0]
                ns -= BLOCK
            k = n - done  # new tails: a block each, the values and the rest of a block of zeros
            q, z = _PAD_Q[k], _PAD_D[k]
            self._lt = (steps[done:] + q, recvs[done:] + z)
            self._st = (wall[done:] + z, tokens[done:] + q, wait[done:] + z, lead[done:] + z, known[done:] + _PAD_B[k])
            self._nl, self._ns = nl + k, ns + k
            return
        self._blocks(steps, wall, tokens, wait, lead, known, both, recv, held, n)

    def _blocks(self, steps: array, wall: array, tokens: array, wait: array, lead: array, known: array,
                both: bool, recv: float, held: int, n: int) -> None:
        """:meth:`extend` of ``n`` records that fill a block or more: only the blocks the caps keep
        are made. Pushed one by one, each block beyond a cap's ``K = ceil(cap / BLOCK)`` drops the
        oldest (see _push): the last ``min(len + new, K)`` are kept, so a 200-record frame (a
        10 ms step at the 2 s pace) made 3-4 blocks of each of the 5 columns of the last RECENT
        (128) for 2 to stay, and dropped the rest at once. Full blocks of a frame's receive time,
        and of its "known" flags where both columns came whole, hold equal values: one array
        each, shared (a full block is never written again)."""
        total = held + n
        new, rest = total >> _SHIFT, total & _MASK  # the full blocks made, the values left for new tails
        at = -held  # the frame's index of the stream's value 0 (the old tails' first)
        recvs = array("d", [recv]) * (n if n < BLOCK else BLOCK)  # as many as a block or the tails take
        keep_long = min(new, (self.cap + _MASK) >> _SHIFT)
        keep_short = min(new, (self.recent_cap + _MASK) >> _SHIFT)
        long_from, short_from = new - keep_long, new - keep_short  # the first block each keeps
        for j in range(long_from if long_from < short_from else short_from, new):
            lo = at + (j << _SHIFT)
            hi = lo + BLOCK
            if lo < 0:  # the old tails completed (j == 0): filled with the first values, they are the block
                (a, b), (c, d, e, f, g) = self._lt, self._st
                if j >= long_from:
                    a[held:], b[held:] = steps[:hi], recvs[:hi]
                    self._long.append(self._lt)
                if j >= short_from:
                    c[held:], d[held:], e[held:] = wall[:hi], tokens[:hi], wait[:hi]
                    f[held:], g[held:] = lead[:hi], known[:hi]
                    self._short.append(self._st)
                continue
            if j >= long_from:
                self._long.append((steps[lo:hi], recvs))
            if j >= short_from:
                self._short.append((wall[lo:hi], tokens[lo:hi], wait[lo:hi], lead[lo:hi],
                                    _KNOWN_BLOCK if both else known[lo:hi]))
        self._trim()
        if rest:  # new tails of their own (a frame's columns are the frame's, not the ring's)
            lo = n - rest
            q, z = _PAD_Q[rest], _PAD_D[rest]
            self._lt = (steps[lo:] + q, recvs[:rest] + z)
            self._st = (wall[lo:] + z, tokens[lo:] + q, wait[lo:] + z, lead[lo:] + z, known[lo:] + _PAD_B[rest])
        else:
            self._lt, self._st = _NO_LT, _NO_ST
        self._nl = (len(self._long) << _SHIFT) + rest
        self._ns = (len(self._short) << _SHIFT) + rest

    def _trim(self) -> None:
        """Drop the oldest full blocks past each cap's ``ceil(cap / BLOCK)`` (what _push's drops
        leave after any number of pushes: a push drops while the blocks' values less one block
        reach the cap)."""
        over = len(self._long) - ((self.cap + _MASK) >> _SHIFT)
        if over > 0:
            del self._long[:over]
        over = len(self._short) - ((self.recent_cap + _MASK) >> _SHIFT)
        if over > 0:
            del self._short[:over]

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
        if total & _MASK:  # the tail holds values
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
        at = ArraySeq.within  # the counts are the ring's own: every view within its blocks
        return (at(step, nl - n, n), at(wall, ns - n, n), at(wait, ns - n, n),
                at(lead, ns - n, n), at(step, nl - held, held), at(recv, nl - held, held))

    def values(self, col: int, n: int) -> list[Any]:
        """The last ``n`` values of a column as a list (a transient copy; nothing is kept)."""
        blocks, tail, i, kept, total = self._where(col)
        n = min(n, kept)
        if n <= 0:
            return []
        held = total & _MASK  # the tail's values
        out = list(tail[i][max(0, held - n):held])
        b = len(blocks) - 1
        while len(out) < n and b >= 0:
            out[:0] = blocks[b][i][-(n - len(out)):]
            b -= 1
        return out

    def last(self) -> StepRecord:
        """The newest record (IndexError when empty)."""
        if not self._nl:
            raise IndexError("no steps")
        h = (self._nl & _MASK) - 1  # the newest value's index in the tails, -1: the last block's
        lt = self._lt if h >= 0 else self._long[-1]
        st = self._st if h >= 0 else self._short[-1]
        known = st[4][h]
        return _record((lt[0][h], st[0][h], st[1][h], st[2][h] if known & 1 else None, lt[1][h],
                        st[3][h] if known & 2 else None))

    def last_recv(self) -> float:
        """The newest record's receive time (IndexError when empty): what a status check reads
        of every rank at every tick, without making the whole record."""
        if not self._nl:
            raise IndexError("no steps")
        h = (self._nl & _MASK) - 1  # as in last()
        return (self._lt if h >= 0 else self._long[-1])[1][h]

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
        held = self._nl & _MASK  # the tails' values (the rest of them: zeros not yet written)
        return (sum(len(a) * a.itemsize for blk in (*self._long, *self._short) for a in blk)
                + held * sum(a.itemsize for a in (*self._lt, *self._st)))


