"""Ingest at scale: simulated ranks into one real monitor, directly and through node relays.

    python bench/ingest.py                                   # 256, 1,024, 4,096 ranks × 10, 200 ms × direct, relay
    python bench/ingest.py --ranks 256 --step-ms 200 --paths direct --seconds 10   # one quick configuration
    python bench/ingest.py --memory 4096                     # the model's memory per rank (tracemalloc)

A lean simulator: ``--workers`` processes each own hundreds of bare XPUB sockets (one per rank,
the probe's socket options) driven by one loop, no thread per rank. Each rank sends real wire
frames (probe.wire.encode) in the probe's pattern: its step records leave as one ``steps`` frame
when the oldest is ``FLOWTOP_FLUSH_S`` (0.1 s) old (a lone record as a plain ``step`` frame;
``--single``: a ``step`` frame per step, the pre-batching wire), a hello as the probe's heartbeat
(every 2 s while no step frame left in 2.5 s, else every 10 s), telemetry every
second, or as the pace stretches it (4.5 s at 4,096 ranks; the H200 recording's fields), a FLOP count after step 2 and every ``--flops-every-s``, and a
kernel window (80 KB, the H200 recording's) every ``--kernel-every-s`` at a random phase. ``relay``
puts every 8 ranks behind a node relay: ``flowtop relay`` subprocesses (``--relay-host cli``) or, for
hundreds of relays, real :class:`flowtop.tools.relay.Relay` instances hosted ``--relays-per-proc`` to a
process (``threads``; ``auto``: cli up to 32 relays, 30 MB each), or (``sim``) by the simulator
workers themselves: one upstream connection per node carrying the node's frames as a relay sends
them (``[stamp, frame, ...]`` batches, a relay report every 2 s), the monitor's side of a relayed
job where the cores cannot also run its relays. Step columns are sliced from pre-made arrays (the
same columns as the probe's encoder gives; 15 µs instead of 430 µs for 45 records). The monitor is the real thing in a child
process: the collector on its data thread (flowtop.monitor.datathread) and, with ``--ui textual`` (the
default), the real Textual app headless at 200×50 on the main thread.

Printed per configuration (measured over ``--seconds`` after ``--warmup``):

* delivered: frames that reached the monitor ÷ frames the ranks sent (seq numbers per rank; a
  kernel window the monitor's byte budget refused counts as delivered: it arrived);
* CPU % of one core of the monitor's threads: data (collector, decode, model, ticks), ui (Textual),
  zmq (libzmq's I/O thread), kern (the kernel window builder: a thread, or the monitor's child
  process), total; from /proc/self/task/TID/stat and the children's CPU times;
* latency p50/p99: from a step's publish (the probe's timestamp of a frame's oldest record) to the
  UI receiving the first snapshot that shows the rank at that step (every 16th frame sampled,
  kernel windows left out: the sampler unpacks what it samples, on the data thread; its CPU is
  measured and taken off the data thread's figure, ``hook_cpu_pct`` in the JSON);
  ``arrival`` in the JSON: frame send to the collector's receive;
* tick ms p50/p99: ``Model.tick`` (eviction, hints, the snapshot it builds) at 2 Hz; ``ticks``
  after the data thread's figure: its CPU in ticks (the rest is frames and the loop);
* ui show ms p50/p99: ``MainScreen.show`` of each delivered snapshot; refresh ms p50/p99: from
  the snapshot's arrival on the UI thread to the callback after the screen repainted it (show,
  layout and paint: what a 2 Hz cadence must fit in; ``bench/rank_view.py`` measures it alone);
* RSS/rank: the monitor's resident memory growth from before the first rank to the end, ÷ ranks
  (its process; the builder process's own RSS is ``builder_rss_mb`` in the JSON; where the RSS
  is: ``heap_*`` glibc's heap in use and freed but kept, ``py_*`` Python's allocator, and
  ``heap_trim*`` what the monitor's heap trimmer gave back);
* the load it ran under: the simulator's and relays' CPU, the 1-minute load average.

File descriptors: every simulated rank costs its worker 2 (the socket's mailbox and its
connection), the monitor 1 per connection (rank or relay), a relay ~12 + 1 per rank. Every process
raises its soft RLIMIT_NOFILE to the hard limit; the bench says what it needs and stops a
configuration whose need exceeds the hard limit.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import multiprocessing as mp
import os
import queue
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))

import heapmap  # noqa: E402 - bench/: where the resident memory is

REC = ROOT / "tests" / "data" / "h200-gpt-small.rec.gz"
JOB = "ingest"
SAMPLE_EVERY = 16
STEP_KINDS = ("step", "steps", "stepcols")
#: --straggler: that rank's lead is longer by this share of the step.
STRAGGLER_LATE = 0.4
KERNELS = "kernel tables (two windows folded in, cumulative)"
#: Descriptors per rank socket in a simulator worker, per relay (besides its ranks), fixed costs.
FD_PER_SIM_RANK, FD_PER_RELAY, FD_BASE = 2, 12, 64


def raise_nofile() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit; (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def fd_needs(ranks: int, workers: int, path: str, per_relay: int, relays_per_proc: int) -> dict[str, int]:
    """Descriptors each kind of process needs (the largest of its kind)."""
    relays = -(-ranks // per_relay)
    out = {"simulator worker": FD_PER_SIM_RANK * -(-ranks // workers) + FD_BASE,
           "monitor": (relays if path == "relay" else ranks) + FD_BASE}
    if path == "relay" and relays_per_proc:
        out["relay process"] = min(relays, relays_per_proc) * (FD_PER_RELAY + per_relay) + FD_BASE
    return out


# --- templates: what a real probe sends (the H200 recording) ----------------------------------------


def _templates() -> dict[str, dict[str, Any]]:
    try:
        from flowtop.monitor.recording import read_frames
    except ImportError:  # a checkout from before the monitor's own records (A/B runs)
        from flowtop.monitor.recording import read_recording as read_frames
    from probe import wire
    from probe.wire.steps import encode_fields

    out: dict[str, dict[str, Any]] = {}
    for _, frame in read_frames(REC):
        msg = wire.decode(frame)
        out.setdefault(msg.kind, dict(msg.fields))
    return out


def _record(step: int, step_s: float, rng: random.Random) -> dict[str, Any]:
    wall = step_s * (1.0 + 0.02 * rng.random())
    return {"step": step, "wall_s": wall, "device_s": wall * 0.97, "dstep": max(1, step - 2), "tokens": 4096,
            "input_wait_s": step_s * 0.01, "lead_s": wall * 0.6, "micro_batches": 1, "probe_s": 1.5e-5, "drops": 0}


# --- the simulator ---------------------------------------------------------------------------------


class _Columns:
    """A rank's step records ``a..b`` as ``stepcols`` fields, the same columns as encode_fields of
    _record's records (walls jittered 0-2 %, waits 1 %, leads 60 %), built by slicing pre-made
    little-endian arrays: encoding 45 records as maps and columns took the simulator more CPU
    than the monitor at 4,096 ranks (it starved it of the 2 cores)."""

    def __init__(self, step_s: float, rng: random.Random, pool: int = 4096) -> None:
        self.walls = array("d", (step_s * (1.0 + 0.02 * rng.random()) for _ in range(2 * pool)))
        self.pool = pool
        self.step_s = step_s

    def fields(self, a: int, b: int, late_s: float = 0.0) -> dict[str, Any]:
        """``late_s``: added to every lead (a straggler's forward ends that much after the others')."""
        n = b - a + 1
        off = a % self.pool
        walls = self.walls[off:off + n]
        if sys.byteorder != "little":
            raise SystemExit("the simulator's columns are little-endian machine arrays")
        return {"n": n, "drops": 0, "step": array("q", range(a, b + 1)).tobytes(), "wall_s": walls.tobytes(),
                "tokens": (array("q", [4096]) * n).tobytes(),
                "input_wait_s": (array("d", [self.step_s * 0.01]) * n).tobytes(),
                "lead_s": array("d", [w * 0.6 + late_s for w in walls]).tobytes(),
                "probe_s": (array("d", [1.5e-5]) * n).tobytes(), "device_s": walls[-1] * 0.97}


def _sim_worker(idx: int, ranks: list[int], addrs: list[str], world: int, cfg: dict[str, Any],
                ready: "mp.Queue[Any]", go: Any, stop: Any, close: Any, out: "mp.Queue[Any]") -> None:
    import zmq

    from flowtop.monitor.relays import encode_stamp
    try:
        from probe.transport.outbox import HELLO_MAX_S, HELLO_S, STEPS_ALIVE_S
    except ImportError:
        try:  # a checkout from before the outbox's module (A/B runs): its publisher re-exported them
            from probe.transport.publisher import HELLO_MAX_S, HELLO_S, STEPS_ALIVE_S
        except ImportError:  # a checkout from before 8ad3187: its probe's hello every 2 s
            HELLO_S = HELLO_MAX_S = 2.0
            STEPS_ALIVE_S = 0.0
    from probe import wire
    from probe.wire.link import upstream_options

    hello_max_s = HELLO_MAX_S  # the longest gap between two hellos while steps leave (paced: longer)

    raise_nofile()
    rng = random.Random(idx)
    tpl = _templates()
    ctx = zmq.Context(io_threads=1)
    ctx.set(zmq.MAX_SOCKETS, len(ranks) + 64)  # a context option (setsockopt would set a socket default)
    # --relay-host sim: the worker stands in for each node's relay, one upstream socket per node
    # sending the node's frames as a relay does ([stamp, frame, ...] batches, a report every 2 s).
    per_node = cfg["node_relay"]
    nodes = [r // per_node for r in ranks] if per_node else list(range(len(ranks)))
    first_of: dict[int, int] = {}  # node -> its first rank's index
    for i, node in enumerate(nodes):
        first_of.setdefault(node, i)
    slot = {node: j for j, node in enumerate(first_of)}
    sock_of = [slot[node] for node in nodes]  # rank index -> its socket
    socks = []
    for node, i in first_of.items():
        s = ctx.socket(zmq.XPUB)
        for name, value in upstream_options(addrs[i], rng):  # the probe's (and a relay's) options
            s.setsockopt(getattr(zmq, name), value)
        s.connect(addrs[i])
        socks.append(s)
    keys = [wire.RankKey(JOB, f"node{r // 8:04d}", 10_000 + r, r, 0) for r in ranks]
    n = len(ranks)
    subscribed = [False] * len(socks)
    deadline = time.monotonic() + cfg["connect_timeout_s"]
    while not all(subscribed) and time.monotonic() < deadline:
        for i, s in enumerate(socks):
            if not subscribed[i]:
                try:
                    subscribed[i] = s.recv(zmq.NOBLOCK)[:1] == b"\x01"
                except zmq.Again:
                    pass
        time.sleep(0.05)
    ready.put((idx, sum(subscribed) * (per_node or 1)))
    go.wait()
    step_s, base_flush, single = cfg["step_s"], cfg["flush_s"], cfg["single"]
    flush_s, telemetry_s = base_flush, cfg["telemetry_s"]
    paced: list[Any] = [0.0, 0.0, None]  # the monitor's last pace: flush_s, monotonic deadline, telemetry_max_s
    t_go = time.time()
    t0 = [t_go + rng.random() * step_s for _ in range(n)]
    last = [0] * n  # last step number sent
    steps_at, hello_at = [-1e9] * n, [-1e9] * n  # when each rank last sent step records, a hello
    seq = [0] * n
    drops = [0]
    kinds: dict[str, int] = {}
    paces: dict[float, int] = {}  # flush interval -> half seconds spent at it
    hello = {**tpl["hello"], "world_size": world, "argv": ["train.py"]}
    tel, flops, kern = tpl["telemetry"], tpl["flops"], tpl["kernels"]
    heap: list[tuple[float, int, str]] = []
    columns = _Columns(step_s, rng)
    for i in range(n):
        heap.append((t_go, i, "hello"))
        heap.append((t0[i] + step_s + (0.0 if single else flush_s), i, "flush"))
        heap.append((t_go + rng.random() * telemetry_s, i, "telemetry"))
        heap.append((t0[i] + 2 * step_s, i, "flops"))
        if cfg["kernel_every_s"] > 0:
            heap.append((t_go + rng.random() * cfg["kernel_every_s"], i, "kernels"))
    heapq.heapify(heap)

    pending: list[list[tuple[bytes, float]]] = [[] for _ in socks]  # sim relays: frames to batch
    relay_ids = [f"sim{idx}-{j}" for j in range(len(socks))]
    relay_key = wire.RankKey("", f"sim{idx}", 20_000 + idx, 0, 0)
    relay_seq = [0]

    def send(i: int, kind: str, t: float, fields: dict[str, Any]) -> None:
        frame = wire.encode(kind, keys[i], seq[i], t, fields)
        seq[i] += 1
        kinds[kind] = kinds.get(kind, 0) + 1
        if per_node:
            pending[sock_of[i]].append((frame, time.time()))
            dirty.add(sock_of[i])
            return
        try:
            socks[i].send(frame, zmq.NOBLOCK)
        except zmq.Again:
            drops[0] += 1

    dirty: set[int] = set()  # nodes with frames to send

    def flush_relays(now: float, report: bool) -> None:
        for j in range(len(socks)) if report else sorted(dirty):
            frames = pending[j]
            parts = [f for f, _ in frames]
            if report:
                fields = {"relay": relay_ids[j], "listen": "sim", "upstream": addrs[0], "ranks": per_node,
                          "frames_in": 0, "frames_out": 0, "bytes_in": 0, "bytes_out": 0, "drops": drops[0],
                          "queued": 0, "commands": 0, "link_ups": 1, "uptime_s": now - t_go, "closing": False,
                          "hosted_by": "bench"}
                relay_seq[0] += 1
                parts.append(wire.encode("relay", relay_key, relay_seq[0], now, fields))
            if not parts:
                continue
            ages = [int((now - t) * 1e6) for _, t in frames] + ([0] if report else [])
            try:
                # stamped on the monotonic clock, as a relay stamps its batches (flowtop.tools.relay)
                socks[j].send_multipart([encode_stamp(relay_ids[j], time.monotonic(), ages), *parts], zmq.NOBLOCK)
            except zmq.Again:
                drops[0] += len(frames)
            frames.clear()
        dirty.clear()

    def follow_pace() -> tuple[float, float]:
        """The flush and telemetry intervals now: as a probe does, the longer of its own flush and
        the pace the monitor asked (broadcast to every socket, carried down by relays) until it
        lapses (wire.PACE_TTL_S)."""
        for sock in socks:
            for _ in range(100):
                try:
                    frame = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    cmd = wire.decode_control(frame)
                except wire.WireError:
                    continue  # a subscription, a command for one rank
                if cmd.cmd == "pace" and cmd.flush_s is not None:
                    # (a checkout from before the pace's telemetry_max_s: its probes' 5 s)
                    paced[:] = [cmd.flush_s, time.monotonic() + wire.PACE_TTL_S,
                                getattr(cmd, "telemetry_max_s", None)]
        if time.monotonic() < paced[1]:
            flush = max(base_flush, paced[0])
            return flush, _telemetry_s(flush, paced[2])
        return base_flush, _telemetry_s(base_flush)

    c0, m0 = time.process_time(), time.thread_time()
    next_report = t_go
    next_pace = t_go
    while not stop.is_set():
        now = time.time()
        if now >= next_pace:
            next_pace = now + 0.5
            flush_s, telemetry_s = follow_pace()
            hello_max_s = _hello_max_s(paced[0] if time.monotonic() < paced[1] else None, HELLO_MAX_S)
            paces[flush_s] = paces.get(flush_s, 0) + 1
        while heap and heap[0][0] <= now:
            due, i, what = heapq.heappop(heap)
            if what == "flush":
                k_now = min(int((now - t0[i]) / step_s), last[i] + wire.MAX_BATCH)
                if k_now > last[i]:
                    first = t0[i] + (last[i] + 1) * step_s
                    recs = [] if not (single or cfg["records"]) else \
                        [_record(k, step_s, rng) for k in range(last[i] + 1, k_now + 1)]
                    if single:
                        send(i, "step", first, {**recs[0], "_sent": now})
                    elif cfg["records"]:  # the MINOR 2 wire: a list of record maps
                        send(i, "steps", first, {"records": recs, "_sent": now})
                    else:  # the probe's wire: columns (probe.wire.steps)
                        late = STRAGGLER_LATE * step_s if ranks[i] == cfg["straggler"] else 0.0
                        send(i, "stepcols", first, {**columns.fields(last[i] + 1, k_now, late), "_sent": now})
                    last[i] = k_now
                    steps_at[i] = now
                nxt = t0[i] + (last[i] + 1) * step_s + (0.0 if single else flush_s)
                heapq.heappush(heap, (max(nxt, now + 1e-4), i, "flush"))
            elif what == "telemetry":
                gpu = {**tel["gpu"], "power_w": 500.0 + 100 * rng.random(), "gpu_util": 100.0}
                send(i, "telemetry", now, {**tel, "gpu": gpu})
                heapq.heappush(heap, (due + telemetry_s, i, "telemetry"))
            elif what == "hello":  # the probe's heartbeat: only while no step frame says the rank lives
                if now - steps_at[i] >= STEPS_ALIVE_S or now - hello_at[i] >= hello_max_s:
                    send(i, "hello", now, {**hello, "local_rank": ranks[i] % 8})
                    hello_at[i] = now
                heapq.heappush(heap, (due + HELLO_S, i, "hello"))
            elif what == "flops":
                send(i, "flops", now, {**flops, "step": max(1, last[i])})
                heapq.heappush(heap, (due + cfg["flops_every_s"], i, "flops"))
            elif what == "kernels":
                send(i, "kernels", now, {**kern, "step": max(1, last[i]), "window": kinds.get("kernels", 0)})
                heapq.heappush(heap, (due + cfg["kernel_every_s"], i, "kernels"))
        if per_node:
            now = time.time()  # after the frames' own stamps: ages are never negative
            report = now >= next_report
            flush_relays(now, report=report)
            if report:  # as a relay's: every second, stretched by a pace that holds (its batches flow)
                next_report = now + _relay_report_s(paced[0] if time.monotonic() < paced[1] else None)
        wait = (heap[0][0] - time.time()) if heap else 0.01
        if wait > 0:
            time.sleep(min(wait, 0.01))
    if per_node:
        flush_relays(time.time(), report=False)
    cpu = time.process_time() - c0
    out.put({"worker": idx, "frames": sum(seq), "send_drops": drops[0], "kinds": kinds, "cpu_s": cpu,
             "loop_cpu_s": time.thread_time() - m0,
             "steps": sum(last), "paces": paces})
    close.wait()
    for s in socks:
        s.close(0)
    ctx.term()


# --- relays ----------------------------------------------------------------------------------------


def _relay_proc(listens: list[str], upstream: str, stop: Any, shared: bool) -> None:
    """``shared``: the process's relays share one ZeroMQ context: 32 relays to a process run 34
    threads instead of 96 (libzmq starts an I/O and a reaper thread per context) on the cores the
    monitor is measured on; each relay of a real cluster has its node to itself."""
    import zmq

    from flowtop.tools.relay import Relay, RelayConfig

    raise_nofile()
    ctx = zmq.Context() if shared else None
    relays = [Relay(RelayConfig(addr, upstream, hosted_by="bench"), context=ctx) for addr in listens]
    threads = [threading.Thread(target=r.run, daemon=True) for r in relays]
    for t in threads:
        t.start()
    stop.wait()
    for r in relays:
        r.stop()
    for t in threads:
        t.join(5)
    if ctx is not None:
        ctx.term()


class Relays:
    """The configuration's relays, as ``flowtop relay`` subprocesses or hosted in a few processes."""

    def __init__(self, n: int, upstream: str, host: str, per_proc: int, tmp: str, shared: bool = True) -> None:
        self.listens = [f"ipc://{tmp}/r{i}.sock" for i in range(n)]
        self.host = host
        self._stop = mp.Event()
        self.pids: list[int] = []
        self._procs: list[Any] = []
        if host == "cli":
            for addr in self.listens:
                p = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "relay", "--listen", addr, "--connect", upstream],
                                     cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=raise_nofile)
                self._procs.append(p)
                self.pids.append(p.pid)
        else:
            for i in range(0, n, per_proc):
                p = mp.Process(target=_relay_proc, args=(self.listens[i:i + per_proc], upstream, self._stop, shared))
                p.start()
                self._procs.append(p)
                self.pids.append(p.pid)  # type: ignore[arg-type]

    def close(self) -> None:
        self._stop.set()
        for p in self._procs:
            if isinstance(p, subprocess.Popen):
                p.terminate()
        for p in self._procs:
            try:
                p.wait(10) if isinstance(p, subprocess.Popen) else p.join(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _cpu_of(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


# --- the monitor (a child process) -----------------------------------------------------------------


def _threads_cpu() -> dict[int, tuple[str, float]]:
    """tid -> (name, CPU seconds) of this process's threads."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / tick)
    return out


def _children() -> dict[int, tuple[float, int]]:
    """pid -> (CPU seconds, resident bytes) of this process's children (the monitor's kernel
    window builder)."""
    import psutil

    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            t, rss = child.cpu_times(), child.memory_info().rss
        except psutil.Error:
            continue
        out[child.pid] = (t.user + t.system, rss)
    return out


def _heap() -> dict[str, float]:
    """glibc's heap at this instant (mallinfo2, glibc >= 2.33; empty elsewhere): MB in use by
    live allocations (``heap_used_mb``; Python's small-object arenas are mapped apart, in none of
    these: ``py_*``), MB freed but kept by the allocator (``heap_free_mb``: resident unless
    trimmed), MB in mmapped blocks."""
    import ctypes

    class _Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError, TypeError):
        return {}
    fn.restype = _Info
    info = fn()
    mb = 1 / 2**20
    return {"heap_used_mb": round(info.uordblks * mb, 1), "heap_free_mb": round(info.fordblks * mb, 1),
            "heap_mmap_mb": round(info.hblkhd * mb, 1)}


def _pymalloc() -> dict[str, float]:
    """Python's small-object allocator at this instant (sys._debugmallocstats, read back from the
    C stderr it writes to): MB of arenas held, of blocks in use, of blocks free inside them."""
    import tempfile

    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode("ascii", "replace")
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        found[name.strip()] = value.strip().replace(",", "")
    # per size class (the 32 lines after the header): (size, pools, blocks in use, blocks free)
    classes = [[int(x) for x in line.split()[1:5]] for line in text.splitlines()
               if len(line.split()) == 5 and line.split()[0].isdigit()]
    try:
        mb = lambda name: round(int(found[name]) / 2**20, 1)  # noqa: E731
        return {"py_arenas_mb": round(int(found["# arenas allocated current"]) * (1 << 20) / 2**20, 1),
                "py_used_mb": mb("# bytes in allocated blocks"), "py_free_mb": mb("# bytes in available blocks"),
                "py_unused_pools_mb": round(sum(int(v) for k, v in found.items() if k.endswith("unused pools * 16384 bytes")) / 2**20, 1),
                # the size classes with the most free bytes: [size, MB in use, MB free]
                "py_free_classes": [[c[0], round(c[0] * c[2] / 2**20, 1), round(c[0] * c[3] / 2**20, 1)]
                                    for c in sorted(classes, key=lambda c: -c[0] * c[3])[:8]]}
    except (KeyError, ValueError):
        return {}


def _traced(top: int = 25) -> dict[str, Any]:
    """With --trace-memory: MB traced in all, and the lines (file:line, the innermost frame of
    the traceback depth asked) holding the most (KB)."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return {}
    snap = tracemalloc.take_snapshot()
    stats = snap.statistics("traceback")
    total = sum(st.size for st in stats)
    lines = []
    for st in stats[:top]:
        where = " < ".join(f"{os.path.relpath(f.filename, ROOT) if str(ROOT) in f.filename else os.path.basename(f.filename)}:{f.lineno}"
                           for f in st.traceback)
        lines.append([where, round(st.size / 1024), st.count])
    return {"traced_mb": round(total / 2**20, 1), "traced_top_kb": lines}


def _trims() -> dict[str, float]:
    """The monitor's heap trims so far (flowtop.monitor.heaptrim; absent in an older flowtop or
    with FLOWTOP_HEAP_TRIM_S=0)."""
    try:
        from flowtop.monitor import heaptrim  # type: ignore[attr-defined]
    except ImportError:
        return {}
    trimmer = heaptrim.current()
    if trimmer is None:
        return {}
    t = trimmer.trims()
    return {"heap_trims": t.count, "heap_trim_cpu_ms": round(1e3 * t.cpu_s, 1),
            "heap_trim_released_mb": round(t.released_bytes / 2**20, 1)}


def _gc_meter() -> dict[int, list[float]]:
    """Per generation: [collections, wall seconds in them, CPU seconds, objects collected] since
    now, kept up to date by a gc callback (a collection stops every thread of the monitor; on a
    box the simulator saturates, its wall time includes waits for a core)."""
    spent: dict[int, list[float]] = {g: [0, 0.0, 0.0, 0] for g in range(3)}
    started = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = time.perf_counter(), time.thread_time()
        else:
            g = spent[info["generation"]]
            g[0] += 1
            g[1] += time.perf_counter() - started[0]
            g[2] += time.thread_time() - started[1]
            g[3] += info.get("collected", 0)

    gc.callbacks.append(on_gc)
    return spent


def _census(top: int = 20) -> dict[str, int]:
    """The objects the garbage collector tracks at the end (what a full collection walks), the
    frozen included: in all, and the most numerous types (their counts)."""
    import collections
    import gc

    frozen = gc.get_freeze_count()
    gc.unfreeze()
    objs = gc.get_objects()
    counts = collections.Counter(type(o).__name__ for o in objs)
    out = {"tracked": len(objs), "frozen_at_end": frozen, **dict(counts.most_common(top))}
    del objs
    gc.freeze()
    return out


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def _monitor_main(listen: str, ui: str, outdir: str) -> int:
    import collections

    import msgpack

    from flowtop.monitor.collector import Collector
    from flowtop.monitor.datathread import DataThread
    from flowtop.monitor.wiring import make_model
    from probe.wire import PEEK_BYTES, envelope

    raise_nofile()
    if os.environ.get("BENCH_TRACE_MEMORY"):  # --trace-memory: slower; where the memory is, at the end
        import tracemalloc

        tracemalloc.start(int(os.environ["BENCH_TRACE_MEMORY"]))
    try:  # the GC policy `flowtop top` runs under, where the tree has one
        from flowtop.monitor import gcpolicy  # type: ignore[attr-defined]
    except ImportError:
        gcpolicy = None
    if gcpolicy is not None:
        gcpolicy.for_monitor()
    gc_spent = _gc_meter()
    model = make_model()
    # The data thread's CPU budget as flowtop's commands take it (FLOWTOP_DATA_CPU=1: none).
    from flowtop import settings

    col = Collector(model, listen, cpu_budget=settings.DATA_CPU.read())
    samples: "collections.deque[tuple[int, int, float, float, float]]" = collections.deque()
    arrivals: list[float] = []
    counter = [0]
    hook_cpu = [0.0]  # CPU seconds the latency sampler took on the data thread
    handle = col.handle_frame

    def sampled(frame: bytes, now: float, *rest: Any) -> None:
        counter[0] += 1
        # Only step frames are sampled: a kernel window (~80 KB) is not unpacked here (~0.6 ms
        # each, on the data thread the bench measures); a frame of PEEK_BYTES or more is read as
        # far as its kind first. What the sampling costs is timed and printed apart from the
        # monitor's own work (``hook``).
        if counter[0] % SAMPLE_EVERY == 0:
            c = time.thread_time()
            try:
                if len(frame) >= PEEK_BYTES and envelope(frame).kind not in STEP_KINDS:
                    raise LookupError("not a step frame")
                obj = msgpack.unpackb(frame, raw=False)
                if obj.get("k") in STEP_KINDS and obj.get("job") == JOB:
                    step = (obj["records"][-1]["step"] if obj["k"] == "steps" else
                            struct.unpack("<q", obj["step"][-8:])[0] if obj["k"] == "stepcols" else obj["step"])
                    recv = time.time()
                    samples.append((obj["rank"], step, obj["t"], obj.get("_sent", obj["t"]), recv))
                    arrivals.append(recv - obj.get("_sent", obj["t"]))
            except Exception:
                pass
            hook_cpu[0] += time.thread_time() - c
        handle(frame, now, *rest)

    col.handle_frame = sampled  # type: ignore[method-assign]
    # Where a relayed frame waited before the collector took it: in the relay (frame made -> its
    # batch sent: the stamp's ages, the relay's own report left out) or in the queues after it
    # (the batch's send -> taken off the socket: relays, real or simulated, stamp the monotonic
    # clock, this machine's). Every 16th batch; its CPU counts as the hook's.
    queued: list[float] = []
    held: list[float] = []
    handle_batch = col.handle_batch
    batches = [0]

    def timed_batch(parts: list[bytes], now: float, *rest: Any) -> None:
        batches[0] += 1
        if batches[0] % SAMPLE_EVERY == 0:
            c = time.thread_time()
            try:
                stamp = msgpack.unpackb(parts[0], raw=False)
                queued.append(time.monotonic() - stamp["c"])
                ages = stamp["a"][:-1] if envelope(parts[-1]).kind == "relay" else stamp["a"]
                held.extend(age * 1e-6 for age in ages)
            except Exception:
                pass
            hook_cpu[0] += time.thread_time() - c
        handle_batch(parts, now, *rest)

    col.handle_batch = timed_batch  # type: ignore[method-assign]
    ticks: list[float] = []
    tick_cpu: list[float] = []
    tick = model.tick

    tick_gc: list[float] = []  # CPU ms of the collections that ran inside each tick

    def gc_cpu() -> float:
        return sum(g[2] for g in gc_spent.values())

    def timed_tick(now: float, listen: str = "") -> Any:
        c, t, g = time.thread_time(), time.perf_counter(), gc_cpu()
        snap = tick(now, listen)
        ticks.append(1e3 * (time.perf_counter() - t))
        tick_cpu.append(1e3 * (time.thread_time() - c))
        tick_gc.append(1e3 * (gc_cpu() - g))
        return snap

    model.tick = timed_tick  # type: ignore[method-assign]
    pending: dict[int, list[tuple[int, float, float]]] = collections.defaultdict(list)
    latency: list[float] = []
    latency_sent: list[float] = []
    shows: list[float] = []
    refreshes: list[float] = []  # a snapshot's arrival on the UI thread -> the callback after its repaint
    stragglers: dict[str, float] = {}  # straggler hint target -> when the UI first got it

    def delivered(snap: Any) -> None:
        """On the UI thread: the snapshot the UI got now; the samples whose step it shows; the
        straggler hints it holds."""
        now = time.time()
        for job in snap.jobs:
            for h in job.hints:
                if h.id == "straggler" and h.target not in stragglers:
                    stragglers[h.target] = now
        while samples:
            rank, step, t, sent, _ = samples.popleft()
            pending[rank].append((step, t, sent))
        if not pending:
            return
        steps = {}
        for job in snap.jobs:
            if job.job == JOB:
                steps = {r.rank: r.step for r in job.ranks if r.rank in pending}
        for rank in list(pending):
            shown = steps.get(rank)
            if shown is None:
                continue
            left = []
            for step, t, sent in pending[rank]:
                if shown >= step:
                    latency.append(now - t)
                    latency_sent.append(now - sent)
                else:
                    left.append((step, t, sent))
            if left:
                pending[rank] = left
            else:
                del pending[rank]

    marks: dict[str, Any] = {}

    def mark(name: str) -> None:
        marks[name] = {"t": time.monotonic(), "threads": _threads_cpu(), "children": _children(), "hook": hook_cpu[0],
                       "gc": {g: tuple(v) for g, v in gc_spent.items()},
                       "ticks": len(ticks), "lat": len(latency), "shows": len(shows), "arr": len(arrivals),
                       "queued": len(queued), "held": len(held),
                       "refreshes": len(refreshes), "rss": _rss_bytes(), "smaps": heapmap.smaps()}

    def figures(data: Any) -> dict[str, Any]:
        def count() -> dict[str, Any]:
            ranks = [st for st in model.ranks.values() if st.key.job == JOB]
            refused = sum(n for why, n in model.rejected_reasons.items() if why.startswith("kernel window refused"))
            relays = model.relays.snapshot(col.clock.now())
            return {"ranks_seen": len(ranks), "frames_got": sum(st.last_seq + 1 - st.lost for st in ranks),
                    "kernels_refused": refused, "rejected": model.rejected, "relays": len(relays),
                    "rejected_reasons": dict(model.rejected_reasons.most_common(5)),
                    # the monitor's own governing (pace, tick spread) as it told the user
                    "spread": getattr(model, "spread", 1),
                    # where a backlog sits: frames held in the relays (their latest reports) or past them
                    "relays_queued": sum(r.queued for r in relays), "relays_out": sum(r.frames_out for r in relays),
                    "relay_lag_s_max": round(max((r.link_lag_s for r in relays), default=0.0), 2),
                    "relays_silent": sum(r.status == "silent" for r in relays),
                    # when (monitor seconds before this count) and what: how the pace got where it is
                    "notices": [f"-{col.clock.now() - n.at:.1f} s: {n.text}" for n in model.notices.history][-30:],
                    "gc_census": _census()}

        got = data.call(count, tell=False).result(60)
        a, b = marks["start"], marks["end"]
        wall = b["t"] - a["t"]
        groups: dict[str, float] = collections.defaultdict(float)
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid, (comm, cpu) in b["threads"].items():
            used = cpu - a["threads"].get(tid, (comm, 0.0))[1]
            name = names.get(tid, comm)
            if name == "flowtop-data":
                group = "data"
            elif tid == os.getpid():
                group = "ui"
            elif comm.startswith("ZMQbg"):
                group = "zmq"
            elif name.startswith("flowtop-kernels"):
                group = "kernels"  # the window builder, where it is a thread
            else:
                group = "other"
            groups[group] += used
        for pid, (cpu, _) in b["children"].items():  # the window builder, where it is a process
            groups["kernels"] += cpu - a["children"].get(pid, (0.0, 0))[0]
        win_ticks = ticks[a["ticks"]:b["ticks"]]
        win_lat = latency[a["lat"]:b["lat"]]
        win_lat_sent = latency_sent[a["lat"]:b["lat"]]
        win_shows = shows[a["shows"]:b["shows"]]
        win_refreshes = refreshes[a["refreshes"]:b["refreshes"]]
        win_arr = arrivals[a["arr"]:b["arr"]]
        return {
            **got, "window_s": wall,
            "cpu_pct": {g: round(100 * v / wall, 1) for g, v in sorted(groups.items())},
            "cpu_pct_total": round(100 * sum(groups.values()) / wall, 1),
            "tick_ms_p50": _pct(win_ticks, 0.5), "tick_ms_p99": _pct(win_ticks, 0.99),
            "tick_cpu_ms_p50": _pct(tick_cpu[a["ticks"]:b["ticks"]], 0.5), "ticks": len(win_ticks),
            # the data thread's CPU in ticks, and in the bench's latency sampler (not the monitor's)
            "tick_cpu_pct": round(100 * sum(tick_cpu[a["ticks"]:b["ticks"]]) / 1e3 / wall, 1),
            # ... of it in garbage collections that ran inside ticks
            "tick_gc_cpu_pct": round(100 * sum(tick_gc[a["ticks"]:b["ticks"]]) / 1e3 / wall, 1),
            "hook_cpu_pct": round(100 * (b["hook"] - a["hook"]) / wall, 1),
            # the collector's pauses by generation: (collections, wall ms, CPU ms, objects collected)
            "gc": {g: (b["gc"][g][0] - a["gc"][g][0], round(1e3 * (b["gc"][g][1] - a["gc"][g][1]), 1),
                       round(1e3 * (b["gc"][g][2] - a["gc"][g][2]), 1), b["gc"][g][3] - a["gc"][g][3])
                   for g in b["gc"]},
            "latency_ms_p50": _pct([1e3 * x for x in win_lat], 0.5), "latency_ms_p99": _pct([1e3 * x for x in win_lat], 0.99),
            "latency_from_send_ms_p50": _pct([1e3 * x for x in win_lat_sent], 0.5),
            "latency_from_send_ms_p99": _pct([1e3 * x for x in win_lat_sent], 0.99),
            "latency_samples": len(win_lat),
            "arrival_ms_p50": _pct([1e3 * x for x in win_arr], 0.5), "arrival_ms_p99": _pct([1e3 * x for x in win_arr], 0.99),
            # ... of which in a relay (frame made -> its batch sent) and after it (-> the drain took it)
            "relay_held_ms_p50": _pct([1e3 * x for x in held[a["held"]:b["held"]]], 0.5),
            "relay_held_ms_p99": _pct([1e3 * x for x in held[a["held"]:b["held"]]], 0.99),
            "queued_ms_p50": _pct([1e3 * x for x in queued[a["queued"]:b["queued"]]], 0.5),
            "queued_ms_p99": _pct([1e3 * x for x in queued[a["queued"]:b["queued"]]], 0.99),
            "ui_show_ms_p50": _pct(win_shows, 0.5), "ui_show_ms_p99": _pct(win_shows, 0.99), "ui_shows": len(win_shows),
            "ui_refresh_ms_p50": _pct(win_refreshes, 0.5), "ui_refresh_ms_p99": _pct(win_refreshes, 0.99),
            "rss_base": marks["base_rss"], "rss_end": _rss_bytes(), **_heap(), **_pymalloc(), **_trims(),
            # per glibc arena (0: the main one) held / free MB, and the resident MB by mapping kind
            "arenas": heapmap.arenas(), "smaps": heapmap.smaps(), "smaps_base": marks["base_smaps"],
            "smaps_start": a["smaps"], "rss_start_mb": round(a["rss"] / 2**20, 1),
            **_traced(),
            # the window builder's own process at the end mark: not in the RSS per rank (this process's)
            "builder_rss_mb": round(sum(rss for _, rss in b["children"].values()) / 2**20, 1),
            "skipped_ticks": col.ticker.skipped if col.ticker else None,
            # the UI's turns at the interpreter (flowtop.monitor.datathread.UiTurn; a checkout
            # from before it, or --ui none: none): begun, seconds the data thread gave, ran out,
            # over the whole run (warm-up included), not the measured window
            "ui_turn": ({"turns": turn.turns, "given_s": round(turn.given_s, 2), "ran_out": turn.ran_out}
                        if (turn := getattr(col, "ui_turn", None)) is not None else None),
            # straggler hints the UI got (target -> seconds after the monitor was ready; --straggler)
            "straggler_hints": {t: round(at - marks["ready_t"], 1) for t, at in sorted(stragglers.items())},
        }

    def settled(data: Any) -> dict[str, Any]:
        """After the figures (the ranks stopped): the RSS once the backlog drained (no new frame
        taken for 1 s, 30 s at most) and one heap trim ran, so frames still queued in libzmq at
        the end mark (glibc's memory in use, its I/O thread's arena) are out of it: the monitor's
        own memory, which the box's load moves much less than ``rss_end``."""
        def taken() -> int:
            return sum(st.last_seq + 1 - st.lost for st in model.ranks.values() if st.key.job == JOB)

        t0, last = time.monotonic(), -1
        while time.monotonic() - t0 < 30:
            now = data.call(taken, tell=False).result(60)
            if now == last:
                break
            last = now
            time.sleep(1.0)
        drained_s = time.monotonic() - t0
        from flowtop.monitor import heaptrim  # type: ignore[attr-defined]

        heaptrim.HeapTrimmer(0).trim_once()
        return {"rss_settled": _rss_bytes(), "settle_s": round(drained_s, 1), "settled_frames_got": last,
                "heap_used_settled_mb": _heap().get("heap_used_mb"), "smaps_settled": heapmap.smaps(),
                **{k + "_settled": v for k, v in _pymalloc().items() if k in ("py_arenas_mb", "py_used_mb", "py_free_mb")}}

    def control(data: Any, finish: Any) -> None:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd in ("start", "end"):
                mark(cmd)
            elif cmd == "stop":
                fig = figures(data)
                fig.update(settled(data))
                with open(os.path.join(outdir, "monitor.json"), "w") as f:
                    json.dump(fig, f)
                finish()
                return

    def ready(data: Any) -> None:
        marks["base_rss"] = _rss_bytes()
        marks["base_smaps"] = heapmap.smaps()
        marks["ready_t"] = time.time()
        with open(os.path.join(outdir, "ready"), "w") as f:
            f.write(str(os.getpid()))
        threading.Thread(target=control, args=(data, done), daemon=True).start()

    if ui == "textual":
        from flowtop.tui.app import FlowtopApp
        from flowtop.tui.screens.main_screen import MainScreen

        show = MainScreen.show

        def timed_show(self: Any, snap: Any) -> None:
            t = time.perf_counter()
            show(self, snap)
            shows.append(1e3 * (time.perf_counter() - t))

        MainScreen.show = timed_show  # type: ignore[method-assign]

        class BenchApp(FlowtopApp):
            CSS_PATH = str(ROOT / "flowtop" / "tui" / "flowtop.tcss")  # relative paths are the subclass module's

            async def on_mount(self) -> None:
                await super().on_mount()
                ready(self.data)

            def _deliver(self, delivery: Any) -> None:
                t = time.perf_counter()
                if delivery.snapshot is not None:
                    delivered(delivery.snapshot)
                super()._deliver(delivery)
                if delivery.snapshot is not None:  # after the screen showed and repainted it (two hops: see FlowtopApp._deliver)
                    self.call_after_refresh(lambda: self.call_after_refresh(
                        lambda: refreshes.append(1e3 * (time.perf_counter() - t))))

        app = BenchApp(col)

        def done() -> None:
            app.call_from_thread(app.exit)

        app.run(headless=True, size=(200, 50))
        return 0
    wake = threading.Event()
    data = DataThread(col, wake=wake.set)
    finished = threading.Event()

    def done() -> None:  # noqa: F811 (the headless variant)
        finished.set()
        wake.set()

    data.start().result(30)
    ready(data)
    while not finished.is_set():
        wake.wait(1.0)
        wake.clear()
        got = data.mailbox.take()
        if got.snapshot is not None:
            delivered(got.snapshot)
    data.stop()
    return 0


class Monitor:
    """The monitor child process (``--_monitor``), driven over its stdin."""

    def __init__(self, ui: str, tmp: str) -> None:
        from flowtop.tools.demo.launch import free_port_pair

        self.listen = f"tcp://127.0.0.1:{free_port_pair()}"
        self.dir = tmp
        self.proc = subprocess.Popen([sys.executable, __file__, "--_monitor", self.listen, "--ui", ui, "--_dir", tmp],
                                     cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(tmp, "monitor.err"), "w"), text=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(tmp, "ready")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"monitor did not start: {self._err()}")
            time.sleep(0.1)

    def _err(self) -> str:
        try:
            return Path(self.dir, "monitor.err").read_text()[-3000:]
        except OSError:
            return ""

    def tell(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        self.tell("stop")
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        try:
            return json.loads(Path(self.dir, "monitor.json").read_text())
        except (OSError, ValueError):
            raise RuntimeError(f"monitor gave no figures: {self._err()}") from None


# --- one configuration -----------------------------------------------------------------------------


def run_config(ranks: int, step_ms: float, path: str, args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = raise_nofile()
    relays_n = -(-ranks // args.per_relay) if path == "relay" else 0
    host = args.relay_host if args.relay_host != "auto" else ("cli" if relays_n <= 32 else "threads")
    needs = fd_needs(ranks, args.workers, path, args.per_relay,
                     {"cli": relays_n, "sim": 0}.get(host, args.relays_per_proc))
    row: dict[str, Any] = {"ranks": ranks, "step_ms": step_ms, "path": path, "relays": relays_n,
                           "relay_host": host if relays_n else None,
                           "relay_context": args.relay_context if relays_n and host == "threads" else None,
                           "single": args.single,
                           "fd_needs": needs, "fd_hard_limit": hard}
    short = {k: v for k, v in needs.items() if hard != resource.RLIM_INFINITY and v > hard}
    if short:
        row["error"] = ("open-file hard limit " + str(hard) + " too low: needs " +
                        ", ".join(f"{k} {v}" for k, v in short.items()) + " (raise ulimit -Hn or add --workers)")
        return row
    tmp = tempfile.mkdtemp(prefix="ftingest")
    load0 = os.getloadavg()[0]
    mon = Monitor(args.ui, tmp)
    relays = None
    workers: list[Any] = []
    close = mp.Event()
    try:
        addrs = [mon.listen] * ranks
        if path == "relay" and host != "sim":
            relays = Relays(relays_n, mon.listen, host, args.relays_per_proc, tmp, args.relay_context == "shared")
            addrs = [relays.listens[r // args.per_relay] for r in range(ranks)]
            time.sleep(2.0 + relays_n * (0.05 if host == "cli" else 0.005))
        cfg = {"step_s": step_ms / 1e3, "flush_s": _flush_s(args.flush_s, ranks), "single": args.single,
               "records": args.records,
               "telemetry_s": _telemetry_s(_flush_s(args.flush_s, ranks)),
               "flops_every_s": args.flops_every_s, "kernel_every_s": args.kernel_every_s,
               "connect_timeout_s": 30.0 + ranks / 100, "straggler": args.straggler,
               "node_relay": args.per_relay if path == "relay" and host == "sim" else 0}
        ready: "mp.Queue[Any]" = mp.Queue()
        out: "mp.Queue[Any]" = mp.Queue()
        go, stop = mp.Event(), mp.Event()
        chunk = -(-ranks // args.workers)
        for w, i in enumerate(range(0, ranks, chunk)):
            ids = list(range(i, min(ranks, i + chunk)))
            p = mp.Process(target=_sim_worker, args=(w, ids, [addrs[r] for r in ids], ranks, cfg, ready, go, stop, close, out))
            p.start()
            workers.append(p)
        subscribed, waiting, deadline = 0, len(workers), time.monotonic() + cfg["connect_timeout_s"] + 60
        while waiting:
            try:
                subscribed += ready.get(timeout=1.0)[1]
                waiting -= 1
            except queue.Empty:
                dead = [p.exitcode for p in workers if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"simulator workers failed (exit codes {dead}) or never connected") from None
        row["subscribed"] = subscribed
        go.set()
        time.sleep(args.warmup)
        sim_pids = [p.pid for p in workers]
        relay_pids = relays.pids if relays else []
        c_sim, c_rel = _cpu_of(sim_pids), _cpu_of(relay_pids)
        t0 = time.monotonic()
        mon.tell("start")
        time.sleep(args.seconds)
        mon.tell("end")
        wall = time.monotonic() - t0
        c_sim, c_rel = _cpu_of(sim_pids) - c_sim, _cpu_of(relay_pids) - c_rel
        stop.set()
        sims = [out.get(timeout=60) for _ in workers]
        time.sleep(args.drain_s)  # the relays' last batches, the monitor's backlog
        fig = mon.result()
    finally:
        close.set()
        for p in workers:
            p.join(30)
        if relays is not None:
            relays.close()
        if mon.proc.poll() is None:
            mon.proc.kill()
    sent = sum(s["frames"] for s in sims)
    got = fig["frames_got"] + fig["kernels_refused"]
    row.update({
        "frames_sent": sent, "sim_send_drops": sum(s["send_drops"] for s in sims),
        "delivered_pct": round(100.0 * min(got, sent) / max(1, sent), 3),
        "frames_per_s": round(sent / (args.warmup + args.seconds)),
        "kinds": {k: sum(s["kinds"].get(k, 0) for s in sims) for k in ("steps", "step", "hello", "telemetry", "flops", "kernels")},
        # the flush intervals the ranks kept, as the monitor's pace commands set them: seconds at each
        "paces_s": {f"{k:g}": round(sum(s["paces"].get(k, 0) for s in sims) / 2 / len(sims), 1)
                    for k in sorted({k for s in sims for k in s["paces"]})},
        "sim_cpu_pct": round(100 * c_sim / wall, 1),
        # the share of the simulator's CPU its Python loop takes (the rest: libzmq's I/O threads)
        "sim_loop_cpu_share": round(sum(s["loop_cpu_s"] for s in sims) / max(1e-9, sum(s["cpu_s"] for s in sims)), 2),
        "relay_cpu_pct": round(100 * c_rel / wall, 1) if relays else None,
        "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "rss_per_rank_kb": round((fig["rss_end"] - fig["rss_base"]) / ranks / 1024, 1),
        # the same once the backlog drained and the heap was trimmed (the monitor's own memory)
        "rss_settled_per_rank_kb": round((fig["rss_settled"] - fig["rss_base"]) / ranks / 1024, 1)
        if "rss_settled" in fig else None,
        **{k: v for k, v in fig.items() if k not in ("rss_base",)},
    })
    return row


# --- memory of the model per rank (tracemalloc) -----------------------------------------------------


def memory(ranks: int, traced: bool = True) -> dict[str, Any]:
    """The model's Python memory per rank in steady state: the step ring full (RING steps), the
    sparkline series full (300 telemetry samples), hello, a FLOP count, two kernel windows (latest
    and cumulative table), the views of two ticks; traced by tracemalloc, ÷ ranks (``traced``
    False: the process's RSS growth instead, allocator overheads included, ÷ ranks)."""
    import gc
    import tracemalloc

    from flowtop.monitor import rankstate
    from flowtop.monitor.rankkernels import add_window, build_window
    from flowtop.monitor.wiring import make_model
    from probe.wire import Message, RankKey

    tpl = _templates()
    rng = random.Random(0)
    model = make_model()
    keys = [RankKey(JOB, f"node{r // 8:04d}", 10_000 + r, r, 0) for r in range(ranks)]
    seq = dict.fromkeys(keys, 0)
    now = 1000.0

    def ingest(key: RankKey, kind: str, fields: dict[str, Any]) -> None:
        seq[key] += 1
        model.ingest(Message(kind, key, seq[key], now, fields), now)

    def used() -> int:
        return tracemalloc.get_traced_memory()[0] if traced else _rss_bytes()

    gc.collect()
    if traced:
        tracemalloc.start()
    base = used()
    parts: dict[str, float] = {}
    mark = base

    def part(name: str) -> None:
        nonlocal mark
        gc.collect()
        cur = used()
        parts[name] = round((cur - mark) / ranks / 1024, 1)
        mark = cur

    for key in keys:
        ingest(key, "hello", {**tpl["hello"], "world_size": ranks, "local_rank": key.rank % 8})
        ingest(key, "flops", dict(tpl["flops"]))
    part("hello+flops")
    batches = -(-rankstate.RING // 10) + 2
    for b in range(batches):
        now += 0.1
        for key in keys:
            ingest(key, "steps", {"records": [_record(b * 10 + i + 1, 0.01, rng) for i in range(10)]})
    part(f"steps ({batches * 10} steps, ring {rankstate.RING})")
    for _ in range(300):
        now += 0.01
        for key in keys:
            gpu = {**tpl["telemetry"]["gpu"], "power_w": 500.0 + rng.random(), "tensor_active": rng.random()}
            ingest(key, "telemetry", {**tpl["telemetry"], "gpu": gpu})
    part("telemetry (300 samples)")
    stats = [build_window(tpl["kernels"]) for _ in range(2)]
    for key in keys:
        for s in stats:  # the windows' tables are shared here; each rank's cumulative table is its own
            add_window(model.ranks[key], s)
    part(KERNELS)
    model.tick(now)
    now += 0.5
    for key in keys:  # every rank changes: the next tick rebuilds every view
        ingest(key, "steps", {"records": [_record(batches * 10 + 1, 0.01, rng)]})
    snap = model.tick(now)
    part("views of two ticks")
    # A large job's views are kept for a round between their turns while the ranks go on: at a
    # 10 ms step under a 2 s pace each frame brings 200 steps and a ring turns over in two. What
    # views keep alive of blocks their ring dropped shows here (one frame of 100 steps a tick).
    step = batches * 10 + 1
    for _ in range(model.ticks_per_round(ranks)):
        now += 0.5
        records = [_record(step + i + 1, 0.01, rng) for i in range(100)]
        step += 100
        for key in keys:
            ingest(key, "steps", {"records": records})
        snap = model.tick(now)
    part("a round of ticks, 100 steps a frame (rings turned over)")
    total = used() - base
    where = {}
    if not traced:  # where the RSS is (see ingest's live JSON), then what a heap trim gives back
        where = {**_heap(), **_pymalloc(), "arenas": heapmap.arenas(), "smaps": heapmap.smaps()}
        from flowtop.monitor import heaptrim

        trim = heaptrim.glibc_trim()
        if trim is not None:
            trim()
            where["after_trim_kb_per_rank"] = round((used() - base) / ranks / 1024, 1)
            where["smaps_after_trim"] = heapmap.smaps()
    # Each rank's latest window is its own table: here they share one (building 4,096 takes
    # minutes), so one window's size is measured apart (traced) and added.
    if not traced:
        tracemalloc.start()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    own = build_window(tpl["kernels"])
    gc.collect()
    window_kb = (tracemalloc.get_traced_memory()[0] - before) / 1024
    tracemalloc.stop()
    del snap, own
    parts["latest kernel window (one rank's own, traced apart)"] = round(window_kb, 1)
    return {"ranks": ranks, "measure": "tracemalloc" if traced else "RSS", "kb_per_rank": round(total / ranks / 1024 + window_kb, 1),
            "kb_per_rank_without_kernel_data": round(total / ranks / 1024 - parts[KERNELS], 1),
            "ring_steps": rankstate.RING, "parts_kb_per_rank": parts, **where}


# --- the monitor's CPU cost per frame and per tick (one process, CPU time) ---------------------------


def costs(ranks: int, step_ms: float, flush_s: float, kernel_every_s: float, flops_every_s: float,
          records: bool = False) -> dict[str, Any]:
    """What one rank's frames and one tick cost the data thread, in CPU time of this process (the
    figure that does not change when other processes share the cores), and the share of a core
    ``ranks`` ranks at ``step_ms`` need: frames/s × (decode + ingest) + ticks/s × tick."""
    from flowtop.monitor.clock import TICK_S
    from flowtop.monitor.rankkernels import add_window, build_window
    from flowtop.monitor.wiring import make_model
    from probe import wire
    try:
        from probe.transport.outbox import HELLO_MAX_S  # a stepping rank's hello: its steps are its heartbeat
    except ImportError:
        try:  # a checkout from before the outbox's module (A/B runs): its publisher re-exported it
            from probe.transport.publisher import HELLO_MAX_S
        except ImportError:  # a checkout from before 8ad3187: a hello every 2 s
            HELLO_MAX_S = 2.0
    from probe.wire.steps import encode_fields

    from flowtop.monitor import gcpolicy

    gcpolicy.for_monitor()  # as the monitor's commands do
    tpl = _templates()
    rng = random.Random(0)
    model = make_model()
    keys = [wire.RankKey(JOB, f"node{r // 8:04d}", 10_000 + r, r, 0) for r in range(ranks)]
    seq = dict.fromkeys(keys, 0)
    now = [1000.0]
    step_s = step_ms / 1e3
    per_frame = max(1, round(flush_s / step_s)) if step_s < flush_s else 1
    spent: dict[str, list[float]] = {}

    def send(key: wire.RankKey, kind: str, fields: dict[str, Any], timed: bool = True) -> None:
        seq[key] += 1
        frame = wire.encode(kind, key, seq[key], now[0], fields)
        c = time.process_time()
        model.ingest(wire.decode(frame), now[0])
        if timed:
            spent.setdefault(kind, []).append(time.process_time() - c)

    step = [0]

    def steps_frame(key: wire.RankKey) -> None:
        recs = [_record(step[0] + i + 1, step_s, rng) for i in range(per_frame)]
        if records:  # the MINOR 2 wire: a list of record maps (a lone record as a "step")
            send(key, "steps", {"records": recs}) if len(recs) > 1 else send(key, "step", recs[0])
        else:
            send(key, "stepcols", encode_fields(recs, 0))

    for key in keys:
        hello = {**tpl["hello"], "world_size": ranks, "local_rank": key.rank % 8}
        send(key, "hello", hello, timed=False)  # the first makes the rank
        send(key, "hello", dict(hello))  # timed: the one every HELLO_MAX_S after it, unchanged
        send(key, "flops", dict(tpl["flops"]))
    window = build_window(tpl["kernels"])
    for b in range(40):
        now[0] += flush_s
        for key in keys:
            steps_frame(key)
        step[0] += per_frame
    for key in keys:
        send(key, "telemetry", dict(tpl["telemetry"]), timed=False)  # the first sample makes the series
        send(key, "telemetry", dict(tpl["telemetry"]))  # steady state: the one timed
        add_window(model.ranks[key], window)
    ticks = []
    # A job larger than RANKS_PER_TICK spreads its full refresh and its hints over several ticks:
    # the mean over whole rounds is what the data thread pays.
    try:
        from flowtop.monitor.rotation import RANKS_PER_TICK
    except ImportError:  # a checkout from before 95a3010 (A/B runs)
        from flowtop.monitor.model import RANKS_PER_TICK
    for _ in range(4 * -(-ranks // RANKS_PER_TICK) + 1):
        now[0] += TICK_S
        for key in keys:  # every rank changed since the last tick (they all send ~10 frames/s)
            steps_frame(key)
        step[0] += per_frame
        c = time.process_time()
        model.tick(now[0])
        ticks.append(time.process_time() - c)
    kern = wire.encode("kernels", keys[0], 10**6, now[0], {**tpl["kernels"], "step": step[0], "window": 1})
    c = time.process_time()
    for _ in range(3):
        wire.decode(kern)
    kernel_decode = (time.process_time() - c) / 3
    # What the data thread pays per window where a builder decodes it (flowtop.monitor.collector):
    # its envelope, admitted or refused; a checkout from before e8e8288 decodes it whole there.
    envelope = getattr(wire, "envelope", None)
    c = time.process_time()
    for _ in range(20):
        envelope(kern) if envelope is not None else wire.decode(kern)
    kernel_head = (time.process_time() - c) / 20
    c = time.process_time()
    build_window(kern if envelope is not None else dict(wire.decode(kern).fields))
    kernel_build = time.process_time() - c
    us = {k: 1e6 * statistics.median(v) for k, v in spent.items()}
    frame_kind = ("steps" if per_frame > 1 else "step") if records else "stepcols"
    rates = {frame_kind: min(1.0 / step_s, 1.0 / flush_s) if per_frame > 1 else 1.0 / step_s,
             "telemetry": 1.0 / _telemetry_s(flush_s, _paced_telemetry_s()), "hello": 1.0 / _hello_max_s(flush_s, HELLO_MAX_S), "flops": 1.0 / flops_every_s}
    per_rank_s = sum(rates[k] * us[k] / 1e6 for k in rates)
    tick_s = statistics.mean(ticks[1:])  # the first tick builds every view
    return {
        "ranks": ranks, "step_ms": step_ms, "flush_s": flush_s, "records_per_frame": per_frame,
        "decode_ingest_us": {k: round(v, 1) for k, v in us.items()},
        "kernels_decode_ms": round(1e3 * kernel_decode, 1),
        "kernels_envelope_ms": round(1e3 * kernel_head, 3),
        "kernels_decode_build_ms": round(1e3 * kernel_build, 1),
        "frames_per_s": round(ranks * sum(rates.values())),
        "tick_cpu_ms": round(1e3 * tick_s, 1),
        # The longest tick holds every frame behind it (their latency): a large job's views and
        # rules take turns so that no tick does them all.
        "tick_cpu_ms_max": round(1e3 * max(ticks[1:]), 1),
        "data_thread_core_pct": {
            "frames": round(100 * ranks * per_rank_s, 1),
            "ticks": round(100 * tick_s / TICK_S, 1),
            # every window's envelope (refused ones too); the builder decodes the admitted ones
            "kernel_windows": round(100 * ranks / kernel_every_s * kernel_head, 1) if kernel_every_s > 0 else 0.0,
        },
        # The builder (a process of the monitor's own): admitted windows, decoded and built.
        "builder_core_pct": round(100 * min(ranks / kernel_every_s, 2 * 2**20 / len(kern)) * kernel_build, 1)
        if kernel_every_s > 0 else 0.0,
    }


# --- output ----------------------------------------------------------------------------------------


def _fmt(v: Any, spec: str = ".0f") -> str:
    return "—" if v is None else format(v, spec)


def print_row(r: dict[str, Any]) -> None:
    head = f"{r['ranks']:>5} {r['step_ms']:>4.0f} ms {r['path'] + (' (%d, %s)' % (r['relays'], r['relay_host']) if r['relays'] else ''):<20}"
    if "error" in r:
        print(f"{head} {r['error']}", flush=True)
        return
    cpu = r["cpu_pct"]
    # data: the monitor's data thread less the bench's latency sampler on it (hook); ticks: its share in ticks
    data = None if cpu.get("data") is None else cpu["data"] - r.get("hook_cpu_pct", 0.0)
    print(f"{head} {r['delivered_pct']:>7.2f} %  data {_fmt(data)} (ticks {_fmt(r.get('tick_cpu_pct'))}, "
          f"hook {_fmt(r.get('hook_cpu_pct'), '.1f')}) ui {_fmt(cpu.get('ui'))} "
          f"zmq {_fmt(cpu.get('zmq'))} kern {_fmt(cpu.get('kernels'))} all {_fmt(r['cpu_pct_total'])} %  "
          f"lat {_fmt(r['latency_ms_p50'])}/{_fmt(r['latency_ms_p99'])} ms  "
          f"tick {_fmt(r['tick_ms_p50'])}/{_fmt(r['tick_ms_p99'])} ms  show {_fmt(r['ui_show_ms_p50'])}/{_fmt(r['ui_show_ms_p99'])} ms  "
          f"refresh {_fmt(r.get('ui_refresh_ms_p50'))}/{_fmt(r.get('ui_refresh_ms_p99'))} ms  "
          f"RSS {r['rss_per_rank_kb']:.0f} KB/rank (settled {_fmt(r.get('rss_settled_per_rank_kb'))})  pace {_paces(r['paces_s'])}  | sim {r['sim_cpu_pct']:.0f} % relays {_fmt(r['relay_cpu_pct'])} % "
          f"load {r['load_1m'][0]:.1f}-{r['load_1m'][1]:.1f}  seen {r['ranks_seen']}", flush=True)


def _paces(paces: dict[str, float]) -> str:
    """The flush intervals the ranks kept, longest-held first: ``0.45 s (18 s), 0.7 s (4 s)``."""
    held = sorted(paces.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} s ({v:.0f} s)" for k, v in held[:3]) or "—"


def _telemetry_s(flush_s: float, max_s: float | None = None) -> float:
    """A probe's telemetry interval (1 s) when the monitor's pace holds its step records ``flush_s``
    and lets it stretch to ``max_s`` (None: the pace did not say, or the probe paces itself)."""
    from flowtop.monitor.pacing import DEFAULT_FLUSH_S
    from probe.wire.pace import paced_interval

    return paced_interval(1.0, DEFAULT_FLUSH_S, flush_s) if max_s is None else \
        paced_interval(1.0, DEFAULT_FLUSH_S, flush_s, max_s)


def _hello_max_s(pace_s: float | None, hello_max_s: float) -> float:
    """A stepping probe's longest gap between two hellos under a monitor's pace of ``pace_s``
    (None: none holds; probe.transport.outbox.hello_max_s; a checkout from before it: its own
    ``hello_max_s``)."""
    from flowtop.monitor.pacing import DEFAULT_FLUSH_S

    if pace_s is None:
        return hello_max_s
    try:
        from probe.wire.pace import paced_interval
        try:
            from probe.transport.outbox import HELLO_PACED_MAX_S
        except ImportError:  # a checkout from before the outbox's module
            from probe.transport.sender import HELLO_PACED_MAX_S
    except ImportError:
        return hello_max_s
    return paced_interval(hello_max_s, DEFAULT_FLUSH_S, max(DEFAULT_FLUSH_S, pace_s), HELLO_PACED_MAX_S)


def _relay_report_s(pace_s: float | None) -> float:
    """A relay's report interval (flowtop.tools.relay) while batches leave, under a monitor's pace
    of ``pace_s`` (None: none holds); a checkout from before paced reports: the simulator's 2 s."""
    try:
        from flowtop.tools.relay import REPORT_PACED_MAX_S, RelayConfig
    except ImportError:
        return 2.0
    from flowtop.monitor.pacing import DEFAULT_FLUSH_S
    from probe.wire.pace import paced_interval

    every = RelayConfig.report_s  # the default
    return every if pace_s is None else paced_interval(every, DEFAULT_FLUSH_S, pace_s, REPORT_PACED_MAX_S)


def _paced_telemetry_s() -> float | None:
    """The longest telemetry interval this checkout's monitor lets its paced ranks stretch to
    (None in a checkout from before the pace said so)."""
    from flowtop.monitor import pacing

    return getattr(pacing, "PACED_TELEMETRY_S", None)


def _flush_s(arg: str, ranks: int) -> float:
    """A rank's flush interval: the number given, or (auto) what a probe that knows its job's
    size starts at, the pace the monitor asks of that many ranks (probe.wire.pace)."""
    if arg != "auto":
        return float(arg)
    try:
        from probe.wire.pace import DEFAULT_FLUSH_S, pace_for
    except ImportError:  # a checkout from before the probes started paced (A/B runs): the monitor's
        from flowtop.monitor.pacing import DEFAULT_FLUSH_S, pace_for  # type: ignore[no-redef]

    return pace_for(ranks) or DEFAULT_FLUSH_S


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="256,1024,4096", help="comma-separated rank counts")
    ap.add_argument("--step-ms", default="10,200", help="comma-separated step times in ms")
    ap.add_argument("--paths", default="direct,relay", help="comma-separated: direct, relay or direct,relay")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per configuration")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds after the ranks start before measuring")
    ap.add_argument("--drain-s", type=float, default=3.0, help="seconds between the ranks' stop and the count")
    ap.add_argument("--workers", type=int, default=4, help="simulator processes")
    ap.add_argument("--per-relay", type=int, default=8)
    ap.add_argument("--relay-host", choices=("auto", "cli", "threads", "sim"), default="auto",
                    help="sim: no relay processes; each simulator worker sends its nodes' frames upstream as "
                    "their relays would (one connection per node, [stamp, frame, ...] batches, a report every "
                    "2 s): the monitor's side of a relayed job at a scale whose relays the cores cannot also run")
    ap.add_argument("--relays-per-proc", type=int, default=32)
    ap.add_argument("--relay-context", choices=("shared", "own"), default="shared",
                    help="--relay-host threads: the relays of a process share one ZeroMQ context (default), or "
                    "each has its own as a `flowtop relay` process does (one I/O thread each)")
    ap.add_argument("--flush-s", default=os.environ.get("FLOWTOP_FLUSH_S", "auto"),
                    help="seconds between a rank's step frames; 'auto' (default): what a probe starts at, 0.1 s or the "
                    "pace the monitor asks of that many ranks (probe.wire.pace)")
    ap.add_argument("--single", action="store_true", help="one 'step' frame per step (the pre-batching wire)")
    ap.add_argument("--records", action="store_true", help="step batches as lists of record maps (wire MINOR 2) "
                    "instead of columns (MINOR 3, what the probe sends)")
    ap.add_argument("--flops-every-s", type=float, default=30.0)
    ap.add_argument("--kernel-every-s", type=float, default=120.0, help="per rank, random phase (0: none)")
    ap.add_argument("--straggler", type=int, default=-1, metavar="RANK",
                    help="this rank's forward ends 40 %% of a step after the others' each step (its lead, as a "
                    "synchronous job's straggler); the JSON says which straggler hints the monitor raised and when")
    ap.add_argument("--trace-memory", type=int, default=0, metavar="FRAMES",
                    help="the monitor traces its allocations (tracemalloc, this many frames each: slower) and the "
                    "JSON lists the tracebacks holding the most at the end (traced_top_kb)")
    ap.add_argument("--ui", choices=("textual", "none"), default="textual")
    ap.add_argument("--memory", type=int, default=0, metavar="RANKS", help="only measure the model's memory per rank")
    ap.add_argument("--rss", action="store_true", help="with --memory: RSS growth instead of tracemalloc")
    ap.add_argument("--costs", action="store_true", help="only measure the data thread's CPU per frame and tick "
                    "(for --ranks × --step-ms) and the share of a core they add up to")
    ap.add_argument("--json", default=None, metavar="FILE", help="append one JSON line per configuration")
    ap.add_argument("--_monitor", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    unknown = sorted(set(args.paths.split(",")) - {"direct", "relay"})
    if unknown:  # "both" ran the ranks direct under a misleading label
        ap.error(f"--paths: {', '.join(unknown)} is not a path (direct, relay or direct,relay)")
    if args._monitor:
        return _monitor_main(args._monitor, args.ui, args._dir)
    os.environ.setdefault("FLOWTOP_DISABLE", "1")
    if args.trace_memory:  # the monitor (a child) reads it
        os.environ["BENCH_TRACE_MEMORY"] = str(args.trace_memory)
    if args.memory:
        print(json.dumps(memory(args.memory, traced=not args.rss)), flush=True)
        return 0
    if args.costs:
        for ranks in (int(x) for x in args.ranks.split(",")):
            for step_ms in (float(x) for x in args.step_ms.split(",")):
                row = costs(ranks, step_ms, _flush_s(args.flush_s, ranks), args.kernel_every_s, args.flops_every_s,
                            args.records)
                print(json.dumps(row), flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps({"costs": row}) + "\n")
        return 0
    soft, hard = raise_nofile()
    print(f"open files: soft {soft}, hard {hard}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}; "
          f"flush {args.flush_s} s; ui {args.ui}; {'single step frames' if args.single else 'batched steps'}", flush=True)
    print("ranks step  path                 delivered  monitor CPU % of a core         publish→snapshot  "
          "tick p50/p99  ui show     memory        | load", flush=True)
    for ranks in (int(x) for x in args.ranks.split(",")):
        for step_ms in (float(x) for x in args.step_ms.split(",")):
            for path in args.paths.split(","):
                try:
                    row = run_config(ranks, step_ms, path, args)
                except Exception as exc:  # one configuration failing must not lose the others
                    row = {"ranks": ranks, "step_ms": step_ms, "path": path, "relays": 0,
                           "error": f"{type(exc).__name__}: {exc}"[:600]}
                print_row(row)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
