"""A node relay's batch as a recording keeps it, so that a replay applies its frames as live. No Textual.

Live, the collector applies a relay's batch ``[stamp, frame, ...]`` through
flowtop.monitor.relays.Relays.unstamp: each frame counts at the time its relay received it and
belongs to that relay, which is what marks its ranks unheard when the relay falls silent or
closes. A recording of the frames alone lost both: a replay read a dead relay's ranks as hung
ranks (a critical hang hint the live monitor never raised, the job stale instead of done). So
before a batch's frames the recording holds a record of its stamp (:func:`relayed_record`); the
replay unstamps it again on its own clock (flowtop.monitor.recording.Feeder) and gives the next
frames that relay and those times.

The record is a msgpack array, which no probe frame is (they are maps, and the wire refuses any
other). A received frame that reads as such a record (a peer forging one) is recorded altered
(flowtop.monitor.thinning.recorded), so that a replay refuses it as the live monitor did. A reader
that does not know the record refuses it as a bad frame, counted, and replays the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

#: The first element of the record (not a wire kind: probes never send it).
RELAYED_KIND = "flowtop.relayed"
#: How every such record starts: a 4-element array header, then the kind.
_PREFIX = b"\x94" + msgpack.packb(RELAYED_KIND)


@dataclass(frozen=True)
class RelayedBatch:
    """The stamp of a relay batch whose ``frames`` frames are the next records, taken off the
    socket ``taken_after_s`` after the drain began (Relays.unstamp's ``taken``)."""

    stamp: bytes
    frames: int
    taken_after_s: float


def relayed_record(stamp: bytes, frames: int, taken_after_s: float) -> bytes:
    """The record written before a relay batch's frames."""
    return msgpack.packb([RELAYED_KIND, bytes(stamp), frames, float(taken_after_s)])


def relayed_of(record: bytes) -> RelayedBatch | None:
    """The batch a recorded frame announces, or None for any other frame (a prefix test first:
    a replay asks it of every frame)."""
    if not record.startswith(_PREFIX):
        return None
    try:
        obj = msgpack.unpackb(record)
    except Exception:  # msgpack raises several types; a damaged record is a bad frame
        return None
    if len(obj) != 4 or type(obj[1]) is not bytes or type(obj[2]) is not int or type(obj[3]) is not float:
        return None
    if obj[2] < 0 or not 0.0 <= obj[3] < 3600.0:
        return None
    return RelayedBatch(obj[1], obj[2], obj[3])


def disarmed(record: bytes) -> bytes:
    """A received frame that reads as a batch record, as the recording keeps it: one element more,
    so that a replay refuses it as a frame (an array, as the live monitor refused it)."""
    return msgpack.packb([*msgpack.unpackb(record), "received"])
