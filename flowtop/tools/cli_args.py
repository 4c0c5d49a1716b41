"""The command line's argument parser (flowtop.cli): every subcommand's options (analyze's,
calibrate's and doctor's come from their modules), and ``--version``'s text."""

from __future__ import annotations

import argparse

from flowtop import settings
from flowtop.tools.common import (
    SERVE_PROMETHEUS,
    file_name as _file_name,
    hostport as _hostport,
    non_negative_float as _non_negative_float,
    positive_float as _positive_float,
    positive_int as _positive_int,
)
from probe import wire

SUBCOMMANDS = ("top", "serve", "run", "relay", "snapshot", "replay", "demo", "keys", "doctor", "analyze", "calibrate")


def _prometheus_args(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("--prometheus", type=_hostport, default=default, metavar="HOST:PORT",
                   help="serve Prometheus/OpenMetrics at http://HOST:PORT/metrics"
                   + (f" (default {default})" if default else ""))
    p.add_argument("--prometheus-max-ranks", type=_positive_int, default=1024, metavar="N",
                   help="jobs with more ranks get per-node series instead of per-rank ones (default 1024)")
    p.add_argument("--prometheus-linger", type=_non_negative_float, default=60.0, metavar="S",
                   help="seconds a finished job's series stay after its last bye (default 60)")


def version_text() -> str:
    """``flowtop --version``: the package, its wire and snapshot schema versions."""
    from importlib.metadata import PackageNotFoundError, version

    from flowtop.monitor.snapshot_json import SCHEMA

    try:
        mine = version("flowtop")
    except PackageNotFoundError:
        mine = "unknown (not installed)"
    return f"flowtop {mine} (wire {wire.MAJOR}.{wire.MINOR}, snapshot {SCHEMA.split('/')[-1]})"


def _monitor_args(p: argparse.ArgumentParser, cpu: float) -> None:
    """The monitor's options; ``cpu``: the data thread's CPU budget by default (FLOWTOP_DATA_CPU,
    read once for every subcommand: a bad value is said once)."""
    default = settings.ADDR.read()
    p.add_argument("--listen", default=default, help=f"address to bind (default {default}; env {settings.ADDR.name})")
    p.add_argument("--insecure-bind", action="store_true",
                   help="allow binding a non-loopback address without authentication")
    p.add_argument("--curve-dir", default=None, metavar="DIR",
                   help="CURVE keys (flowtop keys DIR): encrypted, only admitted probes")
    p.add_argument("--peak-tflops", type=_positive_float, default=None,
                   help="dense peak per rank in TFLOP/s (overrides the table)")
    p.add_argument("--record", type=_file_name, default=None, metavar="FILE",
                   help="also write every received frame to FILE (flowtop replay FILE)")
    p.add_argument("--data-cpu", type=_positive_float, default=cpu, metavar="CORES",
                   help=f"CPU the data thread may take before the monitor paces its ranks and spreads its ticks "
                        f"(default {cpu:g}; env {settings.DATA_CPU.name})")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand (analyze's and calibrate's options come from their modules)."""
    ap = argparse.ArgumentParser(prog="flowtop", description="top for deep-learning training FLOPs")
    ap.add_argument("--version", action="version", version=version_text())
    sub = ap.add_subparsers(dest="cmd")
    cpu = settings.DATA_CPU.read()
    top = sub.add_parser("top", help="live monitor (the default)")
    _monitor_args(top, cpu)
    _prometheus_args(top, None)
    top.add_argument("--theme", choices=("dark", "light"), default="dark", help="colours (default dark)")
    serve = sub.add_parser("serve", help="the monitor without a TUI, serving Prometheus metrics")
    _monitor_args(serve, cpu)
    _prometheus_args(serve, SERVE_PROMETHEUS)
    run = sub.add_parser("run", help="run CMD with the probe injected: flowtop run -- CMD ARGS...")
    run.add_argument("--connect", default=None,
                     help=f"monitor address the probe connects to (env {settings.ADDR.name})")
    run.add_argument("--job", default=None, help="job id (default: from torchrun's environment)")
    run.add_argument("--curve-dir", default=None, metavar="DIR",
                     help="CURVE keys to reach a monitor started with --curve-dir")
    run.add_argument("--relay", choices=("auto", "on", "off"), default="auto",
                     help="share one upstream connection per node through a node relay "
                     "(auto: when the monitor is on another host)")
    run.add_argument("command", nargs=argparse.REMAINDER)
    relay = sub.add_parser("relay", help="node relay: this node's ranks connect to it, it to the monitor")
    relay.add_argument("--listen", default=None, help="where the ranks connect: ipc:///PATH or tcp://127.0.0.1:PORT "
                       "(default: the node's well-known ipc path for --connect, which flowtop run --relay uses)")
    relay.add_argument("--connect", default=settings.ADDR.read(),
                       help=f"the monitor (tcp://HOST:PORT; env {settings.ADDR.name})")
    relay.add_argument("--curve-dir", default=None, metavar="DIR",
                       help="CURVE keys to reach a monitor started with --curve-dir")
    snap = sub.add_parser("snapshot", help="collect for a while and print the model")
    _monitor_args(snap, cpu)
    snap.add_argument("--timeout", type=_positive_float, default=None,
                      help="seconds to collect (default 5; --follow: none)")
    snap.add_argument("--until-done", action="store_true", help="exit once every rank said bye (or at the timeout): "
                      "0 done, 3 not done or ranks unheard, 4 a rank failed, 5 a signal stopped ranks")
    snap.add_argument("--json", action="store_true", help="print JSON (schema in README)")
    snap.add_argument("--replay", default=None, metavar="FILE", help="read a recording instead of listening")
    snap.add_argument("--follow", action="store_true", help="one snapshot JSON per line until interrupted (JSON Lines)")
    snap.add_argument("--interval", type=_positive_float, default=1.0, metavar="S",
                      help="--follow: seconds between lines (default 1)")
    rep = sub.add_parser("replay", help="play a recording back in the TUI")
    rep.add_argument("recording", help="file written by --record")
    rep.add_argument("--speed", type=_positive_float, default=1.0, help="playback speed (default 1)")
    rep.add_argument("--peak-tflops", type=_positive_float, default=None,
                     help="dense peak per rank in TFLOP/s (overrides the recorded peaks)")
    keys = sub.add_parser("keys", help="create CURVE keys for a monitor listening beyond loopback")
    keys.add_argument("directory")
    demo = sub.add_parser("demo", help="live demo: N-rank DDP training of a small GPT on CPU")
    demo.add_argument("--ranks", type=_positive_int, default=2, help="training processes (default 2)")
    demo.add_argument("--steps", type=_positive_int, default=None,
                      help="optimizer steps (default 20 headless, 2000 live)")
    demo.add_argument("--headless", action="store_true", help="print the final JSON snapshot instead of the TUI")
    demo.add_argument("--listen", default=None, help="address for the demo's monitor (default: a free loopback port)")
    from flowtop.tools.doctor import add_arguments

    add_arguments(sub.add_parser("doctor",
                  help="check why nothing shows up: torch, NVML, the probe, address, keys, limits"))
    from flowtop.tools import analyze, calibrate

    analyze.add_arguments(sub.add_parser("analyze", help="aggregate a torch.profiler Chrome trace",
                                         description=analyze.DESCRIPTION))
    cal = sub.add_parser("calibrate", help="hardware FLOPs with Nsight Compute vs the probe's",
                         description=calibrate.DESCRIPTION)
    calibrate.add_arguments(cal)
    for command in sub.choices.values():  # checks after parsing print the command's own usage
        command.set_defaults(usage_error=command.error)
    return ap
