"""A real collector on its own asyncio loop in a background thread, for tests."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Mapping

from flowtop.monitor.collector import Collector
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair


class MonitorThread:
    """Runs ``Collector`` (real zmq.asyncio sockets) until ``close()``."""

    def __init__(self, listen: str | None = None, peak_override_flops: float | None = None,
                 hint_overrides: Mapping[str, Mapping[str, Any]] | None = None,
                 collector: Collector | None = None) -> None:
        self.listen = listen or f"tcp://127.0.0.1:{free_port_pair()}"
        self.collector = collector or Collector(make_model(peak_override_flops, hint_overrides), self.listen)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("collector did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.collector.start())
        self._ready.set()
        self._loop.run_forever()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the collector's loop thread and return its result."""
        fut = asyncio.run_coroutine_threadsafe(_wrap(fn), self._loop)
        return fut.result(10)

    def snapshot(self) -> MonitorSnapshot:
        """A snapshot taken on the loop thread now (the model is not thread-safe): a pure read,
        with the hints of the last tick."""
        return self.call(self.collector.snapshot)

    def published(self) -> MonitorSnapshot:
        """The latest tick's snapshot, what the TUI is shown: its hints were evaluated on exactly
        its ranks' data (a later snapshot may hold steps the hints have not seen yet)."""
        return self.call(lambda: self.collector.published or self.collector.snapshot())

    def wait_for(self, pred: Callable[[MonitorSnapshot], bool], timeout: float = 60.0) -> MonitorSnapshot:
        """Poll the ticks' snapshots until ``pred`` holds; return the last one either way."""
        deadline = time.monotonic() + timeout
        snap = self.published()
        while not pred(snap) and time.monotonic() < deadline:
            time.sleep(0.1)
            snap = self.published()
        return snap

    def close(self) -> None:
        """Stop the collector and the loop."""
        asyncio.run_coroutine_threadsafe(self.collector.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def _wrap(fn: Callable[[], Any]) -> Any:
    return fn()
