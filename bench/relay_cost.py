#!/usr/bin/env python
"""A node relay's own cost: instructions per frame forwarded and per idle second, its wake-ups,
and a digest of everything it sends up and down (for before/after equivalence).

    python bench/relay_cost.py --seconds 30 --callgrind            # 1 relay (flowtop relay), live mix
    python bench/relay_cost.py --seconds 30 --callgrind --idle     # the same relay with no frames
    python bench/relay_cost.py --relays 32 --seconds 20            # 32 relays of one host process
    python bench/relay_cost.py --seconds 20 --hostile --digest     # equivalence: digest of all it sent
    ... --tree /path/to/other/checkout                             # run the relay from another tree (base)

This process plays the node's ranks and the monitor: ``--relays`` x 8 bare rank sockets (the
probe's upstream options) behind ``--relays`` real :class:`flowtop.tools.relay.Relay` instances
hosted in a child process as ``bench/ingest.py --relay-host threads`` hosts them (their own
threads; one shared ZeroMQ context when more than one, as ``flowtop relay`` has its own), and an
XSUB bound where the relays connect, subscribed as a monitor. Once every rank is subscribed
(the relays mirror the monitor's presence), a seeded schedule sends, per rank, the live mix of a
4,096-rank job at the 2 s pace: a 200-record ``stepcols`` frame every 2 s, telemetry every
4.5-10 s, a hello and a FLOP count every 30 s, a kernel window (80 KB) at random times (about one
per relay per 40 s); the monitor side sends a pace command every 10 s. ``--hostile`` adds, per
relay: empty frames, garbage, two-part messages, frames that look like subscriptions, and
malformed, empty and oversized commands from upstream.

``--callgrind``: the child runs under ``valgrind --tool=callgrind`` and counts only the window
(its stats are zeroed when the schedule starts and dumped when it ends, through a client request
compiled on first use): all its threads, libzmq's I/O thread included. Per frame =
(Ir of a live run - Ir of an ``--idle`` run of the same length) / frames forwarded; per idle second
= Ir of the idle run / seconds. Without it the child reports its threads' context switches over
the window (/proc/self/task/*/status: a voluntary switch is a sleep, so one per wake-up).
``--digest``: a sha256 over, per relay, the rank frames it sent upstream in order (every batch's
parts; the stamp checked to hold one age per part), its closing report's counts (less its id,
addresses, uptime and times) and, per rank, every message that came down to it.

Also: ``--wrap "strace -c -f -o FILE"`` (the relays' process's syscalls); RELAY_COST_PROFILE=FILE
(a cProfile of the first relay's thread); RELAY_COST_VG_ARGS (more valgrind options).
Figures (2-core VM, 2026-12-07, 1 relay, 30 s, 170 frames): 140k -> 77k instructions a frame,
222k -> 185k an idle second (base 22ed720 -> c8e99d6 in main); memcpy counts ~1 instruction a byte
under valgrind (rep movsb), ~10k of each frame's (two copies of ~4.6 KB, before and after alike).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
PER_RELAY = 8
CG_SRC = r"""
#include <valgrind/callgrind.h>
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(void) { CALLGRIND_DUMP_STATS_AT("window"); }
"""


def _cg_lib() -> Any:
    """The callgrind client requests (a no-op outside valgrind)."""
    path = os.path.join(tempfile.gettempdir(), f"relay_cost_cg_{os.getuid()}.so")
    if not os.path.exists(path):
        src = path[:-3] + ".c"
        with open(src, "w") as f:
            f.write(CG_SRC)
        subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", path, src], check=True)
    return ctypes.CDLL(path)


def _switches() -> dict[str, list[int]]:
    """Context switches per thread name: [threads, voluntary, involuntary]."""
    out: dict[str, list[int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/status") as f:
                st = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        except OSError:
            continue
        row = out.setdefault(name, [0, 0, 0])
        row[0] += 1
        row[1] += int(st["voluntary_ctxt_switches"])
        row[2] += int(st["nonvoluntary_ctxt_switches"])
    return out


def host(listens: list[str], upstream: str) -> int:
    """The child: the relays, as ingest's --relay-host threads hosts them; 'start'/'stop' on stdin
    bound the window."""
    import threading

    import zmq

    from flowtop.tools.relay import Relay, RelayConfig

    cg = _cg_lib()
    ctx = zmq.Context() if len(listens) > 1 else None
    relays = [Relay(RelayConfig(addr, upstream, hosted_by="bench"), context=ctx) for addr in listens]
    prof = os.environ.get("RELAY_COST_PROFILE")  # a cProfile of the first relay's thread, to this file
    threads = [threading.Thread(target=r.run, daemon=True) for r in relays]
    if prof:
        import cProfile

        profiler = cProfile.Profile()
        threads[0] = threading.Thread(target=profiler.runcall, args=(relays[0].run,), daemon=True)
    for t in threads:
        t.start()
    for r in relays:
        r.ready.wait()
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "start"
    s0, w0, c0 = _switches(), sum(r.wakes for r in relays), os.times()
    cg.cg_zero()
    assert sys.stdin.readline().strip() == "stop"
    cg.cg_dump()
    s1, w1, c1 = _switches(), sum(r.wakes for r in relays), os.times()
    for r in relays:
        r.stop()
    for t in threads:
        t.join(10)
    if ctx is not None:
        ctx.term()
    if prof:
        profiler.dump_stats(prof)
    sw = {k: [v[0], v[1] - s0.get(k, [0, 0, 0])[1], v[2] - s0.get(k, [0, 0, 0])[2]] for k, v in s1.items()}
    print(json.dumps({"switches": sw, "loop_wakes": w1 - w0, "user_s": round(c1.user - c0.user, 3),
                      "sys_s": round(c1.system - c0.system, 3),
                      "frames_out": sum(r.frames_out for r in relays)}), flush=True)
    return 0


# --- the schedule ---------------------------------------------------------------------------------


def _frames(relays: int, seconds: float, hostile: bool, idle: bool,
            seed: int = 7) -> list[tuple[float, int, list[bytes]]]:
    """(time, rank socket, parts) sorted by time: the live mix (see the module's docstring)."""
    sys.path.insert(0, BENCH)
    import ingest

    from probe import wire

    rng = random.Random(seed)
    tpl = ingest._templates()
    cols = ingest._Columns(0.01, rng)
    out: list[tuple[float, int, list[bytes]]] = []
    if idle:
        return out
    for r in range(relays * PER_RELAY):
        key = wire.RankKey("cost", f"node{r // PER_RELAY}", 30_000 + r, r, 0)
        seq = 0
        events: list[tuple[float, str]] = []
        t = rng.uniform(0, 2.0)
        while t < seconds:
            events.append((t, "stepcols"))
            t += 2.0
        t = rng.uniform(0, 4.5)
        while t < seconds:
            events.append((t, "telemetry"))
            t += rng.uniform(4.5, 10.0)
        t = rng.uniform(0, 30.0)
        while t < seconds:
            events += [(t, "hello"), (t + 0.001, "flops")]
            t += 30.0
        if rng.random() < seconds / 40.0 / PER_RELAY:
            events.append((rng.uniform(0, seconds), "kernels"))
        for t, kind in sorted(events):
            if kind == "stepcols":
                a = 1 + 200 * seq
                fields = cols.fields(a, a + 199)
            else:
                fields = tpl[kind]
            out.append((t, r, [wire.encode(kind, key, seq, 1.7e9 + t, fields)]))
            seq += 1
        if hostile:
            for i, parts in enumerate(([b""], [rng.randbytes(rng.randint(1, 300))], [b"\x01", b"\x00abc"],
                                       [b"\x01"], [b"\x00"], [rng.randbytes(5000), b"tail"], [rng.randbytes(100_000)])):
                out.append((seconds * (i + 1) / 8 + rng.uniform(0, 0.5), r, parts))
    out.sort(key=lambda e: (e[0], e[1]))
    return out


def _commands(seconds: float, hostile: bool, idle: bool) -> list[tuple[float, bytes]]:
    from probe import wire

    out = [] if idle else [(t + 0.5, wire.encode_control("pace", None, None, 0.4 + 0.05 * (i % 2), 4.5))
                           for i, t in enumerate(range(0, int(seconds), 10))]
    if hostile:
        out += [(seconds * 0.3, b""), (seconds * 0.4, b"not msgpack"), (seconds * 0.5, b"x" * 5000),
                (seconds * 0.6, wire.encode_control("kernels", "cost", 3)), (seconds * 0.7, b"\x92\x01\x02")]
    return sorted(out)


def _streams(frames: list[bytes]) -> list[tuple[bytes, list[bytes]]]:
    """A relay's upstream frames as (rank, its frames in order), sorted; b"?" for those that
    name no rank (malformed), sorted themselves."""
    from probe import wire

    by: dict[bytes, list[bytes]] = {}
    for p in frames:
        try:
            key = repr(tuple(wire.envelope(p).key)).encode()
        except wire.WireError:
            key = b"?"
        by.setdefault(key, []).append(p)
    if b"?" in by:
        by[b"?"].sort()
    return sorted(by.items())


# --- the driver -----------------------------------------------------------------------------------


def drive(args: argparse.Namespace) -> dict[str, Any]:
    import zmq

    sys.path.insert(0, ROOT)
    from flowtop.monitor.relays import decode_stamp
    from probe import wire
    from probe.wire.link import upstream_options

    tmp = tempfile.mkdtemp(prefix="rcost")
    ctx = zmq.Context()
    mon = ctx.socket(zmq.XSUB)
    mon.setsockopt(zmq.LINGER, 0)
    port = mon.bind_to_random_port("tcp://127.0.0.1")
    upstream = f"tcp://127.0.0.1:{port}"
    mon.send(b"\x01")
    listens = [f"ipc://{tmp}/r{i}.sock" for i in range(args.relays)]
    cmd = [sys.executable, os.path.abspath(__file__), "--host", ",".join(listens), "--upstream", upstream]
    cg_out = os.path.join(tmp, "cg.out")
    if args.callgrind:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg_out}",
               *os.environ.get("RELAY_COST_VG_ARGS", "").split(), *cmd]  # e.g. --separate-threads=yes
    elif args.wrap:  # e.g. "strace -c -f -o FILE": the syscalls of the relays' process (its startup too)
        cmd = [*args.wrap.split(), *cmd]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(args.tree), FLOWTOP_DISABLE="1")
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                             stderr=subprocess.DEVNULL if args.callgrind else None)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    ranks = []
    for r in range(args.relays * PER_RELAY):
        s = ctx.socket(zmq.XPUB)
        for name, value in upstream_options(upstream, random.Random(r)):
            s.setsockopt(getattr(zmq, name), value)
        s.connect(listens[r // PER_RELAY])
        ranks.append(s)
    poller = zmq.Poller()
    poller.register(mon, zmq.POLLIN)
    for s in ranks:
        poller.register(s, zmq.POLLIN)
    downs: list[list[bytes]] = [[] for _ in ranks]
    ups: list[list[bytes]] = [[] for _ in listens]
    closing: list[dict[str, Any]] = []
    by_id: dict[str, int] = {}
    bad_stamps = [0]

    def take(timeout_ms: int) -> None:
        for sock, _ in poller.poll(timeout_ms):
            while True:
                try:
                    parts = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if sock is not mon:
                    downs[ranks.index(sock)].append(b"|".join(parts))
                    continue
                stamp = decode_stamp(parts[0], len(parts) - 1)
                j = by_id.setdefault(stamp.relay, len(by_id))
                if len(stamp.ages_us) != len(parts) - 1:
                    bad_stamps[0] += 1
                for p in parts[1:]:
                    msg = None
                    try:
                        msg = wire.decode(p)
                    except wire.WireError:
                        pass
                    if msg is not None and msg.kind == "relay":
                        if msg.fields.get("closing"):
                            closing.append({k: v for k, v in msg.fields.items()
                                            if k not in ("relay", "listen", "upstream", "uptime_s")})
                        continue
                    ups[j].append(p)

    t_end = time.monotonic() + 30.0
    while sum(len(d) for d in downs) < len(ranks) and time.monotonic() < t_end:  # every rank subscribed
        take(100)
    settle = time.monotonic() + args.warmup
    while time.monotonic() < settle:
        take(100)
    frames = _frames(args.relays, args.seconds, args.hostile, args.idle)
    cmds = _commands(args.seconds, args.hostile, args.idle)
    sent = 0
    child.stdin.write("start\n")
    child.stdin.flush()
    t0 = time.monotonic()
    i = k = 0
    while True:
        now = time.monotonic() - t0
        while i < len(frames) and frames[i][0] <= now:
            ranks[frames[i][1]].send_multipart(frames[i][2])
            sent += len(frames[i][2])
            i += 1
        while k < len(cmds) and cmds[k][0] <= now:
            mon.send(cmds[k][1])
            k += 1
        if now >= args.seconds:
            break
        nxt = min(frames[i][0] if i < len(frames) else args.seconds, cmds[k][0] if k < len(cmds) else args.seconds)
        take(max(0, int((nxt - now) * 1000)))
    child.stdin.write("stop\n")
    child.stdin.flush()
    stats = json.loads(child.stdout.readline())
    end = time.monotonic() + 3.0
    while len(closing) < args.relays and time.monotonic() < end:
        take(100)
    child.wait(60)
    end = time.monotonic() + 1.0  # what their closing does downstream (the ranks' unsubscriptions)
    while time.monotonic() < end:
        take(100)
    for s in [*ranks, mon]:
        s.close(0)
    ctx.term()
    out: dict[str, Any] = {"relays": args.relays, "seconds": args.seconds, "idle": args.idle, "hostile": args.hostile,
                           "parts_sent": sent, "frames_up": sum(len(u) for u in ups), "bad_stamps": bad_stamps[0],
                           **stats}
    if args.callgrind:
        out["Ir"] = 0
        for name in sorted(os.listdir(tmp)):  # the window's dump: one file, or one a thread (-01, -02, ...)
            if name.startswith("cg.out.1"):
                with open(os.path.join(tmp, name)) as f:
                    ir = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
                out["Ir"] += ir
                out.setdefault("Ir_files", {})[os.path.join(tmp, name)] = ir
    if args.digest:
        # Per relay, each rank's frames in order (frames of different ranks interleave as they
        # reach the relay's socket, by timing) and the frames that name no rank as a multiset.
        h, parts_h = hashlib.sha256(), {}
        for u in sorted(ups, key=_streams):
            h.update(b"relay")
            for name, frames in _streams(u):
                h.update(name + b":" + b"".join(len(p).to_bytes(4, "little") + p for p in frames))
        parts_h["up"] = h.hexdigest()
        reports = sorted(json.dumps(c, sort_keys=True) for c in closing)
        parts_h["closing"] = hashlib.sha256(json.dumps(reports).encode()).hexdigest()
        parts_h["down"] = hashlib.sha256(b"rank".join(b"#".join(d) for d in downs)).hexdigest()
        out["digest"] = hashlib.sha256(json.dumps(parts_h, sort_keys=True).encode()).hexdigest()
        out["digests"] = parts_h
        out["closing"] = closing
        if args.dump:
            with open(args.dump, "wb") as f:
                import pickle

                pickle.dump({"ups": ups, "downs": downs, "closing": closing}, f)
        out["closing"] = closing
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relays", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--idle", action="store_true", help="no frames and no commands (the idle cost)")
    ap.add_argument("--hostile", action="store_true")
    ap.add_argument("--digest", action="store_true")
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--wrap", help="a command the relays' process runs under (not with --callgrind)")
    ap.add_argument("--dump", help="--digest: also pickle what it compared to this file")
    ap.add_argument("--tree", default=ROOT, help="source tree the relay runs from")
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.host:
        return host(args.host.split(","), args.upstream)
    print(json.dumps(drive(args)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
