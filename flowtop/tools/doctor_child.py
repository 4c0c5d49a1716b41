"""What ``flowtop doctor`` asks a child interpreter started with ``flowtop run``'s environment.

Run as a script (``python doctor_child.py``), never imported: it must not import ``flowtop``,
so that what it sees is what a training process sees — which sitecustomize ran, whether the
probe's attach hook is in place, torch, NVML/GPM, the peak per device — and, when torch is
there, whether building an optimizer really attaches the probe (its address is pointed at a
path nobody listens on, so no monitor ever hears of the doctor). It prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

BOOTSTRAP_MARK = os.path.join("probe", "bootstrap")


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def site_report() -> dict[str, Any]:
    """Which sitecustomize ran and whether ours installed its hook."""
    ours = sys.modules.get("_flowtop_sitecustomize")
    active = sys.modules.get("sitecustomize")
    active_file = getattr(active, "__file__", None)
    if ours is None and active_file and BOOTSTRAP_MARK in active_file:
        ours = active
    return {
        "ours_ran": ours is not None,
        "ours_file": getattr(ours, "__file__", None),
        "active_file": active_file,
        "user_file": active_file if active is not None and active is not ours else None,
        "hook_installed": any(type(f).__name__ == "_AttachAfterOptim" for f in sys.meta_path),
        "no_site": bool(sys.flags.no_site), "ignore_environment": bool(sys.flags.ignore_environment),
        "pythonpath_first": (os.environ.get("PYTHONPATH", "").split(os.pathsep) or [""])[0],
    }


def probe_report() -> dict[str, Any]:
    try:
        import probe

        return {"ok": True, "file": probe.__file__, "version": probe.VERSION}
    except BaseException as exc:  # noqa: BLE001 - the report says what broke
        return {"ok": False, "error": _err(exc)}


def torch_report() -> dict[str, Any]:
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "error": _err(exc)}
    out: dict[str, Any] = {"ok": True, "version": torch.__version__, "cuda": torch.version.cuda,
                           "cuda_available": False, "devices": []}
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except BaseException as exc:  # noqa: BLE001
        out["cuda_error"] = _err(exc)
    return out


def nvml_report() -> dict[str, Any]:
    try:
        import pynvml
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "error": f"nvidia-ml-py not importable: {_err(exc)}"}
    try:
        pynvml.nvmlInit()
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "error": f"NVML init failed (no NVIDIA driver?): {_err(exc)}"}
    out: dict[str, Any] = {"ok": True, "devices": []}
    try:
        out["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        out["nvml_version"] = _text(pynvml.nvmlSystemGetNVMLVersion())
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            dev: dict[str, Any] = {"index": i, "name": _text(pynvml.nvmlDeviceGetName(h))}
            if not hasattr(pynvml, "nvmlGpmQueryDeviceSupport"):
                dev["gpm"], dev["gpm_reason"] = False, "nvidia-ml-py too old for GPM"
            else:
                try:
                    dev["gpm"] = bool(int(getattr(pynvml.nvmlGpmQueryDeviceSupport(h), "isSupportedDevice", 0)))
                    dev["gpm_reason"] = "" if dev["gpm"] else "GPM unsupported on this device (needs Hopper or newer)"
                except BaseException as exc:  # noqa: BLE001
                    dev["gpm"], dev["gpm_reason"] = False, f"GPM query failed: {_err(exc)}"
            out["devices"].append(dev)
    except BaseException as exc:  # noqa: BLE001
        out["error"] = _err(exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except BaseException:  # noqa: BLE001
            pass
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def peak_report(devices: list[str]) -> list[dict[str, Any]]:
    """The peak each visible device would get (GPUs: bf16 and fp32; the CPU: fp32)."""
    try:
        from probe.flops.peaks import resolve_peak
    except BaseException as exc:  # noqa: BLE001
        return [{"device": "?", "dtype": "", "flops": None, "source": "", "reason": _err(exc)}]
    out = []
    for name in devices or ["cpu"]:
        for dtype in (("fp32",) if name == "cpu" else ("bf16", "fp32")):
            peak, reason = resolve_peak(name, dtype)
            out.append({"device": name, "dtype": dtype, "flops": peak.flops if peak else None,
                        "source": peak.source if peak else "", "reason": reason})
    return out


def attach_report(torch_ok: bool) -> dict[str, Any]:
    """Build an optimizer as a training would and see whether the probe attached."""
    if not torch_ok:
        return {"tried": False, "attached": False, "error": "torch not importable"}
    try:
        import torch

        import probe

        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        attached = probe.is_attached()
        probe.detach("doctor")
        return {"tried": True, "attached": attached, "error": ""}
    except BaseException as exc:  # noqa: BLE001
        return {"tried": True, "attached": False, "error": _err(exc)}


def main() -> None:
    report: dict[str, Any] = {
        "python": sys.version.split()[0], "executable": sys.executable,
        "flowtop_disable": os.environ.get("FLOWTOP_DISABLE", ""),
        "site": site_report(), "probe": probe_report(),
    }
    report["torch"] = torch_report()
    report["nvml"] = nvml_report()
    names = report["torch"].get("devices") or [d["name"] for d in report["nvml"].get("devices", [])]
    report["peaks"] = peak_report(list(names))
    report["attach"] = attach_report(bool(report["torch"].get("ok")) and report["probe"].get("ok", False))
    sys.stdout.write("\nFLOWTOP-DOCTOR " + json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
