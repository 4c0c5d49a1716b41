"""Builds kernel-window tables off the data thread so its event loop stays live.

A GPU window of a large model is thousands of records: building its table takes tens of
milliseconds (≈50 ms for a 940 M-parameter GPT's step, measured on the H200 recording), and the
windows of a synchronous job arrive at the same step from every rank. Built on the loop, 16 ranks'
windows stalled it for 542 ms (``bench/kernel_windows.py``); here one builder takes them in
arrival order while the loop keeps its turn: 14 ms. Every window reaches the rank's cumulative
table, as in a replay; only a flood beyond :data:`MAX_PENDING` queued windows drops one — the
oldest of a rank with another queued, so no rank loses all of its windows — and counts it.
No Textual here.

The builder is a thread, or with ``processes`` (the live collector) a child process: a window's
~14 ms of decoding and building (80 KB) then does not share the monitor's interpreter lock with
its data thread — at 4,096 ranks a builder thread held a third of it, and every frame waited
behind it. The window goes over as bytes and its table (~15 KB) comes back pickled (~0.2 ms each
way; its names interned again on arrival, flowtop.monitor.kernels.aggregate). The child leaves
when the monitor does, even killed. A builder that dies (the kernel's OOM killer, a signal) is
started again and its window tried once more; a window it dies on twice is rejected (it may be
what kills it). After :data:`MAX_RESTARTS` deaths windows are no longer built (counted as
dropped; on a thread such a window would take the monitor down), and the user is told. Where no
process can be started (no ``/dev/shm`` semaphores, no descriptors left), a thread builds, as
before, and the user is told.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import resource_tracker
from typing import Callable

from flowtop.monitor.kernels.aggregate import KernelWindowStats
from flowtop.monitor.model import Model
from flowtop.monitor.rankkernels import Window
from probe.wire import RankKey, WireError

_log = logging.getLogger("flowtop.kernel_worker")

#: Windows waiting to be built at most (≈ 13 s of building for a large GPU model's windows).
MAX_PENDING = 256
#: Builder processes lost before windows are no longer built.
MAX_RESTARTS = 5


#: Seconds between the builder process's looks at whether the monitor still runs.
PARENT_CHECK_S = 1.0


def _quiet_child(parent: int) -> None:
    """In the builder process: a Ctrl-C in the monitor's terminal is the monitor's to handle
    (the whole process group gets it; the child would print a traceback over the screen), and
    the child leaves when the monitor ``parent`` is gone (killed, its queues are never closed)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="flowtop-parent-watch", daemon=True).start()


def _tracker_running() -> None:
    """multiprocessing's resource tracker (a process pool's semaphores need it) started with a
    real stderr. Under the TUI ``sys.stderr`` is Textual's capture, whose ``fileno()`` is -1: the
    tracker's spawn refused it ("bad value(s) in fds_to_keep") and every window went to a thread.
    For the few milliseconds of that spawn ``sys.stderr`` is the process's own again (a line the
    UI printed then would reach the terminal instead of the capture)."""
    try:
        usable = sys.stderr is not None and sys.stderr.fileno() >= 0
    except Exception:  # no fileno at all: the tracker passes no stderr then
        usable = True
    if usable or sys.__stderr__ is None:
        return
    captured, sys.stderr = sys.stderr, sys.__stderr__
    try:
        resource_tracker.ensure_running()
    finally:
        sys.stderr = captured


class _GaveUp(Exception):
    """The builder died MAX_RESTARTS times: windows are no longer built."""


class KernelWorker:
    """Queue of kernel windows to build, in arrival order, on one builder (a thread or a process)."""

    def __init__(self, model: Model, build: Callable[[Window], KernelWindowStats], processes: bool = False) -> None:
        """``build`` runs on the builder: with ``processes`` in a child process (it must then be
        a module-level function), else on a thread."""
        self.model = model
        self._build = build
        self._pending: collections.deque[tuple[RankKey, Window]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self.processes = processes
        #: Made at the first window (a process pool starts multiprocessing's resource tracker, a
        #: process of its own: a monitor that never gets a window need not pay for it).
        self._pool: Executor | None = None
        self._closed = False
        self.built = 0
        self.dropped = 0  # windows never built: the queue overflowed, or the monitor stopped
        self.restarts = 0  # builder processes lost
        self.gave_up = False  # MAX_RESTARTS reached: windows are dropped

    def _new_pool(self) -> Executor:
        if self.processes:
            try:
                _tracker_running()
                return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=_quiet_child, initargs=(os.getpid(),))
            except Exception as exc:  # no semaphores (/dev/shm), no spawn: a thread still builds
                self._to_thread(f"no builder process could be started ({type(exc).__name__}: {exc})")
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowtop-kernels")

    def _to_thread(self, why: str) -> None:
        self.processes = False
        self._tell("are built on the monitor's own thread", why)

    def _tell(self, what: str, why: str) -> None:
        """The user (a notice) and the log hear how kernel windows are handled from now on."""
        _log.warning("kernel windows %s: %s", what, why)
        self.model.notices.warning(f"kernel windows {what}: {why}", self.model.now)

    @property
    def started(self) -> bool:
        """Whether a builder has been made (at the first window)."""
        return self._pool is not None

    def _lost_builder(self, exc: BaseException) -> None:
        """The builder process died: the next window starts another, up to MAX_RESTARTS."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        self.restarts += 1
        if self.restarts >= MAX_RESTARTS and not self.gave_up:
            self.gave_up = True
            self._tell("are no longer built", f"the builder process died {self.restarts} times ({exc})")

    def _submitted(self, window: Window) -> asyncio.Future[KernelWindowStats]:
        """``window`` handed to the builder. A builder process found dead, or that cannot be
        started, never saw it: it goes to the next builder (a new process, or a thread)."""
        loop = asyncio.get_running_loop()
        while not self.gave_up:
            if self._pool is None:
                self._pool = self._new_pool()
            try:
                return loop.run_in_executor(self._pool, self._build, window)
            except BrokenProcessPool as exc:  # died while idle
                self._lost_builder(exc)
            except Exception as exc:  # no process could be started (no descriptors left, ...)
                if not self.processes:
                    raise
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
                self._to_thread(f"no builder process could be started ({type(exc).__name__}: {exc})")
        raise _GaveUp

    def submit(self, key: RankKey, fields: Window) -> None:
        """Queue a window: its fields, or its frame when the collector read only its envelope
        (the builder then decodes it too; called on the loop, from the model's ingest)."""
        if self._closed:
            self.dropped += 1
            return
        if len(self._pending) >= MAX_PENDING:
            self._drop_one(key)
        self._pending.append((key, fields))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    def _drop_one(self, incoming: RankKey) -> None:
        """Make room for a window of ``incoming``: the oldest window of a rank that will still
        have another one queued, so no rank loses all its windows to a flood from the others;
        else the oldest of all."""
        counts = collections.Counter(k for k, _ in self._pending)
        counts[incoming] += 1
        for i, (k, _) in enumerate(self._pending):
            if counts[k] > 1:
                del self._pending[i]
                break
        else:
            self._pending.popleft()
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            _log.warning("kernel windows arrive faster than they are built: %d dropped so far", self.dropped)

    async def _drain(self) -> None:
        retried: Window | None = None  # the window a builder died on once
        while self._pending:
            key, fields = self._pending.popleft()
            try:
                stats = await self._submitted(fields)
            except _GaveUp:
                self.dropped += 1
                continue
            except BrokenProcessPool as exc:  # died (out of memory, a signal) with it running or queued
                if self._closed:
                    return
                self._lost_builder(exc)
                if retried is fields:
                    self.model.reject("kernels: the window builder process died on this window twice")
                else:
                    retried = fields
                    self._pending.appendleft((key, fields))
                continue
            except WireError as exc:  # a frame whose envelope alone was read: its fields are bad
                self.model.reject(str(exc))
                continue
            except Exception as exc:  # a hostile-but-valid window must not kill the monitor
                self.model.reject(f"kernels: {type(exc).__name__}: {exc}")
                continue
            self.built += 1
            try:
                self.model.apply_kernels(key, stats)
            except Exception as exc:
                _log.warning("applying a kernel window failed: %r", exc)

    async def idle(self) -> None:
        """Wait until every queued window is built and applied (returns at once after close)."""
        while self._task is not None and not self._task.done() and not self._closed:
            await asyncio.shield(self._task)

    def close(self) -> None:
        """Stop building: queued windows are dropped (and counted), a running build finishes on
        its builder and is discarded."""
        self._closed = True
        self.dropped += len(self._pending)
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
