"""Recordings: the raw frames a monitor received, with receive times, to replay later.

Format (version 1): the line ``FLOWTOP-REC 1\\n``, then records of a 4-byte
big-endian length followed by a msgpack array ``[t, frame]`` — ``t`` seconds
since the recording started (monitor clock), ``frame`` the wire frame exactly as
received. Replaying feeds the frames through the same decoder and model as live
data, so a recording reproduces what the monitor showed (and a hostile frame in
it is rejected again, never trusted). No Textual here.
"""

from __future__ import annotations

import gzip
import math
import struct
import time
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import msgpack

from flowtop.model import Model
from flowtop.snapshot import MonitorSnapshot
from probe import wire

MAGIC = b"FLOWTOP-REC 1\n"
_LEN = struct.Struct(">I")
_GZIP_MAGIC = b"\x1f\x8b"
#: A record is a wire frame plus a few bytes.
MAX_RECORD = wire.MAX_FRAME_BYTES + 64


class RecordingError(ValueError):
    """A file that is not a readable flowtop recording."""


class Recorder:
    """Appends received frames to a recording file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._fh: BinaryIO | None = open(self.path, "wb")
        except OSError as exc:
            raise RecordingError(f"cannot write recording {self.path}: {exc.strerror}") from None
        self._fh.write(MAGIC)
        self._t0: float | None = None
        self.frames = 0
        #: Why the recording ended short ("" while it is whole); set by :meth:`close`.
        self.error = ""

    def write(self, now: float, frame: bytes) -> None:
        """Record one frame received at monitor time ``now``."""
        if self._fh is None:
            return
        if self._t0 is None:
            self._t0 = now
        rec = msgpack.packb([now - self._t0, bytes(frame)], use_bin_type=True)
        self._fh.write(_LEN.pack(len(rec)) + rec)
        self.frames += 1

    def close(self) -> None:
        """Flush and close the file; never raises (a full disk must not cost the snapshot).

        A failed flush leaves :attr:`error` set: the frames before it are on disk and replay."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            fh.close()
        except OSError as exc:
            self.error = f"recording {self.path} is incomplete: {exc.strerror or exc}"
            try:
                fh.close()  # the buffer is dropped; the descriptor must still go
            except OSError:
                pass


def read_recording(path: str | Path) -> Iterator[tuple[float, bytes]]:
    """Yield ``(t, frame)`` pairs; raise :class:`RecordingError` on a damaged file.

    A file cut short in its last record (the monitor was killed) ends the
    iteration quietly: everything before it is still good. A gzip-compressed
    recording (``gzip run.rec``) is read as it is.
    """
    try:
        fh: BinaryIO = open(path, "rb")
        if fh.read(2) == _GZIP_MAGIC:
            fh.close()
            fh = gzip.open(path, "rb")  # type: ignore[assignment]
        else:
            fh.seek(0)
    except OSError as exc:
        raise RecordingError(f"cannot read recording {path}: {exc.strerror}") from None
    with fh:
        try:
            header = fh.read(len(MAGIC))
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            raise RecordingError(f"{path} is not a readable recording ({exc})") from None
        if header != MAGIC:
            raise RecordingError(f"{path} is not a flowtop recording (bad header)")
        while True:
            try:
                head = fh.read(_LEN.size)
                if len(head) < _LEN.size:
                    return
                (size,) = _LEN.unpack(head)
                if size > MAX_RECORD:
                    raise RecordingError(f"{path}: record of {size} bytes is larger than any frame")
                body = fh.read(size)
            except EOFError:  # a compressed file cut short: what came before stands
                return
            except (OSError, zlib.error) as exc:  # bad gzip data or CRC, or a read error
                raise RecordingError(f"{path}: damaged recording ({exc})") from None
            if len(body) < size:
                return
            try:
                t, frame = msgpack.unpackb(body, raw=False)
            except Exception:
                raise RecordingError(f"{path}: damaged record") from None
            if (not isinstance(t, (int, float)) or not isinstance(frame, bytes)
                    or not math.isfinite(t) or t < 0):
                raise RecordingError(f"{path}: damaged record")
            yield float(t), frame


def feed(model: Model, frame: bytes, now: float) -> None:
    """Decode one frame into ``model`` the way the collector does."""
    try:
        msg = wire.decode(frame)
    except wire.WireError as exc:
        model.reject(str(exc))
        return
    try:
        model.ingest(msg, now)
    except Exception as exc:
        model.reject(f"ingest: {type(exc).__name__}: {exc}")


#: Recording seconds between the snapshots a replay takes on the way (the live monitor takes
#: two a second): hints need evidence held over time (throttling for 5 s), and only snapshots
#: taken along the way let their hysteresis see it.
REPLAY_EVAL_S = 1.0


def replay_all(path: str | Path, model: Model) -> MonitorSnapshot:
    """Feed a whole recording and return the snapshot at its last frame, taking snapshots every
    :data:`REPLAY_EVAL_S` of recorded time so the hints evolve as they did live."""
    last = 0.0
    next_eval = REPLAY_EVAL_S
    where = f"replay:{path}"
    for t, frame in read_recording(path):
        while t >= next_eval:
            model.snapshot(next_eval, where)
            next_eval += REPLAY_EVAL_S
        feed(model, frame, t)
        last = t
    return model.snapshot(last, where)


class RecordingSource:
    """A snapshot source for the TUI that plays a recording back at ``speed``."""

    def __init__(self, path: str | Path, model: Model, speed: float = 1.0) -> None:
        self.path = Path(path)
        self.model = model
        self.speed = speed
        self._records: list[tuple[float, bytes]] = []
        self._next = 0
        self._start: float | None = None
        self._worker: Any = None  # flowtop.kernel_worker.KernelWorker while playing

    async def start(self) -> None:
        """Load the recording (errors surface here, before the UI shows anything); kernel windows
        are then built off the UI's loop, as the live collector builds them."""
        self._records = list(read_recording(self.path))
        self._start = time.monotonic()
        if self.model.builds_kernels:
            from flowtop.kernel_worker import KernelWorker
            from flowtop.wiring import apply_kernel_stats, build_kernel_stats

            self._worker = KernelWorker(self.model, build_kernel_stats)
            self.model.offload_kernels(self._worker.submit, apply_kernel_stats)

    def snapshot(self) -> MonitorSnapshot:
        """Feed every frame due by now (scaled by speed) and snapshot at that virtual time."""
        start = self._start if self._start is not None else time.monotonic()
        virtual = (time.monotonic() - start) * self.speed
        while self._next < len(self._records) and self._records[self._next][0] <= virtual:
            t, frame = self._records[self._next]
            feed(self.model, frame, t)
            self._next += 1
        if self._next >= len(self._records) and self._records:
            virtual = min(virtual, self._records[-1][0])  # hold the last state, don't age it
        return self.model.snapshot(virtual, f"replay:{self.path.name}")

    def request_kernels(self, job: str, rank: int) -> None:
        """A recording cannot be asked for anything."""

    async def stop(self) -> None:
        """Stop building kernel windows."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
            self.model.build_kernels_here()
