"""Regenerate tests/data/demo-2rank.rec: a real 2-rank CPU DDP run recorded by `flowtop snapshot --record`.

    python tests/data/make_recording.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from flowtop.tools.demo.launch import free_port_pair, training_command  # noqa: E402

OUT = Path(__file__).resolve().parent / "demo-2rank.rec"


def main() -> int:
    """Record one short run."""
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    monitor = subprocess.Popen(
        [sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", listen, "--record", str(OUT),
         "--until-done", "--timeout", "120"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.5)
    train = [sys.executable, "-m", "flowtop.cli", "run", "--connect", listen, "--",
             *training_command(2, 60, ["--batch=4", "--seq=64"])]  # fmt: skip
    subprocess.run(train, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return monitor.wait(60)


if __name__ == "__main__":
    raise SystemExit(main())
