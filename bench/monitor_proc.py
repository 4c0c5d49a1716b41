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
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class MonitorProcess:
    """``flowtop snapshot`` on a free loopback port; optionally records every frame."""

    def __init__(self, record: str | Path | None = None, peak_tflops: float | None = None) -> None:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from flowtop.tools.demo.launch import free_port_pair

        self.listen = f"tcp://127.0.0.1:{free_port_pair()}"
        cmd = [sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", self.listen,
               "--timeout", "3600", "--json"]
        if record is not None:
            cmd += ["--record", str(record)]
        if peak_tflops is not None:
            cmd += ["--peak-tflops", str(peak_tflops)]
        # stderr to a file: a pipe nobody reads for an hour would fill and block the monitor
        self._err = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                      cwd=str(ROOT))
        time.sleep(1.5)  # bind before the first probe connects (the probe also retries)
        if self._proc.poll() is not None:
            raise RuntimeError(f"monitor exited at start: {self._stderr()}")

    def _stderr(self) -> str:
        self._err.seek(0)
        return self._err.read()[-2000:]

    def interrupt(self) -> None:
        """Ask the monitor for its snapshot now (it takes it within 0.1 s); read it with
        :meth:`snapshot`. Training can go on meanwhile, so the telemetry it shows is live."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)

    def snapshot(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Stop the monitor and return its JSON snapshot (``{"error": ...}`` if it printed none)."""
        self.interrupt()
        try:
            out, _ = self._proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            return {"error": f"monitor printed no JSON (exit {self._proc.returncode}): {self._stderr()}"}

    def close(self) -> None:
        """Kill the monitor if it still runs."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()


def monitor_view(snap: dict[str, Any], job: str) -> dict[str, Any]:
    """The figures the monitor showed for ``job`` (its only rank)."""
    if "error" in snap:
        raise RuntimeError(snap["error"])
    jobs = [j for j in snap.get("jobs", []) if j["job"] == job]
    if not jobs:
        raise RuntimeError(f"the monitor saw no job {job!r} (received {snap.get('received')})")
    j = jobs[0]
    r = j["ranks"][0]
    keys = ("status", "step", "device", "step_time_s", "device_time_s", "tokens_per_s",
            "probe_overhead_frac", "lost_messages", "dropped_messages", "flops_per_step",
            "executed_flops_per_step", "estimated_flops_per_step", "estimate_ratio", "flops_per_s",
            "mfu", "hfu", "peak_flops", "peak_source", "dtype", "attention_convention", "mfu_reason",
            "uncounted_ops")
    out: dict[str, Any] = {k: r.get(k) for k in keys}
    tel = r.get("telemetry") or {}
    dev = tel.get("device") or {}
    out["telemetry"] = {k: dev.get(k) for k in (
        "gpu_util", "sm_active", "sm_occupancy", "tensor_active", "tensor_hmma", "dram_bw_util",
        "power_w", "power_limit_w", "sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "throttle",
        "mem_used", "mem_total", "nvlink_tx_bytes_s", "uuid")}
    from probe.telemetry.hostinfo import HOST_FIELDS

    out["telemetry"]["host"] = {k: (tel.get("host") or {}).get(k) for k in HOST_FIELDS}
    out["telemetry"]["reasons"] = tel.get("reasons")
    k = r.get("kernels")
    if k:
        a = k["anatomy"]
        out["kernel_window"] = {
            "device": k["device"], "step": k["step"], "cost_s": k["cost_s"],
            "step_us": k["step_us"], "typical_step_us": a.get("typical_step_us"),
            "busy_frac": a["busy_frac"], "busy_frac_typical": a.get("busy_frac_typical"),
            "launches": a["launches"], "short_kernels": a["short_kernels"],
            "attributed_flops": a["flops"], "attributed_tflops": a["tflops"],
            "kernels": len(k["kernels"]),
            "categories": {c["category"]: round(c["share"], 4) for c in k["categories"]},
            "top": [{"kernel": x["short"], "category": x["category"], "op": x["op"],
                     "calls": x["calls"], "total_us": round(x["total_us"], 1),
                     "tflops": x["tflops"] and round(x["tflops"], 1)} for x in k["kernels"][:10]],
        }
    out["hints"] = [{"id": h["id"], "severity": h["severity"], "summary": h["summary"]}
                    for h in j.get("hints", [])]
    return out
