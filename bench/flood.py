"""UI key latency while the monitor is flooded (issue 10 leftover, issue 15 part 1).

    python bench/flood.py [--ranks 100000] [--kernels 12] [--kernel-mb 7.4] [--seconds 20]

A real monitor (Collector, model, hints, kernel worker) runs inside the real Textual app, driven
headless by a pilot; a flooder *process* sends it, over ZeroMQ, ``--ranks`` forged rank ids (a
hello from each) and ``--kernels`` big valid kernels frames (``--kernel-mb`` MB each: the size
that took 1.5 s to validate on the UI loop before the data side had its own thread). Meanwhile
the pilot presses a key bound on the app every 100 ms and the app times, for each press, the
delay until its action ran (the key goes in as the terminal driver hands keys over); a 20 ms UI timer measures how late the UI loop runs. Prints one JSON
object: key latency (p50/p99/max, ms) before and during the flood, keys handled during the flood,
UI loop lag, the UI's render time per snapshot, the garbage collector's pauses (a collection
stops every thread), what the monitor received and refused, and how many snapshots the data
thread made, the UI rendered and the mailbox dropped (latest wins). Figures, no assertions.
``--gc-default`` keeps CPython's GC thresholds instead of the monitor's (flowtop.monitor.gcpolicy). Run
from a checkout of an older flowtop (before the data thread), it measures that monitor instead.

``--send ADDR`` runs only the flooder (tests/test_flood.py uses it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# --- the flooder (its own process: it must not share the monitor's GIL) ---------------------------

def kernels_fields(mb: float) -> dict[str, Any]:
    """A valid kernels window of about ``mb`` MB on the wire (host ops and device activities)."""
    n = max(1, int(mb * 1e6 / 40))
    names = [f"flood_kernel_{i}_" + "x" * 40 for i in range(200)]
    ops = [[i % 200, 0, float(i), float(i) + 2.0, 0, [[64, 64], [64, 64]], None] for i in range(n // 4)]
    acts = [[i % 200, 0, float(i) + 1.0, float(i) + 1.5, 7, i % (n // 4 or 1), i] for i in range(n)]
    return {"window": 1, "step": 10, "device": "cuda", "step_dur_us": float(n) + 10.0, "names": names,
            "ops": ops, "acts": acts}


def flood(addr: str, ranks: int, kernels: int, kernel_mb: float, pace_s: float = 0.0,
          linger_s: float = 120.0) -> dict[str, Any]:
    """Send the flood to ``addr`` as fast as a PUB socket takes it (or spread over ``pace_s``
    seconds); returns what was sent."""
    import zmq

    from probe import wire

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, int(linger_s * 1000))  # frames still queued may reach a slow monitor
    sock.setsockopt(zmq.SNDHWM, 0)  # keep everything: the monitor's side decides what it takes
    sock.connect(addr)
    time.sleep(0.5)  # the monitor's subscription arrives
    fields = kernels_fields(kernel_mb)
    hello = {"local_rank": 0, "world_size": ranks, "device": "cpu (forged)", "probe_version": "flood"}
    every = max(1, ranks // max(1, kernels))
    sent = big = 0
    t0 = time.monotonic()
    for r in range(ranks):
        key = wire.RankKey("flood", f"forged-{r % 997}", 100_000 + r, r % (1 << 24), 0)
        sock.send(wire.encode("hello", key, 0, time.time(), hello))
        sent += 1
        if big < kernels and r % every == every - 1:
            key = wire.RankKey("flood-kernels", "big", 9, big % 4, 0)
            sock.send(wire.encode("kernels", key, big // 4 + 1, time.time(), {**fields, "window": big + 1}))
            big += 1
        if r % 2000 == 1999:
            # A burst, not one giant send: the I/O thread drains a little; paced, on schedule.
            time.sleep(max(0.005, t0 + pace_s * (r + 1) / ranks - time.monotonic()))
    sock.close()
    ctx.term()
    return {"forged_ranks_sent": sent, "kernels_frames_sent": big, "kernels_frame_mb": kernel_mb,
            "send_s": time.monotonic() - t0}


# --- the monitor and its UI -----------------------------------------------------------------------

def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _ms(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50": _pct(xs, 0.5) and 1000 * _pct(xs, 0.5), "p99": _pct(xs, 0.99) and 1000 * _pct(xs, 0.99),
            "max": 1000 * max(xs) if xs else None}


async def _presses(app: Any, stamps: list[float], until: Any, every_s: float = 0.1) -> list[float]:
    """Press F9 every ``every_s`` while ``until()`` (as the terminal driver hands a key to the
    app); each press's delay until its action ran."""
    from textual import events

    out: list[float] = []
    while until():
        n = len(stamps)
        t = time.perf_counter()
        key = events.Key("f9", None)
        key.set_sender(app)
        app._driver.send_message(key)
        deadline = time.perf_counter() + 30
        while len(stamps) == n and time.perf_counter() < deadline:
            await asyncio.sleep(0.001)
        if len(stamps) > n:
            out.append(stamps[n] - t)
        await asyncio.sleep(every_s)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from flowtop.tui.app import FlowtopApp
    from flowtop.monitor.collector import Collector
    from flowtop.tools.demo.launch import free_port_pair
    from flowtop.monitor.wiring import make_model

    from flowtop.tui.screens.main_screen import MainScreen

    renders: list[float] = []  # seconds the UI thread spent rendering each snapshot (main screen)
    show = MainScreen.show

    def timed_show(self: Any, snap: Any) -> None:
        t = time.perf_counter()
        show(self, snap)
        renders.append(time.perf_counter() - t)

    MainScreen.show = timed_show  # type: ignore[method-assign]
    import gc

    gcs: list[tuple[int, float]] = []  # (generation, seconds) of each collection: it stops every thread
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gcs.append((info["generation"], time.perf_counter() - gc_start[0]))

    gc.callbacks.append(on_gc)
    if args.gc_default:
        gc.set_threshold(700, 10, 10)  # CPython's defaults, for comparison
    else:
        try:
            from flowtop.monitor import gcpolicy
        except ImportError:  # an older monitor
            gc.set_threshold(700, 10, 10)
        else:
            gcpolicy.for_monitor()  # as flowtop top does
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    collector = Collector(make_model(), listen)
    app = FlowtopApp(collector, refresh_s=0.5)
    stamps: list[float] = []
    # A key bound on the app, whatever screen is up: its action only notes when it ran.
    app.action_bench_ping = lambda: stamps.append(time.perf_counter())  # type: ignore[attr-defined]
    lags: list[float] = []
    out: dict[str, Any] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        app.bind("f9", "bench_ping", show=False)
        last = [time.perf_counter()]

        def beat() -> None:
            now = time.perf_counter()
            lags.append(max(0.0, now - last[0] - 0.02))
            last[0] = now

        app.set_interval(0.02, beat)
        await pilot.pause(1.0)
        t_end = time.monotonic() + 3.0
        before = await _presses(app, stamps, lambda: time.monotonic() < t_end)
        lags_before, lags[:] = list(lags), []
        renders_before, renders[:] = list(renders), []
        gcs[:] = []
        cmd = [sys.executable, __file__, "--send", listen, "--ranks", str(args.ranks), "--kernels",
               str(args.kernels), "--kernel-mb", str(args.kernel_mb)]
        data = getattr(app, "data", None)  # None: a monitor from before the data thread (all on the UI loop)
        put0, delivered0 = (data.mailbox.put_count, app.delivered) if data else (0, 0)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        t_flood = time.monotonic()
        deadline = t_flood + args.seconds
        during = await _presses(app, stamps, lambda: time.monotonic() < deadline)
        flooding = proc.poll() is None  # the keys above were pressed while it still sent
        sent = json.loads(proc.communicate(timeout=120)[0])
        final = data.call(collector.snapshot).result(60) if data else collector.snapshot()
        out = {
            "flood": sent,
            "flood_window_s": args.seconds,
            "flooder_still_sending_at_the_end": flooding,
            "key_latency_ms_before": _ms(before),
            "key_latency_ms_during": _ms(during),
            "ui_loop_lag_ms_before": _ms(lags_before),
            "ui_loop_lag_ms_during": _ms(lags),
            "ui_render_ms_before": _ms(renders_before),
            "ui_render_ms_during": _ms(renders),
            "gc_pauses_ms_during_gen2": _ms([d for g, d in gcs if g == 2]),
            "gc_pauses_ms_during_all": _ms([d for _, d in gcs]),
            "monitor_received": final.received,
            "monitor_rejected": final.rejected,
            "rejected_reasons_top": dict(sorted(final.rejected_reasons.items(), key=lambda kv: -kv[1])[:4]),
            "ranks_in_snapshot": sum(len(j.ranks) for j in final.jobs),
            "snapshots_made": data.mailbox.put_count - put0 if data else None,
            "snapshots_rendered": app.delivered - delivered0 if data else None,
            "snapshots_dropped_latest_wins": data.mailbox.dropped if data else None,
            "ticks_skipped_behind": collector.ticker.skipped if getattr(collector, "ticker", None) else None,
            "kernel_windows_built": collector.kernel_worker.built if collector.kernel_worker else None,
        }
        await pilot.press("q")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=100_000)
    ap.add_argument("--kernels", type=int, default=12)
    ap.add_argument("--kernel-mb", type=float, default=7.4)
    ap.add_argument("--seconds", type=float, default=20.0, help="how long keys are pressed once the flood starts")
    ap.add_argument("--gc-default", action="store_true", help="CPython's GC thresholds, not the monitor's")
    ap.add_argument("--send", default=None, metavar="ADDR", help="only flood ADDR and print what was sent")
    ap.add_argument("--pace-s", type=float, default=0.0, help="with --send: spread the flood over this long")
    ap.add_argument("--linger-s", type=float, default=120.0, help="with --send: wait this long at most for delivery")
    args = ap.parse_args()
    if args.send:
        print(json.dumps(flood(args.send, args.ranks, args.kernels, args.kernel_mb, args.pace_s, args.linger_s)))
        return 0
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
