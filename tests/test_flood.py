"""A flood at the monitor while its TUI runs (issue 10): forged rank ids and big kernels frames.

The flood comes from another process (bench/flood.py --send) over ZeroMQ, into the real
collector on the data thread, while a pilot-driven app handles keys. Timings are printed, not
asserted (bench/flood.py gives the figures): what is asserted cannot be flaky — keys are handled
while the flood is still being sent, and the data thread never has more than one wake-up waiting
in the UI's queue however many snapshots it makes (latest wins).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual import events

from flowtop.monitor.collector import Collector
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tui.app import FlowtopApp

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.asyncio
async def test_keys_are_handled_during_a_flood_and_snapshots_are_coalesced() -> None:
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    collector = Collector(make_model(), listen)
    app = FlowtopApp(collector, refresh_s=0.5)
    handled: list[float] = []
    app.action_test_ping = lambda: handled.append(time.perf_counter())  # type: ignore[attr-defined]
    posted, taken, most_waiting = [0], [0], [0]
    wake, take = app.data._wake, app.data.mailbox.take

    def counting_wake() -> None:  # on the data thread
        posted[0] += 1
        most_waiting[0] = max(most_waiting[0], posted[0] - taken[0])
        wake()

    def counting_take() -> object:  # on the UI thread, when it handles a wake-up
        taken[0] += 1
        return take()

    app.data._wake = counting_wake  # type: ignore[method-assign]
    app.data.mailbox.take = counting_take  # type: ignore[method-assign]
    latencies: list[float] = []
    async with app.run_test(size=(100, 30)) as pilot:
        app.bind("f9", "test_ping", show=False)
        await pilot.pause(0.5)
        flooder = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "flood.py"), "--send", listen, "--ranks", "20000",
             "--kernels", "3", "--kernel-mb", "2", "--pace-s", "4", "--linger-s", "3"],
            stdout=subprocess.PIPE, text=True)
        during = 0
        deadline = time.monotonic() + 60
        while flooder.poll() is None and time.monotonic() < deadline:
            n, t = len(handled), time.perf_counter()
            key = events.Key("f9", None)
            key.set_sender(app)
            app._driver.send_message(key)  # as the terminal driver hands a key over
            while len(handled) == n and time.perf_counter() - t < 10:
                await pilot.pause(0.001)
            if len(handled) > n:
                latencies.append(handled[n] - t)
                during += flooder.poll() is None
            await pilot.pause(0.1)
        sent = json.loads(flooder.communicate(timeout=60)[0])
        await pilot.pause(2.0)
        await pilot.press("q")
    print(f"\nflood {sent}: {len(latencies)} keys, latency ms p50 {1000 * statistics.median(latencies):.1f} "
          f"max {1000 * max(latencies):.1f}; snapshots made {app.data.mailbox.put_count}, rendered {app.delivered}, "
          f"dropped {app.data.mailbox.dropped}; wake-ups {posted[0]}, most waiting {most_waiting[0]}")
    assert sent["forged_ranks_sent"] == 20000 and sent["kernels_frames_sent"] == 3
    assert during >= 5  # keys were handled while the flood was still being sent
    assert most_waiting[0] <= 1  # never more than one wake-up queued: older snapshots wait in no queue
    assert posted[0] >= 3 and app.delivered <= app.data.mailbox.put_count
