"""What is live at the end of ``bench/ingest.py --memory``, for bench/mem_where.py and
bench/size_classes.py: runs ingest's ``memory(ranks, traced=True)`` with tracemalloc keeping
``frames`` frames a trace and takes a snapshot at its first stop (the end of the measured phases,
before the latest kernel window is measured apart). Imports the checkout in the working directory.
"""

from __future__ import annotations

import os
import sys
import tracemalloc
from typing import Any

sys.path.insert(0, os.getcwd())  # the checkout under test: the working directory's
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ingest  # noqa: E402 - bench/


def memory_at_end(ranks: int, frames: int) -> tuple[dict[str, Any], tracemalloc.Snapshot]:
    """ingest's figures for ``ranks`` and the snapshot of what was live at the measured end."""
    snaps: list[tracemalloc.Snapshot] = []
    start, stop = tracemalloc.start, tracemalloc.stop

    def stop_after_snapshot() -> None:
        if not snaps:  # the first stop: the end of the measured phases
            snaps.append(tracemalloc.take_snapshot())
        stop()

    tracemalloc.start = lambda *a: start(frames)  # type: ignore[assignment]
    tracemalloc.stop = stop_after_snapshot  # type: ignore[assignment]
    try:
        result = ingest.memory(ranks, traced=True)
    finally:
        tracemalloc.start, tracemalloc.stop = start, stop
    return result, snaps[0]
