#!/usr/bin/env python
"""A command flood from the monitor's side, against a real CPU training loop with the probe.

    python bench/command_flood.py [--rounds 4] [--steps 40] [--frame junk|other] [--rate 50000]

Something that accepts the probe's connection where the monitor listens (a process squatting the
monitor's port) can send it command frames as fast as it likes. A *flooder process* (its own
interpreter: it must not share the trainer's GIL) binds a real XSUB where the probe connects,
subscribes like a monitor, and in alternate blocks of ``--steps`` steps sends ``--rate`` command
frames a second (0: as fast as it can), at nice 19 (``junk``: malformed frames, refused; ``other``: well-formed
``kernels_now`` for another job, ignored). The trainer (this process) runs a small MLP with the
probe attached (FLOP counting and kernel windows off: steps only) and prints one JSON object:

* ``step_ms``: median step time per arm (quiet / flood), over ``--rounds`` interleaved blocks,
  ``ratio`` (flood / quiet) and each round's (``round_ratios``): on a 2-core box the flooder's own
  CPU slows training too, whoever reads its frames;
* ``sender_cpu``: the probe sender thread's CPU seconds per wall second, per arm;
  ``process_cpu``: the trainer's (training, sender and libzmq's threads);
* ``rss_mb_growth``: the trainer's RSS growth over the flood blocks (what the probe's socket
  queued);
* what the flooder sent and what the probe counted (``control_rejected``, ``commands_dropped``).

Figures, no assertions (tests/test_command_flood.py checks the behaviour).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _frame(kind: str) -> bytes:
    from probe import wire

    if kind == "other":
        return wire.encode_control("kernels_now", "someone-else", 0)
    return b"\x02not a command" + b"x" * 32


def flooder(addr: str, kind: str, rate: float, flooding: Any, done: Any, sent: Any) -> None:
    """The squatter: an XSUB bound at ``addr`` that subscribes and floods while ``flooding``, at
    ``rate`` frames a second (0: as fast as it can)."""
    import zmq

    os.nice(19)  # a squatter elsewhere (the monitor's host) takes none of the trainer's cores
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XSUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(addr)
    sock.send(b"\x01")  # subscribe, as a monitor does: the probe then counts it as listening
    frame = _frame(kind)
    count, burst = 0, 256 if rate <= 0 else max(1, int(rate / 100))
    while not done.is_set():
        while sock.poll(0):  # the probe's frames: taken and thrown away
            sock.recv()
        if not flooding.is_set():
            time.sleep(0.005)
            continue
        for _ in range(burst):
            try:
                sock.send(frame, zmq.NOBLOCK)
                count += 1
            except zmq.Again:  # (an XSUB drops at its high-water mark: "sent" counts those too)
                time.sleep(0.001)
                break
        sent.value = count
        if rate > 0:
            time.sleep(0.01)  # ~rate a second: the flooder's own CPU alike in every run
    sock.close(0)
    ctx.term()


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _process_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _thread_cpu(thread: Any) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--frame", choices=("junk", "other"), default="junk")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--rate", type=float, default=50_000, help="frames a second the flooder sends (0: all it can)")
    args = ap.parse_args()

    os.environ.setdefault("FLOWTOP_FLOPS", "0")
    os.environ.setdefault("FLOWTOP_KERNELS", "0")
    import torch

    import probe
    from flowtop.tools.demo.launch import free_port

    torch.set_num_threads(1)
    addr = f"tcp://127.0.0.1:{free_port()}"
    spawn = mp.get_context("spawn")
    flooding, done, sent = spawn.Event(), spawn.Event(), spawn.Value("q", 0)
    proc = spawn.Process(target=flooder, args=(addr, args.frame, args.rate, flooding, done, sent), daemon=True)
    proc.start()
    time.sleep(1.0)
    if not proc.is_alive():
        raise SystemExit(f"the flooder could not bind {addr} (exit status {proc.exitcode})")
    assert probe.attach(job="flood-bench", rank=0, world_size=1, addr=addr)
    runtime = probe._probe
    pub = runtime.publisher
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(w, 4 * w), torch.nn.ReLU(), torch.nn.Linear(4 * w, w))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, w)

    def block(n: int) -> list[float]:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
        return times

    block(args.steps)  # warm-up; the monitor's subscription arrives
    steps: dict[str, list[float]] = {"quiet": [], "flood": []}
    cpu: dict[str, list[float]] = {"quiet": [], "flood": []}
    proc_cpu: dict[str, list[float]] = {"quiet": [], "flood": []}
    rss_growth, ratios = 0.0, []
    for _ in range(args.rounds):
        for arm in ("quiet", "flood"):
            (flooding.set if arm == "flood" else flooding.clear)()
            time.sleep(0.3)  # the flood reaches its pace (or the last one drains)
            rss0, c0, p0, t0 = _rss_mb(), _thread_cpu(pub._thread), _process_cpu(), time.monotonic()
            steps[arm].extend(block(args.steps))
            cpu[arm].append((_thread_cpu(pub._thread) - c0) / (time.monotonic() - t0))
            proc_cpu[arm].append((_process_cpu() - p0) / (time.monotonic() - t0))
            if arm == "flood":
                rss_growth += _rss_mb() - rss0
        ratios.append(statistics.median(steps["flood"][-args.steps:]) / statistics.median(steps["quiet"][-args.steps:]))
    flooding.clear()
    quiet, flood = statistics.median(steps["quiet"]), statistics.median(steps["flood"])
    out = {
        "frame": args.frame,
        "rate": args.rate,
        "step_ms": {"quiet": round(quiet * 1e3, 2), "flood": round(flood * 1e3, 2)},
        "ratio": round(flood / quiet, 4),
        "round_ratios": [round(r, 3) for r in ratios],
        "sender_cpu": {arm: round(statistics.median(v), 4) for arm, v in cpu.items()},
        "process_cpu": {arm: round(statistics.median(v), 3) for arm, v in proc_cpu.items()},
        "rss_mb_growth": round(rss_growth, 1),
        "flooder_sent": sent.value,
        "control_rejected": pub.control_rejected,
        "commands_dropped": getattr(pub, "commands_dropped", None),
        "load": os.getloadavg()[0],
    }
    done.set()
    proc.join(5)
    probe.detach()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
