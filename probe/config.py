"""Probe configuration from ``FLOWTOP_*`` environment variables (documented in README).

Parsing never raises into training: a bad value is reported once and the default
is used instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from probe._log import warn_once
from probe.wire import DEFAULT_ADDR

T = TypeVar("T")


@dataclass(frozen=True)
class ProbeConfig:
    """Everything the probe can be told; defaults suit a monitor on the same host."""

    enabled: bool = True
    addr: str = DEFAULT_ADDR  # FLOWTOP_ADDR: where the monitor's SUB is bound
    queue_size: int = 10_000  # FLOWTOP_QUEUE: bounded deque, oldest dropped
    flush_s: float = 0.1  # FLOWTOP_FLUSH_S: step records wait at most this long, one frame each
    flops: bool = True  # FLOWTOP_FLOPS: sampled FLOP counting
    attention: str = "full"  # FLOWTOP_ATTENTION: full | causal
    recheck_steps: int = 500  # FLOWTOP_RECHECK_STEPS: periodic re-count
    flops_budget: float | None = None  # FLOWTOP_FLOPS_BUDGET: share of time counting may cost
    kernels: bool = True  # FLOWTOP_KERNELS: sampled profiler windows
    kernels_min_steps: int = 10  # FLOWTOP_KERNELS_MIN_STEPS: fewest steps between windows
    kernels_max_s: float = 600.0  # FLOWTOP_KERNELS_MAX_S: a window at least this often (s)
    telemetry: bool = True  # FLOWTOP_TELEMETRY: NVML + psutil on the sender thread
    telemetry_interval_s: float = 1.0  # FLOWTOP_TELEMETRY_INTERVAL (>= 1 s)
    flops_per_token: float | None = None  # FLOWTOP_FLOPS_PER_TOKEN: explicit estimate
    nvtx: bool = False  # FLOWTOP_NVTX: NVTX range per step (flowtop calibrate)
    calibrate_out: str | None = None  # FLOWTOP_CALIBRATE_OUT: JSON lines per step
    job: str | None = None  # FLOWTOP_JOB: explicit job id
    curve_dir: str | None = None  # FLOWTOP_CURVE_DIR: CURVE keys (flowtop keys DIR)
    bye_on_sigterm: bool = True  # FLOWTOP_BYE_ON_SIGTERM: say bye "SIGTERM" before dying of it


def _parse(env: Mapping[str, str], name: str, conv: Callable[[str], T], default: T) -> T:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return conv(raw)
    except (TypeError, ValueError) as exc:
        warn_once(f"env:{name}", f"ignoring {name}={raw!r}: {exc}; using {default!r}")
        return default


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError("must be 0 (off) or a positive integer")
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number")
    return value


def _fraction(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= 1000:
        raise ValueError("must be a positive share such as 0.02 (2 %); above 1 lets counting cost more than training")
    return value


def _attention(raw: str) -> str:
    if raw not in ("full", "causal"):
        raise ValueError("must be 'full' or 'causal'")
    return raw


def _addr(raw: str) -> str:
    if "://" not in raw:
        raise ValueError("expected a ZeroMQ address such as tcp://127.0.0.1:5759")
    return raw


def from_env(env: Mapping[str, str] | None = None) -> ProbeConfig:
    """Read the configuration from ``env`` (default ``os.environ``)."""
    e = os.environ if env is None else env
    d = ProbeConfig()
    addr = _parse(e, "FLOWTOP_ADDR", _addr, d.addr)
    if e.get("FLOWTOP_CONTROL_ADDR"):
        warn_once("env:FLOWTOP_CONTROL_ADDR", "FLOWTOP_CONTROL_ADDR is ignored: the monitor's commands "
                  "now travel on the data connection (FLOWTOP_ADDR)")
    return ProbeConfig(
        enabled=not _parse(e, "FLOWTOP_DISABLE", _bool, False),
        addr=addr,
        queue_size=_parse(e, "FLOWTOP_QUEUE", _positive_int, d.queue_size),
        flush_s=min(10.0, _parse(e, "FLOWTOP_FLUSH_S", _positive_float, d.flush_s)),
        flops=_parse(e, "FLOWTOP_FLOPS", _bool, d.flops),
        attention=_parse(e, "FLOWTOP_ATTENTION", _attention, d.attention),
        recheck_steps=_parse(e, "FLOWTOP_RECHECK_STEPS", _non_negative_int, d.recheck_steps),
        flops_budget=_parse(e, "FLOWTOP_FLOPS_BUDGET", _fraction, None),
        kernels=_parse(e, "FLOWTOP_KERNELS", _bool, d.kernels),
        kernels_min_steps=_parse(e, "FLOWTOP_KERNELS_MIN_STEPS", _positive_int, d.kernels_min_steps),
        kernels_max_s=_parse(e, "FLOWTOP_KERNELS_MAX_S", _positive_float, d.kernels_max_s),
        telemetry=_parse(e, "FLOWTOP_TELEMETRY", _bool, d.telemetry),
        telemetry_interval_s=max(1.0, _parse(e, "FLOWTOP_TELEMETRY_INTERVAL", _positive_float, 1.0)),
        flops_per_token=_parse(e, "FLOWTOP_FLOPS_PER_TOKEN", _positive_float, None),
        nvtx=_parse(e, "FLOWTOP_NVTX", _bool, False),
        calibrate_out=e.get("FLOWTOP_CALIBRATE_OUT") or None,
        job=e.get("FLOWTOP_JOB") or None,
        curve_dir=e.get("FLOWTOP_CURVE_DIR") or None,
        bye_on_sigterm=_parse(e, "FLOWTOP_BYE_ON_SIGTERM", _bool, d.bye_on_sigterm),
    )
