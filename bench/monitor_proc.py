"""A real flowtop monitor in a child process, for benchmarks.

The monitor runs as ``flowtop snapshot --json`` in its own interpreter so that decoding the probe's
messages never competes for the benchmark's GIL; :meth:`MonitorProcess.snapshot` interrupts it
(SIGINT) and returns the JSON snapshot it prints, taken at that moment.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class MonitorProcess:
    """``flowtop snapshot`` on a free loopback port; optionally records every frame."""

    def __init__(self, record: str | Path | None = None, peak_tflops: float | None = None) -> None:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from flowtop.demo.launch import free_port_pair

        self.listen = f"tcp://127.0.0.1:{free_port_pair()}"
        cmd = [sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", self.listen,
               "--timeout", "3600", "--json"]
        if record is not None:
            cmd += ["--record", str(record)]
        if peak_tflops is not None:
            cmd += ["--peak-tflops", str(peak_tflops)]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      cwd=str(ROOT))
        time.sleep(1.5)  # bind before the first probe connects (the probe also retries)
        if self._proc.poll() is not None:
            raise RuntimeError(f"monitor exited at start: {self._proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]

    def interrupt(self) -> None:
        """Ask the monitor for its snapshot now (it takes it within 0.1 s); read it with
        :meth:`snapshot`. Training can go on meanwhile, so the telemetry it shows is live."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)

    def snapshot(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Stop the monitor and return its JSON snapshot (``{"error": ...}`` if it printed none)."""
        self.interrupt()
        try:
            out, err = self._proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, err = self._proc.communicate()
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            return {"error": f"monitor printed no JSON (exit {self._proc.returncode}): {err[-2000:]}"}

    def close(self) -> None:
        """Kill the monitor if it still runs."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()
