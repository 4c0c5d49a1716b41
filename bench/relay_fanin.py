"""Relay fan-in: many simulated ranks into one real collector, directly and through node relays.

    python bench/relay_fanin.py --ranks 1024 --rate 10 --per-relay 8 --seconds 10

A lean simulator: each worker process holds many ranks as bare XPUB sockets (no thread per
rank) and sends each a ``step`` frame ``--rate`` times a second (10/s is a probe that batches
its steps). ``direct`` connects every rank to the collector; ``relay`` puts them behind real
:class:`flowtop.tools.relay.Relay` instances of ``--per-relay`` ranks each, hosted ``--relays-per-proc``
to a process. The collector runs in this process (which does nothing else), so this process's
CPU time is the monitor's. Prints one JSON line per mode: frames delivered %, connections at the
monitor, monitor CPU % of one core and µs per frame, relay CPU % (all relays), and the sampled
arrival latency from a rank's send to the collector's receive (p50/p99, ms).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def _ranks(addrs: list[str], first: int, rate: float, seconds: float, out: "mp.Queue[int]") -> None:
    import zmq

    from probe import wire

    ctx = zmq.Context()
    socks = []
    for i, addr in enumerate(addrs):
        s = ctx.socket(zmq.XPUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.SNDHWM, 1000)
        s.connect(addr)
        socks.append((s, wire.RankKey("fanin", f"node{(first + i) // 8}", 20_000 + first + i, first + i, 0)))
    time.sleep(3.0)  # connections and subscriptions settle
    sent, step, t0 = 0, 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        step += 1
        for s, key in socks:
            frame = wire.encode("step", key, step - 1, time.time(), {"step": step, "wall_s": 0.1, "tokens": 4096, "drops": 0})
            try:
                s.send(frame, zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass
        time.sleep(max(0.0, t0 + step / rate - time.monotonic()))
    time.sleep(1.0)  # the relays' last batches
    out.put(sent)
    for s, _ in socks:
        s.close(0)
    ctx.term()


def _relays(listens: list[str], upstream: str, seconds: float, out: "mp.Queue[tuple[int, int, float]]") -> None:
    from flowtop.tools.relay import Relay, RelayConfig

    relays = [Relay(RelayConfig(addr, upstream)) for addr in listens]
    threads = [threading.Thread(target=r.run, daemon=True) for r in relays]
    for t in threads:
        t.start()
    c0 = time.process_time()
    time.sleep(seconds)
    cpu = time.process_time() - c0
    out.put((sum(r.frames_in for r in relays), sum(r.drops for r in relays), cpu))
    for r in relays:
        r.stop()
    for t in threads:
        t.join(5)


def run(mode: str, ranks: int, rate: float, per_relay: int, relays_per_proc: int, procs: int, seconds: float) -> dict:
    import psutil
    from monitor_thread import MonitorThread

    from probe import wire

    mon = MonitorThread()
    col = mon.collector
    lat: list[float] = []
    seen = [0]
    handle = col.handle_frame

    def sampled(frame: bytes, now: float, *rest: object) -> None:  # every 64th frame: its latency
        seen[0] += 1
        if seen[0] % 64 == 0:
            try:
                lat.append(time.time() - wire.decode(frame).sent_at)
            except wire.WireError:
                pass
        handle(frame, now, *rest)  # type: ignore[arg-type]

    col.handle_frame = sampled  # type: ignore[method-assign]
    tmp = tempfile.mkdtemp(prefix="ftb")
    addrs = [mon.listen] * ranks
    relay_q: "mp.Queue[tuple[int, int, float]]" = mp.Queue()
    relay_procs = []
    if mode == "relay":
        listens = [f"ipc://{tmp}/r{i}.sock" for i in range((ranks + per_relay - 1) // per_relay)]
        addrs = [listens[i // per_relay] for i in range(ranks)]
        for i in range(0, len(listens), relays_per_proc):
            p = mp.Process(target=_relays, args=(listens[i:i + relays_per_proc], mon.listen, seconds + 6.0, relay_q))
            p.start()
            relay_procs.append(p)
        time.sleep(1.0)
    q: "mp.Queue[int]" = mp.Queue()
    chunk = (ranks + procs - 1) // procs
    workers = [mp.Process(target=_ranks, args=(addrs[i:i + chunk], i, rate, seconds, q)) for i in range(0, ranks, chunk)]
    for w in workers:
        w.start()
    time.sleep(3.0)
    me = psutil.Process()
    port = int(mon.listen.rsplit(":", 1)[1])
    cpu0, t0 = me.cpu_times(), time.monotonic()
    time.sleep(seconds / 2)
    conns = sum(1 for c in me.net_connections(kind="tcp")
                if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)
    sent = sum(q.get(timeout=seconds + 60) for _ in workers)
    cpu1, t1 = me.cpu_times(), time.monotonic()
    time.sleep(1.0)
    snap = mon.snapshot()
    # Rank frames received: each rank numbers its frames (a gap is a frame lost).
    got = mon.call(lambda: sum(st.last_seq + 1 - st.lost for st in col.model.ranks.values()))
    relay_stats = [relay_q.get(timeout=30) for _ in relay_procs]
    for p in [*workers, *relay_procs]:
        p.join(30)
    mon.close()
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    lat.sort()
    return {
        "mode": mode, "ranks": ranks, "rate_per_rank": rate, "relays": (ranks + per_relay - 1) // per_relay if mode == "relay" else 0,
        "frames_sent": sent, "delivered_pct": round(100.0 * min(got, sent) / max(1, sent), 2),
        "monitor_connections": conns, "monitor_cpu_pct": round(100.0 * cpu / (t1 - t0), 1),
        "monitor_us_per_frame": round(1e6 * cpu / max(1, got), 1),
        "relay_cpu_pct_all": round(100.0 * sum(s[2] for s in relay_stats) / (seconds + 6.0), 1) if relay_stats else None,
        "relay_drops": sum(s[1] for s in relay_stats) if relay_stats else None,
        "latency_ms_p50": round(1e3 * statistics.median(lat), 1) if lat else None,
        "latency_ms_p99": round(1e3 * lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--rate", type=float, default=10.0, help="frames per second per rank")
    ap.add_argument("--per-relay", type=int, default=8)
    ap.add_argument("--relays-per-proc", type=int, default=16)
    ap.add_argument("--procs", type=int, default=2, help="simulator processes")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--modes", default="direct,relay")
    args = ap.parse_args()
    os.environ.setdefault("FLOWTOP_DISABLE", "1")
    for mode in args.modes.split(","):
        print(json.dumps(run(mode, args.ranks, args.rate, args.per_relay, args.relays_per_proc, args.procs, args.seconds)),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
