"""A failed rank's exception is shown as the plain text it is, never read as Textual markup.

A trial (two simulated nodes, torchrun + gloo, one node's ``flowtop run`` sent SIGTERM): the other
node's ranks said bye ``error: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/
tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:17128. ...``; the TUI's "rank N failed"
notification parsed it as markup ("closing tag '[/__w/...]' does not match any open tag"), raised
MarkupError and took the whole TUI down (live, and ``flowtop replay`` of the run's recording).
Real path: a probe's Publisher sends hello and bye over ZeroMQ to the real Collector under the app.
"""

from __future__ import annotations

import pytest
from conftest import pilot_until
from textual.widgets._toast import Toast

from flowtop.monitor.collector import Collector
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tui.app import FlowtopApp
from probe.transport.publisher import Publisher
from probe.wire import RankKey

SIZE = (80, 24)
GLOO = ("error: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:17128")


@pytest.mark.asyncio
async def test_a_bye_whose_exception_looks_like_markup_is_a_plain_notification() -> None:
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    app = FlowtopApp(Collector(make_model(), listen), refresh_s=0.1)
    pub = Publisher(RankKey("gloo", "node2", 4242, 3, 0), listen)
    pub.hello_fields = {"local_rank": 1, "world_size": 4, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    try:
        async with app.run_test(size=SIZE, notifications=True) as pilot:  # toasts shown, as live
            assert await pilot_until(pilot, lambda: app.latest is not None and bool(app.latest.jobs))
            pub.publish("step", {"step": 1, "wall_s": 0.05, "tokens": 64, "drops": 0})
            pub.publish("bye", {"reason": GLOO, "steps": 1, "drops": 0})
            said = f"rank 3 of gloo failed: {GLOO}"
            assert await pilot_until(pilot, lambda: any(n.message == said for n in app._notifications)), \
                [n.message for n in app._notifications]
            assert await pilot_until(pilot, lambda: len(app.screen.query(Toast)) > 0)
            await pilot.pause(0.3)  # the toast renders: where the markup raised
            assert app.is_running and app.return_code is None
            (toast,) = app.screen.query(Toast)
            assert str(toast.render()) == said
            # the notice and the status each come with a tick (the notice when every rank ended, or a second on)
            assert await pilot_until(pilot, lambda: app.latest is not None
                                     and app.latest.jobs[0].ranks[0].status == "failed")
            await pilot.press("q")
    finally:
        pub.close()
    assert app.return_code == 0
