"""Builds kernel-window tables on a worker thread so the collector's event loop stays live.

A GPU window of a large model is thousands of records: building its table takes tens of
milliseconds (≈50 ms for a 940 M-parameter GPT's step, measured on the H200 recording), and the
windows of a synchronous job arrive at the same step from every rank. Built on the loop, 64 ranks
would stall receiving and the UI for seconds; here one thread builds them while the loop keeps
its turn (the GIL switches every few milliseconds). The newest window of each rank wins: one that
arrives while an older one of the same rank waits replaces it. No Textual here.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from flowtop.model import Model
from probe.wire import RankKey

_log = logging.getLogger("flowtop.kernel_worker")


class KernelWorker:
    """Queue of kernel windows to build, latest per rank, one builder thread."""

    def __init__(self, model: Model, build: Callable[[dict[str, Any]], Any]) -> None:
        self.model = model
        self._build = build
        self._pending: dict[RankKey, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowtop-kernels")
        self.built = 0
        self.replaced = 0  # windows superseded by a newer one of the same rank before being built

    def submit(self, key: RankKey, fields: dict[str, Any]) -> None:
        """Queue a window (called on the loop, from the model's ingest)."""
        if key in self._pending:
            self.replaced += 1
        self._pending[key] = fields
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            key = next(iter(self._pending))
            fields = self._pending.pop(key)
            try:
                stats = await loop.run_in_executor(self._pool, self._build, fields)
            except Exception as exc:  # a hostile-but-valid window must not kill the monitor
                self.model.reject(f"kernels: {type(exc).__name__}: {exc}")
                continue
            self.built += 1
            try:
                self.model.apply_kernels(key, stats)
            except Exception as exc:
                _log.warning("applying a kernel window failed: %r", exc)

    async def idle(self) -> None:
        """Wait until every queued window is built and applied (tests, shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    def close(self) -> None:
        """Stop building: queued windows are dropped, a running build finishes on its own."""
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
