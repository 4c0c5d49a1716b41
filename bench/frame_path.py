"""The live receive path's cost per frame: relay batches through the collector's own drain loop.

    python bench/frame_path.py                       # µs per frame (CPU time of the drain loop)
    python bench/frame_path.py --digest              # and a digest of what the monitor made of them
    valgrind --tool=callgrind --toggle-collect=starmap_next python bench/frame_path.py --callgrind

What ``bench/ingest.py`` runs live at 4,096 ranks × 10 ms through relays of 8 ranks, minus the
simulator's processes, the sockets' TCP and the ticks: the frames its simulated relays send in the
steady state at the wire's 2 s pace (a 200-record step frame a rank every 2 s, telemetry every
10 s, a hello and a FLOP count every 30 s, an 80 KB kernel window every 120 s, a relay report every
5 s), in ``[stamp, frame, ...]`` batches of the frames a relay took in the same millisecond, made
in virtual time from one seed. They go through a real XPUB → XSUB pair (inproc: a message sent is
readable at once, so every drain reads the same batches) into the real
``Collector._drain_forever``: its wait, its non-blocking receives, ``handle_batch`` (the stamp,
``Relays.unstamp``), ``handle_frame`` (decode, ingest), ``catch_up`` (pacing, the descriptor
check, hello asks) and its busy accounting. While it waits, the loop delivers the batches sent
within ``--drain-ms`` of virtual time (live, a drain reads what came during the one before: a few
batches between frames, hundreds after a tick or the UI's turn). What is left out: ticks (a
schedule that never comes due: they are measured apart, ``bench/ingest.py --costs``), the kernel
window builder (windows are handed to a no-op, as to the worker process live), TCP's share of
libzmq's receive.

The monitor's clock, the busy meter's and the drain loop's timers read the virtual clock, so the
pacing decisions, and with them the whole run, are deterministic (``--digest`` hashes the snapshots
of a round of ticks after the run, its refusals and the paces it asked: two code versions that
agree make the same digest). Under callgrind (``--callgrind``), only the measured drains count:
they run inside ``itertools.starmap`` (the toggle), the harness's own feeding of the socket inside
``itertools.dropwhile`` (toggled off again).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import hashlib
import heapq
import itertools
import json
import os
import random
import sys
import time
import types
from typing import Any, Callable

sys.path.insert(0, os.getcwd())  # the code version under test: the working directory's
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import zmq  # noqa: E402

import ingest as B  # noqa: E402  (bench/ingest.py: the simulator's templates and intervals)

sys.path.insert(0, os.getcwd())  # again: ingest put its own checkout first (no flowtop imported yet)

WALL0 = 1.8e9  # the ranks' wall clock at virtual time 0
MONO0 = 1000.0  # the relays' and the monitor's monotonic clock at virtual time 0
ADDR = "inproc://frame-path"


class Done(Exception):
    """Every batch was fed and drained."""


def schedule(ranks: int, step_ms: float, pace_s: float, until: float, seed: int) -> list[tuple[float, int, bytes]]:
    """Every frame the ranks and their relays send before ``until`` (virtual s): (time, relay, frame)."""
    from probe import wire

    rng = random.Random(seed)
    tpl = B._templates()
    step_s = step_ms / 1e3
    columns = B._Columns(step_s, rng)
    keys = [wire.RankKey(B.JOB, f"node{r // 8:04d}", 10_000 + r, r, 0) for r in range(ranks)]
    seq, last = [0] * ranks, [0] * ranks
    hello = {**tpl["hello"], "world_size": ranks, "argv": ["train.py"]}
    tel, flops, kern = tpl["telemetry"], tpl["flops"], tpl["kernels"]
    every = {"flush": pace_s, "telemetry": B._telemetry_s(pace_s, B._paced_telemetry_s()),
             "hello": B._hello_max_s(pace_s, 10.0), "flops": 30.0, "kernels": 120.0}
    heap: list[tuple[float, int, str]] = []
    for i in range(ranks):  # a hello and a FLOP count first (a rank the monitor knows), the rest at random phases
        start = 0.5 * rng.random()
        heap += [(start, i, "hello0"), (start + 1e-3, i, "flops0")]
        heap += [(start + 2e-3 + every[k] * rng.random(), i, k) for k in every]
    relays = (ranks + 7) // 8
    report_s = B._relay_report_s(pace_s)
    heap += [(report_s * rng.random(), -1 - j, "relay") for j in range(relays)]
    heapq.heapify(heap)
    out: list[tuple[float, int, bytes]] = []
    relay_seq = 0
    while heap[0][0] < until:
        t, i, kind = heapq.heappop(heap)
        if kind == "relay":
            j = -1 - i
            relay_seq += 1
            fields = {"relay": f"sim-{j}", "listen": "sim", "upstream": ADDR, "ranks": 8, "frames_in": 0,
                      "frames_out": 0, "bytes_in": 0, "bytes_out": 0, "drops": 0, "queued": 0, "commands": 0,
                      "link_ups": 1, "uptime_s": t, "closing": False, "hosted_by": "bench"}
            out.append((t, j, wire.encode("relay", wire.RankKey("", "sim", 20_000, 0, 0), relay_seq, WALL0 + t,
                                          fields)))
            heapq.heappush(heap, (t + report_s, i, kind))
            continue
        if kind == "flush":
            k_now = min(int(t / step_s), last[i] + wire.MAX_BATCH)
            fields = {**columns.fields(last[i] + 1, k_now), "_sent": WALL0 + t}
            kind_sent, at = "stepcols", WALL0 + (last[i] + 1) * step_s
            last[i] = k_now
        elif kind == "telemetry":
            kind_sent, at = kind, WALL0 + t
            fields = {**tel, "gpu": {**tel["gpu"], "power_w": 500.0 + 100 * rng.random(), "gpu_util": 100.0}}
        elif kind.startswith("hello"):
            kind_sent, at, fields = "hello", WALL0 + t, {**hello, "local_rank": i % 8}
        elif kind.startswith("flops"):
            kind_sent, at, fields = "flops", WALL0 + t, {**flops, "step": max(1, last[i])}
        else:
            kind_sent, at, fields = kind, WALL0 + t, {**kern, "step": max(1, last[i]), "window": seq[i]}
        out.append((t, i // 8, wire.encode(kind_sent, keys[i], seq[i], at, fields)))
        seq[i] += 1
        if kind in every:
            heapq.heappush(heap, (t + every[kind], i, kind))
    return out


def batches(frames: list[tuple[float, int, bytes]], slot_s: float) -> list[tuple[float, list[bytes]]]:
    """A relay's batches: the frames it took in the same ``slot_s``, sent at the slot's end, stamped
    as a relay stamps them (its id, its monotonic clock, each frame's age in µs)."""
    from flowtop.monitor.relays import encode_stamp

    held: dict[tuple[int, int], list[tuple[float, bytes]]] = collections.defaultdict(list)
    for t, relay, frame in frames:
        held[(int(t / slot_s), relay)].append((t, frame))
    out = []
    for (slot, relay), got in sorted(held.items()):
        sent = (slot + 1) * slot_s
        stamp = encode_stamp(f"sim-{relay}", MONO0 + sent, [int((sent - t) * 1e6) for t, _ in got])
        out.append((sent, [stamp, *(f for _, f in got)]))
    return out


class Feeder:
    """Sends the batches due by the virtual clock into the collector's socket while its drain loop waits."""

    def __init__(self, pub: Any, todo: list[tuple[float, list[bytes]]], drain_s: float) -> None:
        self.pub, self.todo, self.drain_s = pub, collections.deque(todo), drain_s
        self.now = 0.0
        self.sent = 0
        self.paces: list[bytes] = []  # what the monitor sent upstream (its paces, hello asks)
        self.polls = 0
        self.total = 0  # the batches to feed before the drain ends

    def feed(self, _: Any = None) -> bool:
        self.polls += 1
        while True:  # upstream: drained, kept for the digest
            try:
                self.paces.append(self.pub.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        if self.sent == self.total:
            return False
        self.now = max(self.now + self.drain_s, self.todo[0][0])
        while self.sent < self.total and self.todo[0][0] <= self.now:
            self.pub.send_multipart(self.todo.popleft()[1], zmq.NOBLOCK)
            self.sent += 1
        return False


def uncounted(fn: Callable[[], Any]) -> None:
    """Run ``fn`` inside itertools.dropwhile: callgrind's toggle (``dropwhile_next``) leaves it out."""
    collections.deque(itertools.dropwhile(lambda _: fn(), (0,)), maxlen=0)


def monitor(feeder: Feeder) -> tuple[Any, Any, Any]:
    """The collector, its model, and the inproc XPUB that plays the relays."""
    from flowtop.monitor import collector as C
    from flowtop.monitor.clock import MonitorClock
    from flowtop.monitor.pacing import BusyMeter
    from flowtop.monitor.ticker import Ticker
    from flowtop.monitor.wiring import make_model

    def vclock() -> float:
        return MONO0 + feeder.now

    model = make_model()
    model.offload_kernels(lambda key, window: None)  # the worker process's queue, live
    col = C.Collector(model, clock=MonitorClock(raw=vclock))
    C.time = types.SimpleNamespace(perf_counter=vclock)  # type: ignore[attr-defined]  # the drain's timers
    col.busy = BusyMeter(clock=vclock, cpu=vclock)
    sub = col._open_sockets()
    sub.bind(ADDR)
    col.ticker = Ticker(lambda at: model.tick(at, col.listen), vclock(), 1e9)  # never due: ticks apart
    pub = zmq.Context.shadow(col._ctx.underlying).socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.connect(ADDR)
    while not (pub.poll(10) and pub.recv()[:1] == b"\x01"):  # the collector's subscription: frames reach it
        sub.getsockopt(zmq.EVENTS)  # (the XSUB takes the connection in as it processes its commands)
    feeder.pub = pub
    # The batches come while the drain loop waits for them, as live (it waits after each drain
    # that read all there was): fed by a callback of the loop, which the wait yields to.
    owner, name = (col, "_wait_frames") if hasattr(col, "_wait_frames") else (sub, "poll")
    wait = getattr(owner, name)

    def fed_wait(*args: Any) -> Any:
        if feeder.sent == feeder.total:  # and the drain before read them all
            raise Done
        asyncio.get_event_loop().call_soon(uncounted, feeder.feed)
        return wait(*args)

    setattr(owner, name, fed_wait)
    return col, model, pub


def drain(col: Any, feeder: Feeder, upto: int) -> None:
    """Run the collector's own drain loop until ``upto`` batches were fed and read."""
    feeder.total = upto
    try:
        asyncio.get_event_loop().run_until_complete(col._drain_forever())
    except Done:
        pass


def digest(col: Any, model: Any, feeder: Feeder) -> str:
    """What the monitor made of the frames: a round of ticks' snapshots (every rank's full view),
    its refusals, relays and the paces and asks it sent upstream."""
    from flowtop.monitor.snapshot_json import to_json

    h = hashlib.sha256()
    now = col.clock.now()
    for k in range(max(1, model.spread)):
        snap = model.tick(now + 0.5 * k, col.listen)
        h.update(json.dumps(to_json(snap), sort_keys=True, default=repr).encode())
    h.update(repr(sorted(model.rejected_reasons.items())).encode())
    h.update(repr((model.received, model.rejected, model.spread)).encode())
    h.update(b"".join(feeder.paces))
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--pace-s", type=float, default=2.0, help="the monitor's pace the ranks keep")
    ap.add_argument("--warmup", type=float, default=2.5, help="virtual seconds before the measured ones")
    ap.add_argument("--seconds", type=float, default=2.0, help="virtual seconds measured")
    ap.add_argument("--drain-ms", type=float, default=5.0, help="virtual ms of batches each drain reads")
    ap.add_argument("--slot-ms", type=float, default=1.0, help="a relay batches what it took in this long")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--callgrind", action="store_true", help="print counts only (run under callgrind)")
    ap.add_argument("--digest", action="store_true")
    ap.add_argument("--direct", action="store_true", help="the measured frames' decode and ingest alone")
    ap.add_argument("--batches", action="store_true", help="Collector.handle_batch of each batch, no socket or loop")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the measured drains into FILE")
    ap.add_argument("--split", action="store_true", help="µs per frame: drain loop, batch calls, decode and ingest")
    args = ap.parse_args()
    if args.split:
        split([a for a in sys.argv[1:] if a != "--split"])
        return 0
    from flowtop.monitor import gcpolicy

    frames = schedule(args.ranks, args.step_ms, args.pace_s, args.warmup + args.seconds, args.seed)
    todo = batches(frames, args.slot_ms / 1e3)
    warm = sum(1 for t, _ in todo if t < args.warmup)  # batches
    from probe import wire

    kinds = collections.Counter(wire.envelope(frame).kind for t, _, frame in frames if t >= args.warmup)
    n_frames = sum(len(p) - 1 for t, p in todo if t >= args.warmup)
    feeder = Feeder(None, todo, args.drain_ms / 1e3)
    asyncio.set_event_loop(asyncio.new_event_loop())
    col, model, _ = monitor(feeder)
    gc.set_threshold(*gcpolicy.THRESHOLDS)
    drain(col, feeder, warm)
    gc.collect()
    gc.freeze()  # as the monitor's ticks leave it (gcpolicy.after_tick)
    polls0 = feeder.polls
    run = measured_run(args, col, model, feeder, frames, todo, warm)
    c0 = time.thread_time()
    if args.profile:
        import cProfile

        cProfile.runctx("run()", globals(), {"run": run}, args.profile)
    else:
        collections.deque(itertools.starmap(run, [()]), maxlen=0)  # callgrind counts inside starmap only
    cpu = time.thread_time() - c0
    out: dict[str, Any] = {"mode": mode(args), "frames": n_frames, "batches": len(todo) - warm,
                           "drains": feeder.polls - polls0, "kinds": dict(sorted(kinds.items())),
                           "received": model.received, "rejected": model.rejected}
    if not args.callgrind:
        out["us_per_frame"] = round(1e6 * cpu / n_frames, 1)
    if args.digest:
        out["digest"] = digest(col, model, feeder)
    print(json.dumps(out))
    return 0


def mode(args: argparse.Namespace) -> str:
    return "direct" if args.direct else "batches" if args.batches else "drain"


def measured_run(args: argparse.Namespace, col: Any, model: Any, feeder: Feeder, frames: list[tuple[float, int, bytes]],
                 todo: list[tuple[float, list[bytes]]], warm: int) -> Callable[[], None]:
    """The measured part: the drain loop (default), ``Collector.handle_batch`` of each batch
    (``--batches``: no socket, no loop) or each frame's decode and ingest alone (``--direct``: what
    docs/scale.md's earlier counts measured); what differs between them is the receive path's own."""
    col.clock.now()
    if args.direct:
        from flowtop.monitor.rankkernels import decode_frame

        direct = [(f, MONO0 + t, f"sim-{r}") for t, r, f in frames if t >= args.warmup]
        ingest, budget = model.ingest, col._kernel_budget

        def apply(frame: bytes, at: float, via: str) -> None:
            ingest(decode_frame(frame, model.builds_kernels, model.knows, budget), at, via)

        return lambda: collections.deque(itertools.starmap(apply, direct), maxlen=0) and None
    if args.batches:
        fed = [(p, MONO0 + t, MONO0 + t) for t, p in todo[warm:]]
        return lambda: collections.deque(itertools.starmap(col.handle_batch, fed), maxlen=0) and None
    return lambda: drain(col, feeder, len(todo))


def split(argv: list[str]) -> None:
    """``--split``: the three measurements, each in a fresh process, as a table of µs per frame."""
    import subprocess

    got = {}
    for extra in ([], ["--batches"], ["--direct"]):
        line = subprocess.run([sys.executable, __file__, *argv, *extra], check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1]
        got[mode(argparse.Namespace(direct="--direct" in extra, batches="--batches" in extra))] = json.loads(line)
    full, batches, direct = (got[k]["us_per_frame"] for k in ("drain", "batches", "direct"))
    print(f"{got['drain']['frames']:,} frames {got['drain']['kinds']}, CPU µs per frame (±30 % on a busy box):")
    print(f"  receive path, drain loop: {full:6.1f}")
    print(f"    socket, loop, pacing:   {full - batches:6.1f}")
    print(f"    batch and frame calls:  {batches - direct:6.1f}  (stamps, handle_batch, handle_frame)")
    print(f"    decode and ingest:      {direct:6.1f}")


if __name__ == "__main__":
    sys.exit(main())
