#!/usr/bin/env python
"""How long the monitor's event loop stalls when every rank's kernel window arrives at once.

A synchronous job's ranks profile the same step, so their windows land together. This feeds
``--ranks`` copies of a real window (the 940 M-parameter GPT's step recorded on an H200: 4,672
records) into a monitor model on an asyncio loop, built inline (on the loop), on the kernel
worker's builder thread (a replay) and in its builder process (the live collector), while a 1 ms
ticker measures the loop's longest gap. Prints one JSON object.

    python bench/kernel_windows.py --ranks 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flowtop.monitor.kernel_worker import KernelWorker  # noqa: E402
from flowtop.monitor.recording import read_frames  # noqa: E402
from flowtop.monitor.rankkernels import build_window  # noqa: E402
from flowtop.monitor.wiring import make_model  # noqa: E402
from probe import wire  # noqa: E402

RECORDING = ROOT / "tests" / "data" / "h200-gpt-large.rec.gz"


def _messages(ranks: int) -> tuple[list[wire.Message], list[wire.Message]]:
    """A hello and a step per rank, then one kernel window per rank (copies of the real one)."""
    setup: list[wire.Message] = []
    window: wire.Message | None = None
    for _, frame in read_frames(RECORDING):
        msg = wire.decode(frame)
        if msg.kind in ("hello", "step") and len(setup) < 2:
            setup.append(msg)
        elif msg.kind == "kernels":
            window = msg
            break
    assert window is not None
    keyed = [window._replace(key=window.key._replace(rank=r)) for r in range(ranks)]
    prep = [m._replace(key=m.key._replace(rank=r)) for r in range(ranks) for m in setup]
    return prep, keyed


async def _run(ranks: int, offload: bool, processes: bool = False) -> dict[str, Any]:
    prep, windows = _messages(ranks)
    model = make_model()
    worker = KernelWorker(model, build_window, processes=processes) if offload else None
    if worker is not None:
        model.offload_kernels(worker.submit)
    for msg in prep:
        model.ingest(msg, 0.0)
    gaps: list[float] = []
    stop = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.get_running_loop().create_task(ticker())
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    for msg in windows:  # all at once, as the collector drains a batch
        model.ingest(msg, 1.0)
    await asyncio.sleep(0)
    if worker is not None:
        await worker.idle()
        worker.close()
    total = time.perf_counter() - t0
    stop = True
    await tick
    built = sum(1 for st in model.ranks.values() if st.kernels is not None)
    return {"max_loop_gap_ms": max(gaps) * 1e3, "all_built_ms": total * 1e3, "windows_built": built}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=16)
    args = ap.parse_args()
    inline = asyncio.run(_run(args.ranks, offload=False))
    worker = asyncio.run(_run(args.ranks, offload=True))
    process = asyncio.run(_run(args.ranks, offload=True, processes=True))
    print(json.dumps({"ranks": args.ranks, "inline": inline, "worker": worker, "process": process,
                      "max_gap_ratio_worker_over_inline": worker["max_loop_gap_ms"] / inline["max_loop_gap_ms"],
                      "max_gap_ratio_process_over_inline": process["max_loop_gap_ms"] / inline["max_loop_gap_ms"]},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
