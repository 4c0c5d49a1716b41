"""Command line: ``flowtop [top|run|snapshot|demo|analyze|calibrate]``.

Bad arguments get a clear message and exit code 2 (argparse's convention).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from flowtop import settings
from flowtop.monitor.snapshot import MonitorSnapshot, all_done
from flowtop.tools.cli_args import SUBCOMMANDS, build_parser
from flowtop.tools.common import start_failed


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowtop`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and not args_list[0].startswith("-") and args_list[0] not in SUBCOMMANDS:
        # `top` takes no word of its own: a word first is a command name, mistyped or unknown.
        near = difflib.get_close_matches(args_list[0], SUBCOMMANDS, n=1)
        build_parser().error(f"unknown command {args_list[0]!r}"
                             + (f" (did you mean {near[0]!r}?)" if near else f"; commands: {', '.join(SUBCOMMANDS)}"))
    if not args_list or args_list[0] not in SUBCOMMANDS and args_list[0] not in ("-h", "--help", "--version"):
        args_list = ["top", *args_list]
    args, extra = build_parser().parse_known_args(args_list)
    if extra:  # the command's usage, not the top level's (argparse's own error names no command)
        args.usage_error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "analyze":
        from flowtop.tools import analyze

        return analyze.run(args)
    if args.cmd == "calibrate":
        from flowtop.tools import calibrate

        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return calibrate.run_calibration(calibrate.options(args, command, args.usage_error))
    if args.cmd == "run":
        from flowtop.tools import runner

        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return runner.run(command, connect=args.connect, job=args.job, curve_dir=args.curve_dir, relay=args.relay)
    if args.cmd == "relay":
        from flowtop.tools import relay_host

        return relay_host.serve(args.listen, args.connect, args.curve_dir)
    if args.cmd == "keys":
        from flowtop.tools import keys

        try:
            where = keys.create(args.directory)
        except (keys.KeyError_, OSError) as exc:
            print(f"flowtop: {exc}", file=sys.stderr)
            return 2
        print(f"keys in {where}: start the monitor with --curve-dir {where}; probes need "
              f"FLOWTOP_CURVE_DIR={where} (server.key, client.key_secret) or flowtop run --curve-dir {where}")
        return 0
    if args.cmd in MONITOR_COMMANDS:
        _monitor_process()
    if args.cmd == "snapshot":
        return _snapshot(args)
    if args.cmd == "serve":
        return _serve(args)
    if args.cmd == "doctor":
        from flowtop.tools import doctor

        return doctor.main(args)
    if args.cmd == "replay":
        return _replay(args)
    if args.cmd == "demo":
        from flowtop.tools.demo import launch

        return launch.main(args)
    return _top(args)


#: The commands whose process is a monitor (``demo`` starts its own: flowtop.tools.demo.launch).
MONITOR_COMMANDS = ("top", "serve", "snapshot", "replay")


def _monitor_process() -> None:
    """A monitor process's collector thresholds and heap trimmer (flowtop.monitor.gcpolicy), and so
    its FLOWTOP_HEAP_TRIM_S read and checked: every monitor command the same way (``snapshot``,
    ``--follow`` included, had neither)."""
    from flowtop.monitor import gcpolicy

    gcpolicy.for_monitor()


def _make_model(peak_tflops: float | None = None) -> Any:
    """flowtop.monitor.wiring.make_model with ``--peak-tflops`` (TFLOP/s) as the FLOP/s it takes."""
    from flowtop.monitor import wiring

    return wiring.make_model(peak_tflops * 1e12 if peak_tflops else None)


def _collector(args: argparse.Namespace) -> Any:
    from flowtop.monitor.collector import AddressError, Collector, check_listen
    from flowtop.monitor.recording import Recorder, RecordingError
    from flowtop.tools.keys import KeyError_, load_server

    try:
        # Everything that can be checked before the recording file is created (and truncated).
        check_listen(args.listen, args.insecure_bind or bool(args.curve_dir))
        curve = load_server(args.curve_dir) if args.curve_dir else None
        recorder = Recorder(args.record) if args.record else None
        return Collector(_make_model(args.peak_tflops), args.listen, allow_remote=args.insecure_bind, recorder=recorder,
                         curve=curve, cpu_budget=args.data_cpu)
    except (AddressError, RecordingError, KeyError_) as exc:
        from_env = isinstance(exc, AddressError) and os.environ.get(settings.ADDR.name) == args.listen
        print(f"flowtop: {exc}" + (f" (from {settings.ADDR.name})" if from_env else ""), file=sys.stderr)
        return None


def _replay(args: argparse.Namespace) -> int:
    from flowtop.monitor.recording import RecordingError, RecordingSource, read_recording
    from flowtop.tui.app import QUIT_SIGNALS, FlowtopApp

    try:
        next(iter(read_recording(args.recording)), None)  # fail before the UI starts
    except RecordingError as exc:
        print(f"flowtop: {exc}", file=sys.stderr)
        return 2
    FlowtopApp(RecordingSource(args.recording, _make_model(args.peak_tflops), args.speed), quit_on=QUIT_SIGNALS).run()
    return 0


def _top(args: argparse.Namespace) -> int:
    collector = _collector(args)
    if collector is None:
        return 2
    from flowtop.tui.app import QUIT_SIGNALS, FlowtopApp

    app = FlowtopApp(collector, quit_on=QUIT_SIGNALS)
    if args.theme == "light":
        app.theme = "textual-light"
    metrics = _metrics(args, lambda: app.data.latest)
    if metrics is not None:
        from flowtop.export.metrics_http import MetricsAddressError

        try:
            metrics.start()
        except MetricsAddressError as exc:
            print(f"flowtop: {exc}", file=sys.stderr)
            return 2
    try:
        app.run()
    finally:
        if metrics is not None:
            metrics.stop()
    return start_failed(collector)


def _metrics(args: argparse.Namespace, latest: Any) -> Any:
    """The ``--prometheus`` endpoint (not started), or None without the flag."""
    if args.prometheus is None:
        return None
    from flowtop.export.exporter import ExportPolicy
    from flowtop.export.metrics_http import MetricsServer

    return MetricsServer(args.prometheus, latest, ExportPolicy(args.prometheus_max_ranks, args.prometheus_linger))


def _serve(args: argparse.Namespace) -> int:
    collector = _collector(args)
    if collector is None:
        return 2
    from flowtop.export import serve

    return serve.serve(collector, _metrics(args, lambda: None))


def print_notices(board: Any) -> None:
    """Headless, monitor-side errors (flowtop.monitor.notices) go to stderr; the TUI shows them instead."""
    for n in board.take():
        print(f"flowtop: {n.text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Collected:
    """What :func:`collect` ends with: the last snapshot, and whether the timeout ended it."""

    snapshot: MonitorSnapshot
    timed_out: bool


async def collect(collector: Any, timeout: float, until_done: bool) -> Collected:
    """Run ``collector`` for up to ``timeout`` seconds (or, ``until_done``, until a tick finds
    every rank done: that tick's hints are the final ones; SIGINT/SIGTERM/SIGHUP end it early too)."""
    finished = asyncio.Event()

    def on_tick(snap: Any) -> None:
        print_notices(collector.notices)
        if until_done and all_done(snap):
            finished.set()

    collector.on_tick = on_tick
    loop = asyncio.get_running_loop()
    # Before the bind: a peer that can connect finds the handlers in place (a closed terminal
    # in the meantime ends the collection at once, its recording closed whole).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # nohup: the user asked for the process to outlive its terminal
        try:  # Ctrl-C / SIGTERM / a closed terminal end the collection early (the recording closed whole)
            loop.add_signal_handler(sig, finished.set)
        except (RuntimeError, ValueError, NotImplementedError):
            pass
    await collector.start()
    timed_out = False
    try:
        try:
            await asyncio.wait_for(finished.wait(), timeout)
        except asyncio.TimeoutError:
            timed_out = True
        published = collector.published
        if until_done and published is not None and all_done(published):
            return Collected(published, False)
        return Collected(collector.snapshot(), timed_out)
    finally:
        await collector.stop()
        print_notices(collector.notices)


def _snapshot(args: argparse.Namespace) -> int:
    from flowtop.monitor.snapshot_json import to_json

    # failed: the recording written live failed; not whole: the one replayed stops short of its end
    failed, timed_out, whole = "", False, True
    if args.follow:
        if args.replay:
            print("flowtop: --follow reads a live monitor; use flowtop snapshot --replay FILE without it",
                  file=sys.stderr)
            return 2
        collector = _collector(args)
        if collector is None:
            return 2
        from flowtop.export import serve

        rc = serve.follow(collector, args.interval, args.timeout, args.until_done)
        _another_monitor(collector)
        return rc
    if args.timeout is None:
        args.timeout = 5.0
    if args.replay:
        from flowtop.monitor.recording import RecordingError, replay

        model = _make_model(args.peak_tflops)
        try:
            replayed = replay(args.replay, model)
        except RecordingError as exc:
            print(f"flowtop: {exc}", file=sys.stderr)
            return 2
        snap, whole = replayed.snapshot, replayed.whole
        print_notices(model.notices)  # where a recording not whole stops, and why
    else:
        collector = _collector(args)
        if collector is None:
            return 2
        from flowtop.monitor.collector import AddressError

        try:
            collected = asyncio.run(collect(collector, args.timeout, args.until_done))
            snap, timed_out = collected.snapshot, collected.timed_out
        except AddressError as exc:
            print(f"flowtop: {exc}", file=sys.stderr)
            _another_monitor(collector)
            return 2
        recorder = collector.last_recorder
        failed = recorder.error if recorder is not None else ""
        if failed:
            print(f"flowtop: {failed}", file=sys.stderr)
    if args.json:
        text = json.dumps(to_json(snap), indent=2)
    else:
        from flowtop.export.textreport import render

        text = render(snap)
    # 1 either way: the snapshot is printed whole, the recording is not (a script must not take a
    # replay of a cut recording for the run's end: its ranks look as they were at the cut)
    rc = _print_out(text, 1 if failed or not whole else 0)
    if rc == 0 and args.until_done and timed_out:  # not a signal: that ends it with 0, as --follow
        from flowtop.export.serve import after_timeout, not_done

        return not_done(after_timeout(args.timeout), snap)
    if rc == 0 and args.until_done and args.replay and not all_done(snap):
        # a whole recording of ranks that had not all finished when it ended: not the run's end
        from flowtop.export.serve import not_done

        return not_done("when the recording ends", snap)
    if rc == 0 and args.until_done and all_done(snap):  # not a signal's early end
        from flowtop.export.serve import end_status

        return end_status(snap)
    return rc


def _another_monitor(collector: Any) -> None:
    """After a snapshot's bind found its address taken: how to read the running monitor's
    snapshot instead (a snapshot listens for the ranks itself; it cannot run beside one)."""
    import errno

    if collector.bind_errno == errno.EADDRINUSE:
        from flowtop.tools.listening import snapshot_elsewhere

        print(f"flowtop: {snapshot_elsewhere(collector.listen)}", file=sys.stderr)


def _print_out(text: str, rc: int) -> int:
    """Print the snapshot; a reader that went away (``| head``) is no error and no traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's own flush at exit is quiet
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
