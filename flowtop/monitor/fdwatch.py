"""Whether the monitor can still accept probe connections: its open files against the limit.

Each probe connection costs the monitor a file descriptor. At the limit libzmq cannot accept
another one, and a rank that cannot connect is simply invisible. libzmq does report the failed
accept as a socket-monitor event, but it retries the accept at once, for ever: subscribing to
that event floods the monitor pipe, and a full pipe blocks libzmq's I/O thread (every rank's
frames stop). So the monitor counts its open files instead, every few seconds. No Textual.
"""

from __future__ import annotations

import errno
import os
import resource

#: Seconds between two counts (a listing of /proc/self/fd: ~1 ms at 4,000 descriptors).
EVERY_S = 2.0
#: Descriptors kept in reserve (files, pipes, the recording): fewer free than this is "full".
RESERVE = 8
_FD_DIR = "/proc/self/fd"


def open_files(limit: int) -> int | None:
    """Descriptors open in this process now (None where the count is not available); ``limit``
    when not even the listing could get a descriptor."""
    try:
        return len(os.listdir(_FD_DIR))
    except OSError as exc:
        return limit if exc.errno == errno.EMFILE else None


def capacity(limit: int, used: int | None) -> int:
    """Connections (probes or relays) the monitor can still accept: its soft open-file limit
    less the descriptors open now and :data:`RESERVE`."""
    return max(0, limit - (used or 0) - RESERVE)


class FdHeadroom:
    """Says, at most every :data:`EVERY_S`, when the monitor has run out of descriptors, and at
    start how many connections it can take when that is fewer than a large job needs."""

    def __init__(self, listen: str) -> None:
        self.listen = listen
        self._at = float("-inf")

    def at_start(self, wanted: int) -> str:
        """The notice text when the open-file limit (raised to the hard limit already) leaves
        room for fewer than ``wanted`` connections, else ""."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return ""
        used = open_files(soft)
        room = capacity(soft, used)
        if room >= wanted:
            return ""
        hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        return (f"open-file limit {soft} (hard {hard_text}): this monitor can take about {room} probe or relay "
                f"connections on {self.listen} ({used} descriptors in use); ranks beyond that are not "
                f"seen: run node relays (one connection per node: flowtop run --relay on) or raise the hard limit "
                f"(ulimit -Hn, limits.conf)")

    def check(self, now: float) -> str:
        """The notice text when the monitor is at its open-file limit, else ""."""
        if now - self._at < EVERY_S:
            return ""
        self._at = now
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        used = open_files(limit)
        if used is None or limit == resource.RLIM_INFINITY or used < limit - RESERVE:
            return ""
        return (f"cannot accept probe connections on {self.listen}: {used} of {limit} open files in use "
                f"({os.strerror(errno.EMFILE)}); ranks beyond that are not seen: raise the limit (ulimit -n)")
