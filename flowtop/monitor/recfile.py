"""Recording files: their format, the writer (:class:`Recorder`) and the reader (:func:`read_recording`).

Format version 2: the line ``FLOWTOP-REC 2\\n``, then records of an 8-byte head, the body's
length and its CRC-32 (``zlib.crc32``), both big-endian, followed by the body, a msgpack array:

* ``[t, frame]``: ``t`` seconds since the recording started (monitor clock, whose ticks fall on
  multiples of the cadence from there: flowtop.monitor.ticker), ``frame`` the wire frame exactly as
  received (or a record of the monitor's own: flowtop.monitor.thinning);
* ``[t, "end", {...}]``: the end marker, last, written by :meth:`Recorder.close`: ``frames`` and
  ``records`` written before it, ``seconds`` recorded, ``why`` the recording stopped early (""
  on a clean stop) and ``closed``, the Unix time it was closed. A file without one was never
  closed: the monitor was killed or its machine went down, and the run may have gone on;
* ``[t, TAG, ...]`` with another tag: a later flowtop's record, skipped.

The checksum is per record: its CPU cost per frame is small beside the rest of a write
(bench/recorder_write.py), and a damaged record is found exactly, where a checksum per run of
records would hold back a run to check it and could only name the run.

Version 1 (flowtops before it): a 4-byte length per record, no checksum, no end marker; read as
it always was, with a note that whether it ended cleanly is not known. No Textual here.
"""

from __future__ import annotations

import errno
import gzip
import io
import math
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import msgpack

from flowtop.monitor.rec_aside import keep_aside
from flowtop.monitor.thinning import spread_of
from probe import wire

MAGIC = b"FLOWTOP-REC 2\n"
MAGIC_V1 = b"FLOWTOP-REC 1\n"
_PREFIX = b"FLOWTOP-REC "
#: Header bytes a file must hold before its cut can be claimed: "FLOWTOP", the name. Fewer say
#: nothing (a 1-byte file "F" read as a recording cut in its header, exit 1); such a file is
#: "not a flowtop recording", exit 2, as an empty one is.
NAMED_AT = len(b"FLOWTOP")
_HEAD = struct.Struct(">II")  # version 2: body length, CRC-32 of the body
_LEN_V1 = struct.Struct(">I")
_GZIP_MAGIC = b"\x1f\x8b"
#: A record is a wire frame plus a few bytes.
MAX_RECORD = wire.MAX_FRAME_BYTES + 64
#: Bytes the recorder gathers before writing them: what a hard kill can lose (as Python's own
#: buffered file held before, which could not tell how much of a failed write reached the disk).
FLUSH_BYTES = io.DEFAULT_BUFFER_SIZE
#: Longest a gathered record waits to be written (Recorder.flush_due).
FLUSH_S = 1.0
END = "end"

Say = Callable[[str], None]
#: What the reader makes of a later flowtop's record: nothing to yield.
_SKIP: tuple[float, bytes] = (0.0, b"")


class RecordingError(ValueError):
    """A file that is not a readable flowtop recording."""


@dataclass(frozen=True)
class EndMarker:
    """What a recording's end marker says (see the module doc)."""

    frames: int
    records: int
    seconds: float
    why: str


class Recorder:
    """Appends received frames to a recording file (format version 2), on the monitor's data thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # Opened to say at once whether it can be written, but not truncated before the monitor
        # has bound its address (:meth:`start`) or records something: a second `flowtop serve
        # --record run.rec` that found the port taken (exit 2) emptied the running monitor's
        # recording and left its own header and end marker at the start of it.
        self._created = not os.path.lexists(self.path)
        try:
            self._fh: io.FileIO | None = open(self.path, "ab", buffering=0)
        except OSError as exc:
            raise RecordingError(f"cannot write recording {self.path}: {exc.strerror}") from None
        self._claimed = False  # truncated to be this recording's (at start or the first write)
        self._buf = bytearray(MAGIC)
        self._t0: float | None = None
        self._last = 0.0  # recorded time of the last record
        #: Frames received and written (the file's, after a failed write), and records of any kind.
        self.frames = self.records = 0
        self._size = 0  # bytes in the file, whole records only
        self._oldest: float | None = None  # monitor time of the oldest record not yet written
        self._kept = (0, 0)  # records and frames in the file
        self._whole = True  # False: a failed write left part of a record that could not be cut off
        #: Why the recording ended short ("" while it is whole); set by :meth:`close`.
        self.error = ""
        #: Where the file that was at :attr:`path` before this recording was kept (None: none was).
        self.kept_aside: Path | None = None

    def start(self, t0: float) -> None:
        """Count recorded times from monitor time ``t0`` (the collector's tick origin; else the
        first frame's time), so that a replay's ticks fall where the live ones did."""
        self._t0 = t0
        if self._fh is not None:
            try:
                self._claim(self._fh)
            except OSError as exc:  # the earlier file stays whole; nothing is recorded
                self._refuse(f"recording {self.path} not started: the file there could not be kept aside "
                             f"({exc.strerror or exc}); give --record another name")

    @property
    def running(self) -> bool:
        """Whether it records (or will once its monitor has bound its address): not closed. A
        monitor that could not bind closes it unstarted, nothing recorded."""
        return self._fh is not None

    def _claim(self, fh: io.FileIO) -> io.FileIO:
        """Make the file this recording's, once: a file already there is kept aside (never
        emptied: flowtop.monitor.rec_aside) and a new one opened in its place, which is returned.
        Raises OSError where the earlier file can be neither kept nor replaced."""
        if self._claimed:
            return fh
        self._claimed = True
        aside = keep_aside(self.path)
        if aside is None:
            try:
                fh.truncate(0)  # empty (or a file made since): nothing to keep
            except OSError:  # not a regular file (/dev/full)
                pass
            return fh
        self.kept_aside = aside
        new = open(self.path, "ab", buffering=0)
        fh.close()
        if self._fh is fh:
            self._fh = new
        return new

    def write(self, now: float, frame: bytes, received: bool = True) -> None:
        """Record one frame received at monitor time ``now`` (``received`` False: a record of the
        monitor's own, flowtop.monitor.thinning, not counted in :attr:`frames`). Raises OSError
        when the file cannot take it; the file then ends at its last whole record."""
        if self._fh is None:
            return
        if self._t0 is None:
            self._t0 = now
        self._last = now - self._t0
        if self._oldest is None:
            self._oldest = now
        self._add(msgpack.packb([self._last, bytes(frame)], use_bin_type=True))
        self.frames += received
        if len(self._buf) >= FLUSH_BYTES:
            self._flush(self._fh)

    def flush_due(self, now: float) -> None:
        """Write what is gathered when the oldest of it is FLUSH_S old at monitor time ``now``
        (the collector asks at every turn of its loop): a monitor killed by SIGKILL loses at most
        that much, not a quiet job's last minutes. Raises OSError as :meth:`write` does."""
        if self._fh is not None and self._oldest is not None and now - self._oldest >= FLUSH_S:
            self._flush(self._fh)

    def _add(self, body: bytes) -> None:
        self._buf += _HEAD.pack(len(body), zlib.crc32(body))
        self._buf += body
        self.records += 1

    def _refuse(self, why: str) -> None:
        """Record nothing, and say ``why`` where a failed recording is said (:attr:`error`)."""
        fh, self._fh = self._fh, None
        self.error = why
        if fh is not None:
            fh.close()

    def _flush(self, fh: io.FileIO) -> None:
        """Write the gathered records; on failure cut the file back to its last whole record and
        forget the records that were not written (counts included): the file holds what it says."""
        fh = self._claim(fh)
        data, self._buf = self._buf, bytearray()  # written from where it is: a kernel window is not copied
        self._oldest = None
        done = 0
        try:
            with memoryview(data) as view:
                while done < len(data):
                    n = fh.write(view[done:])
                    if not n:
                        raise OSError(errno.EIO, "the file took no bytes")
                    done += n
        except OSError:
            self.records, self.frames = self._kept
            try:
                fh.truncate(self._size)
                fh.seek(self._size)
            except OSError:  # not a regular file (/dev/full): no end marker after a partial record
                self._whole = self._whole and done == 0
            if self._size == 0 and self._whole:  # the format line went with this write: it goes first again
                self._buf = bytearray(MAGIC)
            raise
        self._size += len(data)
        self._kept = (self.records, self.frames)

    def close(self, why: str = "", now: float | None = None) -> None:
        """Write the end marker and close the file; never raises (a full disk must not cost the snapshot).

        ``why``: why the recording stops early ("" when the user stops the monitor); ``now``: the
        monitor time it stops at (the seconds recorded count to it; else to the last record). A
        failed write leaves :attr:`error` set: the records before it are on disk and replay."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        if not self._claimed and not self.records:  # never started (its monitor did not bind), nothing recorded
            try:
                fh.close()
                if self._created and self.path.is_file() and self.path.stat().st_size == 0:
                    self.path.unlink()
            except OSError:
                pass
            return
        seconds = now - self._t0 if now is not None and self._t0 is not None else self._last
        marker = {"frames": self.frames, "records": self.records, "seconds": round(max(seconds, self._last), 3),
                  "why": why, "closed": round(time.time(), 3)}
        try:
            if self._whole:
                self._add(msgpack.packb([marker["seconds"], END, marker], use_bin_type=True))
                self._flush(fh)
        except OSError as exc:
            self.error = f"recording {self.path} is incomplete: {exc.strerror or exc}"
        finally:
            try:
                fh.close()
            except OSError:
                pass


def read_recording(path: str | Path, on_cut: Say | None = None, on_note: Say | None = None,
                   on_end: Callable[[EndMarker], None] | None = None) -> Iterator[tuple[float, bytes]]:
    """Yield ``(t, frame)`` pairs; raise :class:`RecordingError` on a file that is no recording.

    A recording that does not end as written ends the iteration where it stops being whole, and
    ``on_cut`` is told in words (the run went on after that: its ranks look live where the
    recording stops): one cut short in a record (the monitor was killed, a copy was truncated),
    one without its end marker (killed between two records), one that stopped for an error, a
    damaged record past the first (a length, a checksum or a body that does not read: said with
    its number and byte offset; a damaged first record is no recording), one cut inside its header
    (its few bytes are a header's first: said with the offset, nothing yielded; an empty file is
    no recording, as nothing says it was one). ``on_note`` hears what
    is only worth knowing (a version 1 file: whether it ended cleanly is not known). A
    gzip-compressed recording (``gzip run.rec``) is read as it is. ``on_end`` gets its end marker.
    """
    reader = _Reader(path, on_cut)
    with _open(path) as fh:
        version = reader.header(fh)
        while version:  # 0: cut inside its header (said)
            at = fh.tell()  # where this record starts (of the uncompressed stream)
            body = reader.body(fh, at, version)
            if body is None:
                if reader.at_end and version == 1 and on_note is not None:
                    on_note(f"recording {path} was written by an older flowtop (format 1, no end marker): "
                            "whether it ended cleanly is not known")
                elif reader.at_end:
                    reader.say(f"recording {path} has no end marker: the monitor stopped without closing it "
                               f"{reader.where()}; the run may have gone on after that, so its ranks look "
                               "as they were then")
                return
            item = reader.decode(body, at, version)
            if isinstance(item, EndMarker):
                if on_end is not None:
                    on_end(item)
                reader.ended(item, fh)
                return
            if item is None:
                return
            if item is not _SKIP:
                yield item


def read_frames(path: str | Path) -> Iterator[tuple[float, bytes]]:
    """:func:`read_recording` without the monitor's own records (a spread change): the frames
    the monitor received, for tools that decode each one."""
    return ((t, frame) for t, frame in read_recording(path) if spread_of(frame) is None)


def _open(path: str | Path) -> BinaryIO | gzip.GzipFile:
    try:
        fh: BinaryIO | gzip.GzipFile = open(path, "rb")
        if fh.read(2) == _GZIP_MAGIC:
            fh.close()
            fh = gzip.open(path, "rb")
        else:
            fh.seek(0)
    except OSError as exc:
        raise RecordingError(f"cannot read recording {path}: {exc.strerror}") from None
    return fh


def _read_header(fh: BinaryIO | gzip.GzipFile, path: str | Path) -> tuple[bytes, bool]:
    """Up to a header's bytes, and whether a compressed stream was cut inside them: read one at a
    time, as gzip raises EOFError at a cut and keeps back what it had decompressed before it."""
    got = bytearray()
    try:
        while len(got) < len(MAGIC):
            byte = fh.read(1)
            if not byte:
                break
            got += byte
    except EOFError:
        return bytes(got), True
    except (OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise RecordingError(f"{path} is not a readable recording ({exc})") from None
    return bytes(got), False


class _Reader:
    """:func:`read_recording`'s state: what was read so far, and how to say where it stopped."""

    def __init__(self, path: str | Path, on_cut: Say | None) -> None:
        self.path = path
        self.on_cut = on_cut
        self.records = self.frames = 0
        self.last = 0.0
        self.at_end = False  # the file ended between two records

    def say(self, text: str) -> None:
        if self.on_cut is not None:
            self.on_cut(text)

    def where(self) -> str:
        return f"after {self.frames} frames ({self.last:.1f} s recorded)"

    def header(self, fh: BinaryIO | gzip.GzipFile) -> int:
        """The format version; 0 for a file cut inside its header (said as a cut: the first bytes
        of a header, :data:`NAMED_AT` of them at least, what a copy truncated early or a monitor
        killed mid-write leaves)."""
        header, cut = _read_header(fh, self.path)
        if not header and not cut:  # the recorder writes in FLUSH_BYTES: killed before the first
            raise RecordingError(f"{self.path} is empty: the monitor that wrote it stopped before writing anything")
        if cut and len(header) < NAMED_AT and (MAGIC.startswith(header) or MAGIC_V1.startswith(header)):
            # a gzip stream that ends before its bytes name a recording (bytes that cannot start one
            # read below as not a recording, as an uncompressed file's do)
            where = f"at byte {len(header)}" if header else "before its first byte"
            raise RecordingError(f"{self.path} is a compressed file cut short {where}: not known to be a recording")
        if header in (MAGIC, MAGIC_V1):
            return int(header[len(_PREFIX):-1])
        if NAMED_AT <= len(header) < len(MAGIC) and (MAGIC.startswith(header) or MAGIC_V1.startswith(header)):
            self.say(f"recording {self.path} is cut short in its header at byte {len(header)}: nothing was recorded "
                     "before the cut, so there is nothing to replay")
            return 0
        if header.startswith(_PREFIX):
            version = header[len(_PREFIX):].decode(errors="replace").strip()
            raise RecordingError(f"{self.path} is a recording of a newer format ({version}): a newer flowtop reads it")
        raise RecordingError(f"{self.path} is not a flowtop recording (bad header)")

    def body(self, fh: BinaryIO | gzip.GzipFile, at: int, version: int) -> bytes | None:
        """The next record's body, checked against its checksum; None where the file stops being
        whole (said) or ends between two records (:attr:`at_end`)."""
        head_of = _HEAD if version == 2 else _LEN_V1
        try:
            head = fh.read(head_of.size)
            if len(head) < head_of.size:
                self.at_end = not head
                if head:
                    self.cut(at)
                return None
            size, crc = _HEAD.unpack(head) if version == 2 else (_LEN_V1.unpack(head)[0], None)
            if size > MAX_RECORD:
                self.damaged(f"record of {size} bytes, larger than any frame", at)
                return None
            body = fh.read(size)
        except EOFError:  # a compressed file cut short: what came before stands
            self.cut(at)
            return None
        except (OSError, zlib.error) as exc:  # bad gzip data or CRC, or a read error
            raise RecordingError(f"{self.path}: damaged recording ({exc})") from None
        if len(body) < size:
            self.cut(at)
            return None
        if crc is not None and zlib.crc32(body) != crc:
            self.damaged("checksum mismatch", at, "its bytes changed after they were written "
                         "(a disk or a copy went wrong), so nothing after it is replayed")
            return None
        return body

    def decode(self, body: bytes, at: int, version: int) -> tuple[float, bytes] | EndMarker | None:
        """A frame, the end marker, :data:`_SKIP` for a later flowtop's record, or None where the
        record is damaged (said)."""
        try:
            rec = msgpack.unpackb(body, raw=False)
        except Exception:
            rec = None
        if version == 2 and isinstance(rec, list) and len(rec) == 3 and isinstance(rec[1], str):
            if rec[1] == END:
                return self.marker(rec[2], at)
            self.records += 1
            return _SKIP
        try:
            t, frame = rec
        except Exception:
            self.damaged("damaged record", at)
            return None
        if not isinstance(t, (int, float)) or not isinstance(frame, bytes) or not math.isfinite(t) or t < 0:
            self.damaged("damaged record", at)
            return None
        self.records, self.last = self.records + 1, float(t)
        self.frames += spread_of(frame) is None
        return self.last, frame

    def marker(self, fields: object, at: int) -> EndMarker | None:
        try:
            if not isinstance(fields, dict):
                raise TypeError("not a map")
            end = EndMarker(int(fields["frames"]), int(fields["records"]), float(fields["seconds"]), str(fields["why"]))
        except Exception:
            self.damaged("damaged end marker", at)
            return None
        return end

    def ended(self, end: EndMarker, fh: BinaryIO | gzip.GzipFile) -> None:
        """Check the end marker against what was read, and that nothing follows it."""
        if end.records != self.records:
            self.say(f"recording {self.path} ends with a marker counting {end.records} records where "
                     f"{self.records} were read: records are missing (a damaged copy); replayed {self.where()}")
        if end.why:
            self.say(f"recording {self.path} stopped early {self.where()}: {end.why}; the run may have gone "
                     "on after that, so its ranks look as they were then")
        at = fh.tell()
        try:
            extra = fh.read(1)
        except (OSError, EOFError, zlib.error) as exc:  # a gzip trailer cut or damaged: the records stand
            self.say(f"recording {self.path}: its compressed copy is damaged after the end marker ({exc}); "
                     "every record read whole")
            return
        if extra:
            self.say(f"recording {self.path} goes on after its end marker (byte {at}): what follows is not replayed")

    def cut(self, at: int) -> None:
        """The record at byte ``at`` (of the uncompressed stream) stops before its end."""
        self.say(f"recording {self.path} is cut short in its record at byte {at}, {self.where()}: what came "
                 "after is missing, so its ranks look as they were then")

    def damaged(self, why: str, at: int, what: str = "what came after cannot be read") -> None:
        if not self.records:
            raise RecordingError(f"{self.path}: {why} (its first record, at byte {at})")
        # The records before it stand, as before a cut.
        self.say(f"recording {self.path} has a {why} at record {self.records + 1} (byte {at}): replayed up to it "
                 f"({self.frames} frames, {self.last:.1f} s recorded); {what}")
