"""RSS slope of a long CPU training with kernel windows on, against the probe off (issue 10).

Runs the demo GPT (set_num_threads(1), AdamW) with the real probe and a real monitor, windows
forced as often as the probe allows (every other step), and prints the resident memory every
100 steps and its slope per 1,000 steps (least squares over the samples after warm-up).

    python bench/memory_windows.py --steps 1000 [--mode windows|off|default]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CHILD = textwrap.dedent(
    """
    import os, sys, time, torch, psutil
    mode, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    import probe
    probe.attach()
    p = probe._current()
    if mode == "windows":
        from probe.kernels.schedule import WindowScheduler
        p._kernels.scheduler = WindowScheduler(min_interval_steps=1, max_interval_steps=1, align_steps=False)
    while p is not None and p.publisher.subscribers == 0:
        time.sleep(0.05)
    from flowtop.tools.demo.gpt import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=2048, n_layer=2, n_head=4, n_embd=128, block_size=128)
    model = GPT(cfg); opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    proc = psutil.Process()
    for i in range(steps):
        idx = torch.randint(0, cfg.vocab_size, (8, 128))
        _, loss = model(idx, torch.roll(idx, -1, dims=1)); loss.backward(); opt.step(); opt.zero_grad()
        if i % 100 == 0:
            print(i, proc.memory_info().rss, flush=True)
    k = p._kernels if p is not None else None
    print("windows", k.windows if k else 0, "retained", k.retained_bytes if k else 0, flush=True)
    """
)


def slope_per_1000(samples: list[tuple[int, int]]) -> float:
    """Least-squares MB per 1,000 steps."""
    n = len(samples)
    mx = sum(s for s, _ in samples) / n
    my = sum(r for _, r in samples) / n
    num = sum((s - mx) * (r - my) for s, r in samples)
    den = sum((s - mx) ** 2 for s, _ in samples) or 1.0
    return num / den * 1000 / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--mode", choices=("windows", "off", "default"), default="windows")
    args = ap.parse_args()
    from monitor_thread import MonitorThread

    monitor = MonitorThread()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTOP_")}
    env.update(FLOWTOP_ADDR=monitor.listen, PYTHONPATH=str(ROOT), FLOWTOP_FLOPS="0")
    if args.mode == "off":
        env["FLOWTOP_KERNELS"] = "0"
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, args.mode, str(args.steps)], env=env,
                             capture_output=True, text=True, check=True).stdout
    finally:
        monitor.close()
    samples = [(int(a), int(b)) for a, b in (line.split() for line in out.splitlines() if line[:1].isdigit())]
    for step, rss in samples:
        print(f"step {step:>6}  RSS {rss / 2**20:8.1f} MB")
    print(out.splitlines()[-1])
    late = [s for s in samples if s[0] >= 200]
    print(f"mode {args.mode}: RSS slope {slope_per_1000(late):+.1f} MB per 1,000 steps (steps >= 200)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
