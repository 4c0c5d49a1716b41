#!/usr/bin/env python
"""A command flood from a node relay's upstream side: the relay process's CPU, and what reaches its ranks.

    python bench/relay_flood.py [--rounds 3] [--seconds 3] [--ranks 4] [--rate 50000]
                                [--tree after=. --tree before=/path/to/an/older/checkout]

Something that accepts the relay's upstream connection where the monitor listens (a process
squatting the monitor's port) can send it command frames as fast as it likes. The flooder of
bench/command_flood.py (its own process, at nice 19: an XSUB bound where the relay connects, which
subscribes like a monitor) sends ``--rate`` malformed command frames a second in alternate blocks
of ``--seconds``. A real ``flowtop relay`` process (one per ``--tree``: the source tree it runs
from, for before/after figures in one run, interleaved round by round) forwards to it; ``--ranks``
bare rank sockets behind the relay (in this process) send a small frame every 50 ms each and count
the flood's frames that reach them. One JSON object per tree:

* ``relay_cpu``: the relay process's CPU seconds per wall second, median per arm (quiet / flood);
* ``ranks_cpu``: this process's (the rank sockets': what the ranks pay to read what comes down);
* ``per_rank_per_s``: the flood's frames each rank received a second in the flood blocks;
* ``relay_rss_mb``: the relay's resident memory at the end of the last flood block.

Figures, no assertions (tests/test_relay_flood.py checks the behaviour).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH)

from command_flood import _frame, flooder  # noqa: E402 - the same squatter as the probe's bench


def _cpu(proc: Any) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _block(socks: list[Any], seconds: float, flood: bytes) -> int:
    """Run the ranks for ``seconds``: each reads what comes down and sends a frame every 50 ms;
    the flood's frames they received."""
    import zmq

    from probe import wire

    got, seq, end, next_send = 0, 0, time.monotonic() + seconds, 0.0
    while (now := time.monotonic()) < end:
        for s in socks:
            while s.poll(0):
                if s.recv() == flood:
                    got += 1
        if now >= next_send:
            seq += 1
            for i, s in enumerate(socks):
                s.send(wire.encode("hello", wire.RankKey("bench", "node", 100 + i, i, 0), seq, time.time(), {}),
                       zmq.NOBLOCK)
            next_send = now + 0.05
        time.sleep(0.005)
    return got


def _run_tree(tree: str, addr: str, args: argparse.Namespace, flooding: Any, out: dict[str, Any]) -> None:
    import psutil
    import zmq

    d = tempfile.mkdtemp(prefix="rfb")
    listen = f"ipc://{d}/r.sock"
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    relay = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "relay", "--listen", listen, "--connect", addr],
                             cwd=os.path.abspath(tree), env=env, stderr=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    socks = []
    try:
        for _ in range(args.ranks):
            s = ctx.socket(zmq.XPUB)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(listen)
            socks.append(s)
        for s in socks:  # the relay subscribes its ranks once its monitor (the flooder) did
            if not s.poll(15_000):
                raise SystemExit(f"the relay of {tree} never subscribed its ranks: {relay.stderr}")
            s.recv()
        proc = psutil.Process(relay.pid)
        flood = _frame("junk")
        for arm in ("quiet", "flood"):
            (flooding.set if arm == "flood" else flooding.clear)()
            time.sleep(0.3)  # the flood reaches its pace (or the last one drains)
            c0, s0, t0 = _cpu(proc), _self_cpu(), time.monotonic()
            got = _block(socks, args.seconds, flood)
            wall = time.monotonic() - t0
            out["relay_cpu"][arm].append((_cpu(proc) - c0) / wall)
            out["ranks_cpu"][arm].append((_self_cpu() - s0) / wall)
            if arm == "flood":
                out["per_rank_per_s"].append(got / args.ranks / wall)
                out["relay_rss_mb"] = round(proc.memory_info().rss / 1e6, 1)
        flooding.clear()
    finally:
        relay.terminate()
        try:
            _, err = relay.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            relay.kill()
            _, err = relay.communicate()
        out["said"] = [line for line in err.splitlines() if "commands/s" in line][:1]
        for s in socks:
            s.close(0)
        ctx.term()
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rate", type=float, default=50_000, help="frames a second the flooder sends (0: all it can)")
    ap.add_argument("--tree", action="append", default=[],
                    help="NAME=PATH: a source tree a relay runs from (default: after=this checkout)")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"after": ROOT}

    from flowtop.tools.demo.launch import free_port

    addr = f"tcp://127.0.0.1:{free_port()}"
    spawn = mp.get_context("spawn")
    flooding, done, sent = spawn.Event(), spawn.Event(), spawn.Value("q", 0)
    squatter = spawn.Process(target=flooder, args=(addr, "junk", args.rate, flooding, done, sent), daemon=True)
    squatter.start()
    time.sleep(1.0)
    if not squatter.is_alive():
        raise SystemExit(f"the flooder could not bind {addr} (exit status {squatter.exitcode})")
    results: dict[str, dict[str, Any]] = {
        name: {"relay_cpu": {"quiet": [], "flood": []}, "ranks_cpu": {"quiet": [], "flood": []},
               "per_rank_per_s": [], "relay_rss_mb": None, "said": []} for name in trees}
    t0 = time.monotonic()
    for _ in range(args.rounds):
        for name, tree in trees.items():
            _run_tree(tree, addr, args, flooding, results[name])
    flood_s = args.rounds * len(trees) * args.seconds
    for name, r in results.items():
        print(json.dumps({
            "tree": name, "rate": args.rate, "ranks": args.ranks,
            "relay_cpu": {arm: round(statistics.median(v), 4) for arm, v in r["relay_cpu"].items()},
            "relay_cpu_rounds": {arm: [round(x, 4) for x in v] for arm, v in r["relay_cpu"].items()},
            "ranks_cpu": {arm: round(statistics.median(v), 4) for arm, v in r["ranks_cpu"].items()},
            "per_rank_per_s": round(statistics.median(r["per_rank_per_s"]), 1),
            "relay_rss_mb": r["relay_rss_mb"], "said": r["said"],
        }))
    print(json.dumps({"flooder_sent_per_s": round(sent.value / flood_s), "wall_s": round(time.monotonic() - t0),
                      "load": os.getloadavg()[0]}))
    done.set()
    squatter.join(5)


if __name__ == "__main__":
    main()
