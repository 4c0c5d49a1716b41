"""The recorder's cost per frame on the monitor's data thread (Recorder.write, as the collector
calls it for every frame received), for the frames of a real recording.

    python bench/recorder_write.py                       # the H200 recording's frames, 11 rounds
    python bench/recorder_write.py --against /tmp/base   # interleaved with another checkout's Recorder

``--against DIR``: a checkout of another commit (``git archive COMMIT | tar -x -C DIR``); its
``flowtop/monitor/recording.py`` Recorder is loaded beside this one and the rounds alternate, so
both see the same load. Prints µs per frame (least and median round) for all frames in recorded
order, the step frames (the bulk: ~216 B) and the kernel windows (~80 KB). The file is written
to ``--out`` (tmpfs by default: the CPU is measured, not the disk).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flowtop.monitor.recording import Recorder, read_frames  # noqa: E402
from probe import wire  # noqa: E402

REC = ROOT / "tests" / "data" / "h200-gpt-small.rec.gz"


def one_round(recorder: Any, frames: list[bytes], out: Path) -> float:
    """µs per Recorder.write of ``frames`` (closing the file not counted)."""
    rec = recorder(out)
    rec.start(0.0)
    t = time.perf_counter()
    for i, frame in enumerate(frames):
        rec.write(i * 1e-3, frame)
    took = (time.perf_counter() - t) / len(frames) * 1e6
    rec.close()
    return took


def other_recorder(checkout: Path) -> Any:
    spec = importlib.util.spec_from_file_location("other_recording", checkout / "flowtop" / "monitor" / "recording.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Recorder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--against", type=Path, help="another checkout whose Recorder runs interleaved")
    ap.add_argument("--out", type=Path, default=Path("/dev/shm/flowtop-recorder-bench.rec"))
    args = ap.parse_args()
    recorders = {"this": Recorder}
    if args.against:
        recorders["against"] = other_recorder(args.against)
    frames = [frame for _, frame in read_frames(REC)]
    kinds: dict[str, list[bytes]] = {}
    for frame in frames:
        kinds.setdefault(wire.decode(frame).kind, []).append(frame)
    for name, group in (("all, in order", frames), ("step", kinds["step"]), ("kernels", kinds["kernels"])):
        group = group * max(1, 20_000 // len(group))  # enough writes for a steady figure
        times: dict[str, list[float]] = {k: [] for k in recorders}
        for _ in range(args.rounds):
            for k, recorder in recorders.items():
                times[k].append(one_round(recorder, group, args.out))
        size = sum(map(len, group)) / len(group)
        print(f"{name:14} {size:6.0f} B: " + ", ".join(
            f"{k} {min(v):6.2f} µs least, {statistics.median(v):6.2f} median" for k, v in times.items()))
    args.out.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
