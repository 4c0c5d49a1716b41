"""A held ``k`` stays within the monitor's budget of commands (flowtop.monitor.kernel_asks,
probe.wire.command_bound): the extra presses are folded into the request already made or refused,
and said; on a real socket, 100 presses in a second send at most the budget's commands, and a probe
drops none of them nor the pace that follows (it had blamed a port squatter for the user's key).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import zmq

from flowtop.monitor import pacing
from flowtop.monitor.kernel_asks import KernelAsk, KernelAsks
from probe import wire
from probe.transport.publisher import Publisher
from probe.wire import command_bound as cb
from probe.wire.link import upstream_options

from conftest import wait_until
from monitor_thread import MonitorThread

HELLO = {"local_rank": 0, "world_size": 1, "device": "cpu", "probe_version": "test"}


def test_the_monitors_budget_stays_well_inside_the_wires_bound() -> None:
    assert cb.MONITOR_RATE_PER_S == cb.PACES_PER_S + cb.KERNELS_RATE_PER_S + cb.HELLO_ASKS_RATE_PER_S \
        <= cb.RATE_PER_S / 2
    assert cb.MONITOR_BURST <= cb.BURST / 4
    assert 1.0 / pacing.RENEW_S <= cb.PACES_PER_S  # one pace broadcast a renewal, at most


def test_presses_for_one_rank_fold_and_across_ranks_pass_a_bucket() -> None:
    t = [100.0]
    asks = KernelAsks(lambda: t[0])
    # A held key on one rank: 100 presses in a second send one request; the rest are folded.
    said = []
    for i in range(100):
        t[0] = 100.0 + i * 0.0099
        said.append(asks.ask("gpt", 0))
    assert [a.sent for a in said].count(True) == 1 and said[0].text == "asked rank 0 of gpt for a kernel window"
    assert {a.text for a in said[1:]} == {"kernel window already requested from rank 0 of gpt"}
    t[0] = 101.0  # a second after the request: a press asks again
    assert asks.ask("gpt", 0).sent
    # Across ten ranks: KERNELS_BURST at once, then KERNELS_RATE_PER_S.
    t[0], asks = 200.0, KernelAsks(lambda: t[0])
    sent = []
    for i in range(100):
        t[0] = 200.0 + i * 0.0099
        sent.append(asks.ask("gpt", i % 10))
    assert sum(a.sent for a in sent) <= cb.KERNELS_BURST + cb.KERNELS_RATE_PER_S * 1.0
    refused = [a for a in sent if not a.sent and "too fast" in a.text]
    assert refused and refused[0].severity == "warning" and "at most 4 at once, then 1 a second" in refused[0].text


@pytest.mark.parametrize("targets", [1, 10])
def test_a_held_k_sends_within_the_budget_and_a_probe_drops_nothing(targets: int) -> None:
    """100 presses in a second through the collector's send path: a socket set as a probe's counts
    the kernels_now it receives; a real probe's gate drops nothing and takes the pace after."""
    mon = MonitorThread()
    ctx = zmq.Context()
    counter = ctx.socket(zmq.XPUB)
    for name, value in upstream_options(mon.listen):
        counter.setsockopt(getattr(zmq, name), value)
    counter.connect(mon.listen)
    pub = Publisher(wire.RankKey("held-k", "h", 4100, 0, 0), mon.listen)
    pub.hello_fields = dict(HELLO)
    pub.start()
    seen: list[bytes] = []

    def count() -> int:
        while counter.poll(0):
            frame = counter.recv()
            if frame[:1] not in (b"\x00", b"\x01"):
                seen.append(frame)
        return sum(wire.decode_control(f).cmd == "kernels_now" for f in seen)

    try:
        assert wait_until(lambda: pub.subscribers == 1 and counter.poll(0) != 0, 10.0)
        start = time.monotonic()
        answers: list[Any] = []
        for i in range(100):
            answers.append(mon.call(lambda i=i: mon.collector.request_kernels("held-k", i % targets)))
            time.sleep(max(0.0, start + (i + 1) * 0.01 - time.monotonic()))
        elapsed = time.monotonic() - start
        mon.call(lambda: mon.collector._broadcast_pace(0.5))
        assert wait_until(lambda: pub._pace.flush_s == 0.5, 3.0)  # the pace after the presses: taken
        time.sleep(0.2)
        most = 1 + int(elapsed / cb.KERNELS_TARGET_S) if targets == 1 else \
            cb.KERNELS_BURST + int(cb.KERNELS_RATE_PER_S * elapsed)
        assert 1 <= count() <= most, (count(), elapsed)  # 100 before
        assert sum(isinstance(a, KernelAsk) and a.sent for a in answers) == count()
        assert pub.commands_dropped == 0  # nothing over the probe's gate: no "port squatter" said
    finally:
        pub.close(timeout_s=0.2)
        counter.close(0)
        ctx.term()
        mon.close()


@pytest.mark.asyncio
async def test_a_held_k_says_already_requested_once() -> None:
    """The UI says what became of the presses, each thing once while its toast shows."""
    from flowtop.tui.app import FlowtopApp
    from synthetic.replay import ReplaySource, synthetic_stream

    class Limited(ReplaySource):
        asks = KernelAsks()

        def request_kernels(self, job: str, rank: int) -> KernelAsk:  # type: ignore[override]
            ask = self.asks.ask(job, rank)
            if ask.sent:
                self.kernel_requests.append((job, rank))
            return ask

    source = Limited(list(synthetic_stream()), advance=False)
    app = FlowtopApp(source, refresh_s=0)
    said: list[str] = []
    async with app.run_test(size=(80, 24)) as pilot:
        app.notify = lambda message, **kw: said.append(message)  # type: ignore[method-assign]
        await pilot.pause()
        await pilot.press("down", *["k"] * 10)
        app.data.flush()
        await pilot.pause()
        await pilot.pause()
    assert source.kernel_requests == [("gpt-demo", 0)]
    assert said == ["asked rank 0 of gpt-demo for a kernel window",
                    "kernel window already requested from rank 0 of gpt-demo"]
