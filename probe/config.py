"""Probe configuration: every environment variable the probe reads (or sets), in one place.

Each variable is a :class:`Var` record: its name, the kind of value it takes, its default and a
one-line description. :func:`from_env` reads them all into a :class:`ProbeConfig`; the few
modules that need one value on its own (``identity``: the job id, ``peaks``: the peak override)
call that variable's :meth:`Var.read`. No other probe module names a ``FLOWTOP_*`` variable
(``tests/test_config_tables.py`` checks it), except the bootstrap ``sitecustomize``, which must
decide whether to hook ``torch.optim`` before anything of the probe is imported.

Parsing never raises into training: a bad value is reported once on stderr and the default is
used instead. README's "Probe configuration" table is :func:`markdown_table` (a test compares them).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, MutableMapping, TypeVar

from probe._log import warn_once
from probe.wire import DEFAULT_ADDR, job_id_problem
from probe.wire.host import host_name as wire_host_name
from probe.wire.host import host_problem
from probe.wire.pace import DEFAULT_FLUSH_S

T = TypeVar("T")

#: Spellings of "on" for boolean variables (any case); "off" is 0, false, no, off.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _parse(env: Mapping[str, str], name: str, conv: Callable[[str], T], default: T) -> T:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return conv(raw)
    except (TypeError, ValueError) as exc:
        then = f"using {default!r}" if default is not None else "as if it were unset"  # not "using None"
        warn_once(f"env:{name}", f"ignoring {name}={raw!r}: {exc}; {then}")
        return default


def _text(raw: str) -> str | None:
    return raw


#: Longest step-record queue (FLOWTOP_QUEUE): far past any use, well inside a deque's size.
MAX_QUEUE = 10_000_000


def _job(raw: str) -> str | None:
    why = job_id_problem(raw)
    if why:  # a monitor refuses every frame of it: the whole training would be invisible
        raise ValueError(why)
    return raw


def _queue_len(raw: str) -> int:
    value = _positive_int(raw)
    if value > MAX_QUEUE:  # a deque past the platform's size: the probe would not start
        raise ValueError(f"must be at most {MAX_QUEUE:,}")
    return value


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def _number(raw: str, kind: Callable[[str], T], what: str) -> T:
    """``raw`` as ``kind``, or a ValueError that says what was expected (not Python's own text,
    "invalid literal for int() with base 10")."""
    try:
        return kind(raw.strip())
    except ValueError:
        raise ValueError(f"expected {what}") from None


def _positive_int(raw: str) -> int:
    value = _number(raw, int, "a whole number")
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _non_negative_int(raw: str) -> int:
    value = _number(raw, int, "a whole number")
    if value < 0:
        raise ValueError("must be 0 (off) or a positive integer")
    return value


def _positive_float(raw: str) -> float:
    value = _number(raw, float, "a number")
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number")
    return value


def _fraction(raw: str) -> float:
    value = _number(raw, float, "a number")
    if not 0 < value <= 1000:
        raise ValueError("must be a positive share such as 0.02 (2 %); above 1 lets counting cost more than training")
    return value


def _host(raw: str) -> str | None:
    name = raw.strip()
    why = host_problem(name)
    if why:
        raise ValueError(why)
    return name


def _attention(raw: str) -> str:
    if raw not in ("full", "causal"):
        raise ValueError("must be 'full' or 'causal'")
    return raw


def _addr(raw: str) -> str:
    if "://" not in raw:
        raise ValueError("expected a ZeroMQ address such as tcp://127.0.0.1:5759")
    return raw


@dataclass(frozen=True)
class Var(Generic[T]):
    """One environment variable: name, kind of value, default, and what it does (one line)."""

    name: str
    type: str  # the kind of value, as the README table shows it
    default: T
    doc: str
    parse: Callable[[str], T]
    shown_default: str = ""  # the table's default when the value alone does not say it
    owner: str = ""  # "Kineto's": a variable of torch's profiler that the probe sets, never reads

    def read(self, env: Mapping[str, str] | None = None) -> T:
        """The value in ``env`` (default ``os.environ``); unset or empty gives the default, and a
        bad value is reported once and gives the default too."""
        return _parse(os.environ if env is None else env, self.name, self.parse, self.default)

    def set_default(self, value: str, env: MutableMapping[str, str] | None = None) -> None:
        """Set the variable unless the user already did (their setting wins)."""
        (os.environ if env is None else env).setdefault(self.name, value)


def _on(default: bool) -> str:
    return "`1`" if default else "`0`"


ADDR = Var("FLOWTOP_ADDR", "address", DEFAULT_ADDR,
           "monitor address (probe connects, monitor binds); an unusable one turns the probe off", _addr)
DISABLE = Var("FLOWTOP_DISABLE", "bool", False, "`1` turns the probe off", _bool)
JOB = Var("FLOWTOP_JOB", "text", None, "job id (else `MASTER_ADDR:PORT`, Slurm job.step, else `host:pid`)", _job,
          shown_default="torchrun run id")
QUEUE = Var("FLOWTOP_QUEUE", "integer 1–10,000,000", 10_000, "bounded queue length; oldest dropped and counted",
            _queue_len)
FLUSH_S = Var("FLOWTOP_FLUSH_S", "seconds (≤ 10)", DEFAULT_FLUSH_S,
              "step records wait at most this long and leave together as one frame (wire 1.2 `steps`), so a "
              "rank sends ~10 frames/s whatever its step rate; FLOP counts, kernel windows and byes go at once; "
              "a rank of a job of over 1,000 ranks (its launcher's world size, or its process group's) holds them as "
              "long as the monitor would ask of that many until it asks (0.45 s at 4,096)",
              _positive_float)
FLOPS = Var("FLOWTOP_FLOPS", "bool", True, "sampled FLOP counting", _bool)
ATTENTION = Var("FLOWTOP_ATTENTION", "`full` or `causal`", "full", "attention FLOP convention: `full` or `causal`",
                _attention)
RECHECK_STEPS = Var("FLOWTOP_RECHECK_STEPS", "integer ≥ 0", 500, "periodic re-count interval in steps (`0`: off)",
                    _non_negative_int)
FLOPS_BUDGET: Var[float | None] = Var(
    "FLOWTOP_FLOPS_BUDGET", "share > 0", None, "share of time FLOP counting may cost (steps ≥100 ms / smaller)",
    _fraction, shown_default="0.005 / 0.02")
FLOPS_PER_TOKEN: Var[float | None] = Var(
    "FLOWTOP_FLOPS_PER_TOKEN", "FLOPs > 0", None, "explicit model-FLOPs-per-token estimate", _positive_float)
PEAK_TFLOPS = Var(
    "FLOWTOP_PEAK_TFLOPS", "TFLOP/s, or dtype=TFLOP/s,…", None,
    "dense peak per rank (TFLOP/s), overrides the table; or per dtype, `bf16=989.4,fp8=1978.9` (dtypes not named "
    "keep the table's figure); a malformed value gives no MFU and says why (`probe.flops.peaks`)", _text)
KERNELS = Var("FLOWTOP_KERNELS", "bool", True, "sampled profiler windows", _bool)
KERNELS_MIN_STEPS = Var("FLOWTOP_KERNELS_MIN_STEPS", "integer > 0", 10, "fewest steps between two scheduled windows",
                        _positive_int)
KERNELS_MAX_S = Var("FLOWTOP_KERNELS_MAX_S", "seconds > 0", 600.0,
                    "a window at least this often (seconds), budget permitting", _positive_float, shown_default="`600`")
KERNELS_REQUEST_S = Var("FLOWTOP_KERNELS_REQUEST_S", "seconds > 0", 1.0,
                        "fewest seconds between a kernel window and one the monitor asks for (`k`); also at "
                        "least the last window's cost over its budget. A request sooner is refused and counted",
                        _positive_float, shown_default="`1`")
TELEMETRY = Var("FLOWTOP_TELEMETRY", "bool", True, "NVML/GPM + psutil on the sender thread", _bool)
TELEMETRY_INTERVAL = Var("FLOWTOP_TELEMETRY_INTERVAL", "seconds (≥ 1)", 1.0,
                         "seconds between telemetry samples (≥ 1)", _positive_float, shown_default="`1`")
NVTX = Var("FLOWTOP_NVTX", "bool", False, "NVTX range `flowtop_step_<k>` per step (set by `calibrate`)", _bool)
CALIBRATE_OUT = Var("FLOWTOP_CALIBRATE_OUT", "path", None, "JSON lines of per-step FLOPs (set by `calibrate`)", _text)
CURVE_DIR = Var("FLOWTOP_CURVE_DIR", "directory", None, "CURVE keys of a monitor started with `--curve-dir`", _text)
HOST = Var("FLOWTOP_HOST", "host name", None,
           "the host name a rank (and a node relay) reports, hence its node: several simulated nodes on one "
           "machine (each with its own `XDG_RUNTIME_DIR`: see Many nodes)", _host,
           shown_default="`socket.gethostname()`")
BYE_ON_SIGTERM = Var(
    "FLOWTOP_BYE_ON_SIGTERM", "bool", True,
    "on SIGTERM (where no handler and no signal wakeup fd are installed) say bye `SIGTERM`, then die of it as "
    "promptly and with the same status as without the probe: the probe's sender thread sees the signal (Python's "
    "wakeup fd wakes its poll at once), so a rank hung in C (a collective) dies within ~0.3 s too; `0` leaves "
    "SIGTERM alone", _bool)
CONTROL_ADDR = Var("FLOWTOP_CONTROL_ADDR", "address", None,
                   "ignored (said once): the monitor's commands travel on the `FLOWTOP_ADDR` connection", _text)
KINETO_LOG_LEVEL = Var("KINETO_LOG_LEVEL", "integer", None,
                       "keeps Kineto's `USDT` lines out of the training's stderr", _text,
                       shown_default="`6` from the first window", owner="Kineto's")
TEARDOWN_CUPTI = Var("TEARDOWN_CUPTI", "bool", None,
                     "CUPTI detaches after each window; `0` keeps it attached (later steps pay per launch)", _text,
                     shown_default="`1` from the first CUDA window (CUDA ≥ 12.6)", owner="Kineto's")

#: Every variable, in the README table's order.
VARIABLES: tuple[Var[Any], ...] = (
    ADDR, DISABLE, JOB, QUEUE, FLUSH_S, FLOPS, ATTENTION, RECHECK_STEPS, FLOPS_BUDGET, FLOPS_PER_TOKEN, PEAK_TFLOPS,
    KERNELS, KERNELS_MIN_STEPS, KERNELS_MAX_S, KERNELS_REQUEST_S, TELEMETRY, TELEMETRY_INTERVAL, NVTX, CALIBRATE_OUT,
    CURVE_DIR, HOST, BYE_ON_SIGTERM, CONTROL_ADDR, KINETO_LOG_LEVEL, TEARDOWN_CUPTI,
)  # fmt: skip


@dataclass(frozen=True)
class ProbeConfig:
    """Everything the probe can be told; defaults suit a monitor on the same host."""

    enabled: bool = not DISABLE.default
    addr: str = ADDR.default
    queue_size: int = QUEUE.default
    flush_s: float = FLUSH_S.default
    flops: bool = FLOPS.default
    attention: str = ATTENTION.default
    recheck_steps: int = RECHECK_STEPS.default
    flops_budget: float | None = FLOPS_BUDGET.default  # None: 0.5 % of large steps, 2 % of small ones
    kernels: bool = KERNELS.default
    kernels_min_steps: int = KERNELS_MIN_STEPS.default
    kernels_max_s: float = KERNELS_MAX_S.default
    kernels_request_s: float = KERNELS_REQUEST_S.default
    telemetry: bool = TELEMETRY.default
    telemetry_interval_s: float = TELEMETRY_INTERVAL.default
    flops_per_token: float | None = FLOPS_PER_TOKEN.default
    nvtx: bool = NVTX.default
    calibrate_out: str | None = CALIBRATE_OUT.default
    job: str | None = JOB.default
    curve_dir: str | None = CURVE_DIR.default
    bye_on_sigterm: bool = BYE_ON_SIGTERM.default


#: The longest flush interval a probe takes (FLOWTOP_FLUSH_S): a step then reaches the monitor at
#: most this late.
MAX_FLUSH_S = 10.0


#: The shortest telemetry interval (FLOWTOP_TELEMETRY_INTERVAL): NVML and psutil at most once a second.
MIN_TELEMETRY_S = 1.0


def _within(var: Var[float], env: Mapping[str, str], lo: float = -math.inf, hi: float = math.inf) -> float:
    """``var``'s value brought into [lo, hi], saying so once when it was not."""
    value = var.read(env)
    bound, side = (hi, "above") if value > hi else (lo, "below") if value < lo else (value, "")
    if side:
        warn_once(f"env:{var.name}", f"{var.name}={value:g} is {side} {bound:g} s; using {bound:g}")
    return bound


def _read_addr(e: Mapping[str, str]) -> str | None:
    """FLOWTOP_ADDR, or None where it is set but unusable: the probe then stays off. Unlike the
    other variables it does not fall back to its default: a typo would send this training's
    figures to whatever monitor listens on the default port (on a shared node, another user's)."""
    raw = e.get(ADDR.name)
    if raw is None or raw == "":
        return ADDR.default
    try:
        return _addr(raw)
    except ValueError as exc:
        warn_once(f"env:{ADDR.name}", f"ignoring {ADDR.name}={raw!r}: {exc}; the probe stays off "
                  "(it sends nothing rather than to a monitor nobody named)")
        return None


def from_env(env: Mapping[str, str] | None = None) -> ProbeConfig:
    """Read the configuration from ``env`` (default ``os.environ``)."""
    e = os.environ if env is None else env
    addr = _read_addr(e)
    if e.get(CONTROL_ADDR.name):
        warn_once(f"env:{CONTROL_ADDR.name}", f"{CONTROL_ADDR.name} is ignored: the monitor's commands "
                  f"now travel on the data connection ({ADDR.name})")
    return ProbeConfig(
        enabled=not DISABLE.read(e) and addr is not None,
        addr=ADDR.default if addr is None else addr,
        queue_size=QUEUE.read(e),
        flush_s=_within(FLUSH_S, e, hi=MAX_FLUSH_S),
        flops=FLOPS.read(e),
        attention=ATTENTION.read(e),
        recheck_steps=RECHECK_STEPS.read(e),
        flops_budget=FLOPS_BUDGET.read(e),
        kernels=KERNELS.read(e),
        kernels_min_steps=KERNELS_MIN_STEPS.read(e),
        kernels_max_s=KERNELS_MAX_S.read(e),
        kernels_request_s=KERNELS_REQUEST_S.read(e),
        telemetry=TELEMETRY.read(e),
        telemetry_interval_s=_within(TELEMETRY_INTERVAL, e, lo=MIN_TELEMETRY_S),
        flops_per_token=FLOPS_PER_TOKEN.read(e),
        nvtx=NVTX.read(e),
        calibrate_out=CALIBRATE_OUT.read(e),
        job=JOB.read(e),
        curve_dir=CURVE_DIR.read(e),
        bye_on_sigterm=BYE_ON_SIGTERM.read(e),
    )


def disable_in_children(env: MutableMapping[str, str] | None = None) -> None:
    """Turn the probe off for every process this one starts from now on (a forked DataLoader
    worker's own children never attach)."""
    (os.environ if env is None else env)[DISABLE.name] = "1"


def _shown_default(v: Var[Any]) -> str:
    if v.shown_default:
        return v.shown_default
    if isinstance(v.default, bool):
        return _on(v.default)
    if v.default is None:
        return "—"
    return f"`{v.default}`"


def markdown_table(variables: tuple[Var[Any], ...] = VARIABLES) -> str:
    """README's "Probe configuration (environment)" table (``python -m probe.config`` prints it)."""
    lines = ["| variable | value | default | meaning |", "|---|---|---|---|"]
    for v in variables:
        name = f"`{v.name}`" + (f" ({v.owner})" if v.owner else "")
        lines.append(f"| {name} | {v.type} | {_shown_default(v)} | {v.doc} |")
    return "\n".join(lines) + "\n"


def host_name(env: Mapping[str, str] | None = None) -> str:
    """The host a rank reports: ``FLOWTOP_HOST``, else the machine's name (``probe.wire.host``,
    which a node relay reads too, so the two name the same node)."""
    return wire_host_name(HOST.read(env))


if __name__ == "__main__":
    print(markdown_table(), end="")
