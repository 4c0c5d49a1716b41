"""The open-file limit: the monitor raises its soft limit to the hard one and, when even that
leaves room for fewer connections than a large job needs, says how many it can take."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from flowtop.monitor.fdwatch import RESERVE, capacity
from flowtop.monitor.limits import Limits
from flowtop.tools.demo.launch import free_port_pair

ROOT = Path(__file__).resolve().parent.parent
TOLD = re.compile(r"open-file limit (\d+) \(hard (\d+)\): this monitor can take about (\d+) probe or relay "
                  r"connections on (\S+) \((\d+) descriptors in use\)")


def test_capacity_is_the_soft_limit_less_what_is_open_and_the_reserve() -> None:
    assert capacity(200, 17) == 200 - 17 - RESERVE
    assert capacity(20, 30) == 0
    assert capacity(1000, None) == 1000 - RESERVE


def _snapshot_under(soft: int, hard: int) -> str:
    """stderr of ``flowtop snapshot`` started with RLIMIT_NOFILE (soft, hard)."""
    listen = f"tcp://127.0.0.1:{free_port_pair()}"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    proc = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--timeout", "1", "--listen", listen],
                          cwd=ROOT, preexec_fn=limit, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert listen in proc.stdout or "no probes heard" in proc.stdout
    return proc.stderr


def test_a_low_hard_limit_is_told_with_the_connections_the_monitor_can_take() -> None:
    """Soft 64 is raised to the hard 300, which still leaves room for fewer connections than the
    largest job the monitor admits: the notice (stderr headless, a notification in the TUI) gives
    the limit and the computed capacity, once."""
    err = _snapshot_under(64, 300)
    found = TOLD.findall(err)
    assert len(found) == 1, err
    soft, hard, room, _, used = (int(x) if x.isdigit() else x for x in found[0])
    assert (soft, hard) == (300, 300)  # the soft limit was raised to the hard one
    assert room == soft - used - RESERVE and 0 < room < 300
    assert "flowtop run --relay on" in err and "ulimit -Hn" in err


def test_enough_descriptors_say_nothing() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = Limits().max_ranks_per_job + 200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"hard open-file limit {hard} < {wanted}")
    err = _snapshot_under(64, wanted)  # soft 64 alone would be far too low: it is raised
    assert not TOLD.search(err), err


def test_the_monitor_binds_after_everything_that_needs_a_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once bound, libzmq accepts probe connections on its own thread: at a low open-file limit they
    took every descriptor left, and the kernel worker's import after the bind failed (EMFILE: the
    monitor exited with a traceback, seen in CI under load). The socket monitor, the kernel worker
    and the descriptor count now come first."""
    import asyncio

    import zmq.asyncio

    from flowtop.monitor import collector as collector_mod
    from flowtop.monitor import kernel_worker
    from flowtop.monitor.wiring import make_model

    order: list[str] = []

    def spy(cls: type, name: str) -> None:
        real = getattr(cls, name)

        def called(self: object, *args: object, **kwargs: object) -> object:
            order.append(name)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, called)

    spy(zmq.asyncio.Socket, "bind")
    spy(zmq.asyncio.Socket, "get_monitor_socket")
    spy(kernel_worker.KernelWorker, "__init__")
    spy(collector_mod.FdHeadroom, "at_start")

    async def start_stop() -> None:
        c = collector_mod.Collector(make_model(), f"tcp://127.0.0.1:{free_port_pair()}")
        await c.start()
        await c.stop()

    asyncio.run(start_stop())
    assert order[-1] == "bind" and set(order) == {"bind", "get_monitor_socket", "__init__", "at_start"}, order


def test_a_collector_started_again_closes_its_sockets_again() -> None:
    """A collector is started again after a stop (a second TUI over it): its second stop must
    close that start's context too. Skipped, the unclosed context blocked a later garbage
    collection in Context.__del__ for good (the test run hung)."""
    import asyncio

    from flowtop.monitor.collector import Collector
    from flowtop.monitor.wiring import make_model

    async def twice() -> list[bool]:
        c = Collector(make_model(), f"tcp://127.0.0.1:{free_port_pair()}")
        closed = []
        for _ in range(2):
            await c.start()
            ctx = c._ctx
            await c.stop()
            closed.append(ctx.closed)
        return closed

    assert asyncio.run(twice()) == [True, True]
