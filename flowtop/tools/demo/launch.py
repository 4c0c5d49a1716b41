"""``flowtop demo``: a monitor plus a real N-rank DDP training launched through ``flowtop run``.

The training is ``torchrun --standalone`` of :mod:`flowtop.tools.demo.train` (gloo on
CPU), with the probe injected by the bootstrap exactly as for a user's script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from typing import Any

from flowtop.monitor.snapshot import ENDED
from probe import wire

#: After the training exits, how long to wait for its ranks' last (bye) messages.
BYE_GRACE_S = 3.0


def free_port() -> int:
    """A loopback TCP port that was free just now (the monitor needs one: probes reach it, and it
    sends its commands back, on the same connection)."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    except OSError:
        return wire.DEFAULT_PORT


#: The name the tests and benchmarks import (it once reserved a second port, for commands).
free_port_pair = free_port


def training_command(ranks: int, steps: int, extra: list[str] | None = None) -> list[str]:
    """The torchrun command line of the demo training."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
        "--module", "flowtop.tools.demo.train", f"--steps={steps}", *(extra or []),
    ]  # fmt: skip


class DemoSource:
    """A snapshot source that owns a collector and the training it launched."""

    can_capture = True  # through its collector

    def __init__(self, collector: Any, cmd: list[str], env: dict[str, str], log_path: str) -> None:
        self.collector = collector
        self.cmd = cmd
        self.env = env
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self._error = ""

    @property
    def start_error(self) -> str:
        """Why :meth:`start` failed ("" until it does)."""
        return self._error or getattr(self.collector, "start_error", "")

    async def start(self) -> None:
        """Bind the monitor first, then start the training."""
        await self.collector.start()
        # The training's output goes to a log file: it would tear the TUI or the JSON.
        try:
            with open(self.log_path, "wb") as log:
                self.proc = await asyncio.create_subprocess_exec(*self.cmd, env=self.env, stdout=log, stderr=log)
        except OSError as exc:
            self._error = f"cannot start the demo training: {exc}"
            await self.collector.stop()  # the app never calls stop() on a source that did not start
            raise

    def snapshot(self) -> Any:
        """The collector's snapshot."""
        return self.collector.snapshot()

    @property
    def on_tick(self) -> Any:
        """The collector's tick listener (the data thread sets it)."""
        return self.collector.on_tick

    @on_tick.setter
    def on_tick(self, listener: Any) -> None:
        self.collector.on_tick = listener

    def catch_up(self) -> float:
        """The collector's ticks due now."""
        return self.collector.catch_up()

    @property
    def notices(self) -> Any:
        """The collector's monitor-side errors."""
        return self.collector.notices

    def request_kernels(self, job: str, rank: int) -> Any:
        """Forwarded to the collector (what became of it: flowtop.monitor.kernel_asks.KernelAsk)."""
        return self.collector.request_kernels(job, rank)

    async def stop(self) -> None:
        """Stop the training (if still running) and the collector."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                self.proc.kill()
        await self.collector.stop()


async def _headless(source: DemoSource, timeout_s: float) -> tuple[Any, int]:
    """Run the training to its end (the collector ticks meanwhile: hints form as in the TUI) and
    return the snapshot of the first tick that found every rank done, or the last one."""
    await source.start()
    assert source.proc is not None
    deadline = time.monotonic() + timeout_s
    done = asyncio.Event()

    def on_tick(snap: Any) -> None:
        ranks = [r for j in snap.jobs for r in j.ranks]
        if ranks and all(r.status in ENDED for r in ranks):
            done.set()

    source.on_tick = on_tick
    try:
        code = await asyncio.wait_for(source.proc.wait(), timeout_s)
        # Give the last bye messages a moment to arrive — only a moment: a training that
        # failed before any rank reported will never send one.
        try:
            await asyncio.wait_for(done.wait(), max(0.0, min(deadline - time.monotonic(), BYE_GRACE_S)))
        except asyncio.TimeoutError:
            return source.snapshot(), code
        published = source.collector.published
        return (published if published is not None else source.snapshot()), code
    except asyncio.TimeoutError:
        return source.snapshot(), 124
    finally:
        await source.stop()


def main(args: argparse.Namespace) -> int:
    """Run the demo (TUI or ``--headless`` JSON)."""
    import os

    from flowtop.monitor.collector import AddressError, Collector, is_loopback, parse_tcp
    from flowtop.monitor.wiring import make_model
    from flowtop.tools import runner
    from flowtop.tools.common import start_failed

    listen = args.listen or f"tcp://127.0.0.1:{free_port()}"
    try:
        if not is_loopback(parse_tcp(listen)[0]):  # the demo has no authentication to offer
            raise AddressError(f"refusing to bind {listen}: the demo listens on a loopback address only")
        collector = Collector(make_model(), listen)
    except AddressError as exc:
        print(f"flowtop demo: {exc}", file=sys.stderr)
        return 2
    steps = args.steps or (20 if args.headless else 2000)
    env = runner.probe_env(os.environ, connect=listen)
    import tempfile

    log_path = os.path.join(tempfile.gettempdir(), f"flowtop-demo-{os.getpid()}.log")
    source = DemoSource(collector, training_command(args.ranks, steps), env, log_path)
    if args.headless:
        from flowtop.monitor.snapshot_json import to_json

        try:
            snap, code = asyncio.run(_headless(source, timeout_s=60.0 + steps * 2.0))
        except AddressError as exc:  # the port is taken
            print(f"flowtop demo: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(to_json(snap, with_kernels=False), indent=2))
        if code != 0:
            with open(log_path, encoding="utf-8", errors="replace") as fh:
                tail = fh.read()[-3000:]
            print(f"flowtop demo: training exited with code {code}; log {log_path}:\n{tail}", file=sys.stderr)
        return 0 if code == 0 else 1
    from flowtop.monitor import gcpolicy
    from flowtop.tui.app import QUIT_SIGNALS, FlowtopApp

    gcpolicy.for_monitor()
    FlowtopApp(source, quit_on=QUIT_SIGNALS).run()
    return start_failed(source)
