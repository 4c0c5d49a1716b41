"""The monitor's environment variables, in one place.

:data:`MONITOR` lists every ``FLOWTOP_*`` variable the monitor and its tools read, each a
:class:`Setting` record (name, kind of value, default, one-line description); the modules that
need one call its :meth:`Setting.read`. Command-line flags win over these (a variable only
changes a flag's default). :data:`FOR_PROBE` lists the probe's variables that flowtop's tools set
in a training's environment (``flowtop run``, ``calibrate``, ``doctor``): the probe reads them
through ``probe.config``, which the monitor does not import (it imports only ``probe.wire``), so
they are named here and ``tests/test_config_tables.py`` checks that ``probe.config`` defines each.

A bad value is said on stderr (logging) and the default is used: a typo in the environment must
not keep the monitor from starting. README's "Monitor configuration" tables are
:func:`markdown_tables` (``python -m flowtop.settings``; a test compares them).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, MutableMapping, TypeVar

from probe.wire import DEFAULT_ADDR
from probe.wire.host import host_problem

T = TypeVar("T")

_log = logging.getLogger("flowtop.settings")


def _text(raw: str) -> str | None:
    return raw


def _address(raw: str) -> str:
    return raw  # checked where it is bound or connected to (flowtop.monitor.collector.check_listen)


def _positive(raw: str, unit: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"not a positive number of {unit}")
    return value


def _cores(raw: str) -> float:
    return _positive(raw, "cores")


def _seconds(raw: str) -> float | None:
    return _positive(raw, "seconds")


def _seconds_or_off(raw: str) -> float:
    try:
        if float(raw) == 0.0:
            return 0.0
    except ValueError:
        pass
    return _positive(raw, "seconds (or 0)")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: name, kind of value, default, and what it changes (one line)."""

    name: str
    type: str  # the kind of value, as the README table shows it
    default: T
    doc: str
    parse: Callable[[str], T]
    shown_default: str = ""  # the table's default when the value alone does not say it

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """The value in ``environ`` (default ``os.environ``): unset or blank gives the default, and
        so does a bad value, with a warning."""
        raw = (os.environ if environ is None else environ).get(self.name, "")
        if not raw.strip():
            return self.default
        try:
            return self.parse(raw.strip())
        except ValueError as exc:
            # Said before any UI exists (settings are read at start): on stderr, named as flowtop's.
            _log.warning("flowtop: ignoring %s=%r: %s; using the default", self.name, raw, exc)
            return self.default


@dataclass(frozen=True)
class ProbeVariable:
    """A probe variable (``probe.config``) that one of flowtop's tools sets for the training."""

    name: str
    set_by: str
    why: str

    def put(self, env: MutableMapping[str, str], value: str) -> None:
        """Set it in ``env`` (a child's environment being built)."""
        env[self.name] = value


ADDR = Setting("FLOWTOP_ADDR", "address", DEFAULT_ADDR,
               "the default of `--listen` (`top`, `serve`, `snapshot`, `doctor`) and of `--connect` (`run`, `relay`); "
               "the probe reads it too", _address)
CURVE_DIR: Setting[str | None] = Setting(
    "FLOWTOP_CURVE_DIR", "directory", None,
    "CURVE keys: `flowtop run` gives them to its node relay, `flowtop doctor` checks them (`--curve-dir` wins)", _text)
def _host(raw: str) -> str | None:
    why = host_problem(raw)
    if why:
        raise ValueError(why)
    return raw


#: The probe's FLOWTOP_HOST (probe.config.HOST), read by a node relay for its own host: a rank
#: and the relay of its simulated node then report the same one.
HOST: Setting[str | None] = Setting(
    "FLOWTOP_HOST", "host name", None,
    "the host a node relay (`run`, `relay`) reports, as the probe does: one simulated node of several on a "
    "machine", _host, shown_default="`socket.gethostname()`")
HANG_S: Setting[float | None] = Setting(
    "FLOWTOP_HANG_S", "seconds > 0", None, "the hang rules' floor: a rank is hung after max(10 × step time, this)",
    _seconds, shown_default="`30` (`floor_s` of the hang rules)")
#: (flowtop.monitor.pacing.DATA_CPU is its default: why half a core is there.)
DATA_CPU: Setting[float] = Setting(
    "FLOWTOP_DATA_CPU", "cores > 0", 0.5,
    "CPU the monitor's data thread may take before it paces its ranks and spreads its ticks (`--data-cpu` wins; "
    "1 or more: only keeping up decides)", _cores)
HEAP_TRIM_S: Setting[float] = Setting(
    "FLOWTOP_HEAP_TRIM_S", "seconds > 0, or 0", 10.0,
    "how often a monitor gives the memory it freed back to the system (glibc's `malloc_trim`; `0`: never)",
    _seconds_or_off)
SCREENSHOT_DIR: Setting[str | None] = Setting(
    "FLOWTOP_SCREENSHOT_DIR", "directory", None, "where `p` saves its SVG screenshot", _text,
    shown_default="the current directory")

#: Every variable the monitor reads, in the README table's order.
MONITOR: tuple[Setting[Any], ...] = (ADDR, CURVE_DIR, DATA_CPU, HANG_S, HEAP_TRIM_S, HOST, SCREENSHOT_DIR)

PROBE_ADDR = ProbeVariable("FLOWTOP_ADDR", "`run`, `demo`, `doctor`", "the monitor (or the node relay) to connect to")
PROBE_JOB = ProbeVariable("FLOWTOP_JOB", "`run --job`", "the job id")
PROBE_CURVE_DIR = ProbeVariable("FLOWTOP_CURVE_DIR", "`run --curve-dir`", "keys to reach a monitor with `--curve-dir`")
PROBE_KERNELS = ProbeVariable("FLOWTOP_KERNELS", "`calibrate`, `doctor` (`0`)",
                              "no profiler windows (a second CUPTI client would disturb Nsight Compute; the "
                              "doctor's test attach profiles nothing)")
PROBE_TELEMETRY = ProbeVariable("FLOWTOP_TELEMETRY", "`doctor` (`0`, unless set)", "its test attach samples nothing")
PROBE_NVTX = ProbeVariable("FLOWTOP_NVTX", "`calibrate` (`1`)",
                           "an NVTX range per step for Nsight Compute to filter on")
PROBE_CALIBRATE_OUT = ProbeVariable("FLOWTOP_CALIBRATE_OUT", "`calibrate`", "where the probe writes per-step FLOPs")
PROBE_DISABLE = ProbeVariable("FLOWTOP_DISABLE", "(read by `doctor`'s child)", "reported when it keeps the probe off")
#: Not a probe variable: ``calibrate`` names the profiled steps for the training's own log; the
#: probe does not read it (calibration filters on the NVTX ranges instead).
CALIBRATE_STEPS = ProbeVariable("FLOWTOP_CALIBRATE_STEPS", "`calibrate`",
                                "the profiled steps, for the training's own use (the probe does not read it)")

#: The probe's variables flowtop's tools set, in the README table's order.
FOR_PROBE: tuple[ProbeVariable, ...] = (PROBE_ADDR, PROBE_JOB, PROBE_CURVE_DIR, PROBE_KERNELS, PROBE_TELEMETRY,
                                        PROBE_NVTX, PROBE_CALIBRATE_OUT, CALIBRATE_STEPS, PROBE_DISABLE)


def _shown_default(s: Setting[Any]) -> str:
    if s.shown_default:
        return s.shown_default
    return "—" if s.default is None else f"`{s.default}`"


def markdown_tables() -> str:
    """README's two tables: what the monitor reads, and what its tools set for the probe."""
    lines = ["| variable | value | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{s.name}` | {s.type} | {_shown_default(s)} | {s.doc} |" for s in MONITOR]
    lines += ["", "| probe variable | set by | why |", "|---|---|---|"]
    lines += [f"| `{p.name}` | {p.set_by} | {p.why} |" for p in FOR_PROBE]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_tables(), end="")
