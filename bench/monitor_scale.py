"""Monitor at scale: many simulated ranks publishing steps into one real collector.

    python bench/monitor_scale.py --ranks 256 --rate 10 --seconds 10

Each simulated rank is a real probe :class:`probe.transport.publisher.Publisher` (its own XPUB
connection, its own sender thread) sending ``step`` messages at ``--rate`` Hz; they
live in ``--procs`` worker processes. The collector runs in this process on its own
asyncio loop. Prints one JSON object: messages received vs sent (the ratio), rejected,
the monitor's CPU seconds per 1000 messages, and the time to build a snapshot (what the
UI does twice a second) for that many ranks.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def _worker(listen: str, first_rank: int, count: int, world: int, rate: float, seconds: float, out: "mp.Queue[int]") -> None:
    from probe.transport.publisher import Publisher
    from probe.wire import RankKey

    pubs = []
    for r in range(first_rank, first_rank + count):
        p = Publisher(RankKey("scale", f"host{r // 8}", 10_000 + r, r, 0), listen, max_age_s=5.0, world_size=world)
        p.hello_fields = {"local_rank": r % 8, "world_size": world, "device": "sim", "probe_version": "bench"}
        p.start()
        pubs.append(p)
    time.sleep(2.0)  # connections and subscriptions settle
    sent = 0
    step = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        step += 1
        for p in pubs:
            p.publish("step", {"step": step, "wall_s": 1.0 / rate, "tokens": 4096, "drops": 0})
            sent += 1
        time.sleep(max(0.0, t0 + step / rate - time.monotonic()))
    for p in pubs:
        p.publish("bye", {"reason": "exit", "steps": step, "drops": p.drops})
    for p in pubs:
        p.close(timeout_s=2.0)
    out.put(sent)


def main() -> int:
    """Run the scale benchmark and print JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rate", type=float, default=10.0, help="steps per second per rank")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    import resource

    from monitor_thread import MonitorThread

    monitor = MonitorThread()
    per = -(-args.ranks // args.procs)
    ctx = mp.get_context("spawn")  # no fork of a process that runs a zmq context
    queue = ctx.Queue()
    procs = []
    for i in range(args.procs):
        n = min(per, args.ranks - i * per)
        if n > 0:
            p = ctx.Process(target=_worker, args=(monitor.listen, i * per, n, args.ranks, args.rate, args.seconds, queue))
            p.start()
            procs.append(p)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    sent = sum(queue.get(timeout=args.seconds + 120) for _ in procs)
    for p in procs:
        p.join(30)
    time.sleep(1.0)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    snap_times = []
    for _ in range(5):
        t = time.perf_counter()
        snap = monitor.snapshot()
        snap_times.append(time.perf_counter() - t)
    monitor.close()
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    all_ranks = [r for j in snap.jobs for r in j.ranks]
    ranks = len(all_ranks)
    print(json.dumps({
        "ranks": args.ranks,
        "ranks_seen": ranks,
        "rate_hz_per_rank": args.rate,
        "step_messages_sent": sent,
        "messages_received": snap.received,
        "lost_in_transit": sum(r.lost_messages for r in all_ranks),  # sequence-number gaps
        "dropped_by_probes": sum(r.dropped_messages for r in all_ranks),
        "ranks_done": sum(r.status == "done" for r in all_ranks),
        "rejected": snap.rejected,
        "monitor_cpu_s_per_1000_msgs": 1000 * cpu / max(1, snap.received),
        "snapshot_build_ms_median": 1000 * statistics.median(snap_times),
        "note": "received = steps + hellos (every 2 s per rank) + byes; CPU is this whole process",
    }, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
