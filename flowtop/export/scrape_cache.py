"""The rendered scrape of the newest snapshot, kept until the next one. No Textual.

Rendering the exporter's families is most of a scrape's cost (at 1,024 ranks ~2.3 MB of text,
~0.2-0.3 s of the monitor's CPU, plus gzip for Prometheus, which asks for it), and it depends on
the snapshot and the export policy alone. The data thread publishes a new snapshot per tick
(2 Hz); every scrape in between — Prometheus replicas of an HA pair, a second team's server,
``curl`` — would render the same bytes again. :class:`ScrapeCache` keeps, for the one snapshot
it last saw, the rendered body per format (Prometheus text, OpenMetrics version and escaping;
``/snapshot.json``) and, for gzip, a compressor that has eaten that body: a request copies it
(``zlib`` compressor ``copy()``), feeds the small part that must be fresh (the monitor's own CPU,
``process_*``) and flushes, so a gzip'd scrape costs the fresh part, not 2 MB of deflate.

Bounded: one snapshot's entries at a time (a newer snapshot drops them all), at most
``max_entries`` formats (an Accept header names a version: clients could ask for many), and at
most ``max_bytes`` of bodies (a body above that is rendered per request, never kept).
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

#: Formats kept per snapshot (text 0.0.4, OpenMetrics 1.0.0, the JSON, and one more).
MAX_ENTRIES = 4
#: Bytes of rendered bodies kept (a 4,096-rank job with the cap raised renders ~9.4 MB a format).
MAX_BYTES = 64 << 20
#: zlib's default: within a few % of level 9's size at a fraction of its time.
GZIP_LEVEL = 6
_GZIP_WBITS = 31  # a gzip container (header, CRC-32, size), as Content-Encoding: gzip wants


@dataclass
class Entry:
    """One format's body of one snapshot; ``deflater`` once a gzip request came."""

    body: bytes
    deflater: Any = None  # zlib compressor that has eaten ``body``, never flushed
    deflated: bytes = b""  # what it wrote so far
    lock: threading.Lock = field(default_factory=threading.Lock)

    def gzip(self, tail: bytes) -> bytes:
        """gzip of ``body + tail``, the body compressed once per snapshot and format."""
        with self.lock:
            if self.deflater is None:
                self.deflater = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
                self.deflated = self.deflater.compress(self.body)
            copy = self.deflater.copy()
        return self.deflated + copy.compress(tail) + copy.flush()


class ScrapeCache:
    """Rendered bodies of the newest snapshot, per format key. Thread-safe: the HTTP server
    answers each request on a thread of its own.

    Args:
        max_entries: Formats kept for one snapshot (least recently used go first).
        max_bytes: Body bytes kept in all; a larger body is rendered for its request only.
    """

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._snap: Any = None
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()  # held while rendering: a second scraper waits, then hits
        self.hits = 0
        self.renders = 0

    def get(self, snap: Any, key: str, render: Callable[[], bytes]) -> Entry:
        """The entry of ``key`` for ``snap`` (compared by identity: snapshots are immutable and a
        new one is a new object), rendered by ``render()`` on a miss."""
        with self._lock:
            if snap is not self._snap:
                self._entries.clear()
                self._snap = snap
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry
            entry = Entry(render())
            self.renders += 1
            if len(entry.body) <= self.max_bytes:
                self._entries[key] = entry
                while len(self._entries) > self.max_entries or self.held_bytes() > self.max_bytes:
                    self._entries.popitem(last=False)
            return entry

    def held_bytes(self) -> int:
        """Body bytes kept now (the compressors' output aside: a tenth of it or less)."""
        return sum(len(e.body) for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)
