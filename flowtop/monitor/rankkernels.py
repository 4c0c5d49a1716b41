"""A rank's kernel tables, and how the model has them built. No Textual.

A ``kernels`` frame is the raw profiler records of one step. Per rank the model keeps the latest
window's table (:class:`~flowtop.monitor.kernels.aggregate.KernelWindowStats`) and a cumulative table
(:class:`~flowtop.monitor.kernels.merge.CumulativeKernels`), and per job their comparison across ranks
(:class:`~flowtop.monitor.kernels.merge.JobKernelStats`). :class:`KernelTables` is the model's one kernel
strategy: where a window is built (where it arrives, or by a builder off the data thread) and how a job's
tables are compared. A model without one ignores kernel windows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from flowtop.monitor.kernels.aggregate import KernelWindowStats, aggregate
from flowtop.monitor.kernels.merge import CumulativeKernels, JobKernelStats, merge_cumulative
from flowtop.monitor.kernels.trace import window_from_wire
from flowtop.monitor.rankstate import RankState
from probe import wire
from probe.wire import RankKey

#: A window to build: the frame's fields, or the frame itself when only its envelope was read
#: (probe.wire.envelope: its fields are then decoded and validated by the builder).
Window = Mapping[str, Any] | bytes
#: Where a window goes to be built off the data loop: (rank, the window).
Submit = Callable[[RankKey, Window], None]


def decode_frame(frame: bytes, builds: bool, known: Callable[[RankKey], bool],
                 admit: wire.Admit | None = None) -> wire.Message:
    """``frame`` decoded for Model.ingest, live (flowtop.monitor.collector) and in a replay
    (flowtop.monitor.recording) alike; raises probe.wire.WireError.

    Where the model ``builds`` kernel tables, a window of a rank ``known`` to it only as far as its
    envelope: the builder decodes and validates its fields with the rest (~2 ms of an 80 KB
    window's ~14 ms; off the data thread where a worker builds), and a window ``admit`` refuses
    for the byte rate costs ~70 µs instead of ~600 µs. Its envelope then counts as heard (its
    seq, its time, the frame received) before its fields are validated: a bad one is also
    rejected, later. An unknown rank's window is decoded whole before it may create the rank."""
    if builds and len(frame) >= wire.PEEK_BYTES:
        try:
            head = wire.envelope(frame)
        except wire.WireError:
            head = None  # the whole decode says why
        if head is not None and head.kind == "kernels" and known(head.key):
            why = admit(head.key, head.kind, len(frame)) if admit is not None else ""
            if why:
                raise wire.WireError(why)
            return head
    try:
        return wire.decode(frame, admit)
    except wire.WireError:
        raise
    except Exception as exc:  # a decoder's slip (a warning raised under -W error): one frame lost, live or replayed
        raise wire.WireError(f"decode: {type(exc).__name__}: {exc}"[:200]) from None


def build_window(window: Window) -> KernelWindowStats:
    """One probe kernel window's table and anatomy. Pure (safe on a thread or in a process): the
    monitor builds large GPU windows (≈50 ms for a 940 M-parameter GPT's step) off its loop,
    and a frame whose envelope alone was read is decoded here too (~2 ms for 80 KB; raises
    probe.wire.WireError when its fields are bad)."""
    fields = wire.decode(window).fields if isinstance(window, bytes) else window
    return aggregate(window_from_wire(dict(fields)))


def add_window(st: RankState, stats: KernelWindowStats) -> None:
    """Make ``stats`` the rank's latest window and add it to its cumulative table."""
    st.kernels = stats
    if st.kernels_cumulative is None:
        st.kernels_cumulative = CumulativeKernels()
    st.kernels_cumulative.add(stats)


@dataclass(frozen=True)
class KernelTables:
    """How the model turns ``kernels`` frames into tables.

    ``submit`` None: each window is built as it is ingested (a replay into a model, tests,
    benchmarks). Set (a live collector or a played recording, see flowtop.monitor.kernel_worker): the
    frame goes to it, is built by the worker's builder and comes back through
    ``Model.apply_kernels``. ``merge`` compares a job's cumulative tables (rank -> table)."""

    submit: Submit | None = None
    merge: Callable[[Mapping[int, CumulativeKernels]], JobKernelStats] = merge_cumulative

    def offloaded(self, submit: Submit) -> KernelTables:
        """The same tables, windows built by ``submit``."""
        return replace(self, submit=submit)

    def inline(self) -> KernelTables:
        """The same tables, windows built where they arrive."""
        return replace(self, submit=None)
