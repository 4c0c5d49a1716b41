"""A command flood stops at the node relay (flowtop.tools.relay_commands), with real sockets.

A real Relay runs on a thread; a bare XSUB bound where its monitor would be (a port squatter)
subscribes, then floods it with command frames. The ranks behind the relay receive at most the
wire's bound of them (probe.wire.command_bound: a burst of BURST, then RATE_PER_S a second), the
relay counts the rest in its report, says so once on its stderr, keeps forwarding its ranks' frames
through an endless flood, and carries a monitor's pace down again once the flood is over. The
monitor says a flooded relay once.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import zmq

from flowtop.monitor.model import Model
from flowtop.monitor.snapshot_json import relay_json
from flowtop.tools import relay_links
from flowtop.tools.demo.launch import free_port
from flowtop.tools.relay import Relay, RelayConfig
from probe import _log, wire
from probe.transport.publisher import Publisher
from probe.wire import RankKey, command_bound
from snapshot_schema import assert_valid_snapshot

from conftest import wait_until

FLOOD = b"\x02flood"  # malformed: a probe that read one would refuse it
HELLO = {"local_rank": 0, "world_size": 2, "device": "cpu (test)", "probe_version": "test"}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short private directory: ipc paths are limited to ~100 bytes."""
    d = Path(tempfile.mkdtemp(prefix="ftf"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pauses of 0.2 s (the relay's bound and a probe's read it from the wire when each pause
    starts): the tests stay light; each warning is said afresh."""
    monkeypatch.setattr(command_bound, "PAUSE_S", 0.2)
    monkeypatch.setattr(relay_links, "_warned", set())
    monkeypatch.setattr(_log, "_seen", set())


class _Node:
    """A relay on a thread, a squatter subscribed where its monitor would be, and a bare rank
    socket behind the relay that counts the flood's frames it receives."""

    def __init__(self, tmp: Path) -> None:
        self.ctx = zmq.Context()
        upstream = f"tcp://127.0.0.1:{free_port()}"
        self.listen = f"ipc://{tmp}/r.sock"
        self.squatter = self.ctx.socket(zmq.XSUB)
        self.squatter.setsockopt(zmq.LINGER, 0)
        self.squatter.bind(upstream)
        self.relay = Relay(RelayConfig(self.listen, upstream, report_s=0.2, hosted_by="test"))
        self.thread = threading.Thread(target=self.relay.run, daemon=True)
        self.thread.start()
        assert self.relay.ready.wait(10) and not self.relay.error
        deadline = time.monotonic() + 10
        while not self.relay.listening:  # subscribe once its connection is up (as a monitor does)
            assert time.monotonic() < deadline, "the relay never connected"
            self.squatter.send(b"\x01")
            time.sleep(0.05)
        self.rank = self.ctx.socket(zmq.XPUB)
        self.rank.setsockopt(zmq.LINGER, 0)
        self.rank.connect(self.listen)
        assert self.rank.poll(10_000), "the relay never subscribed downstream"
        self.rank.recv()
        self.flood_seen = 0
        self.reports: list[wire.Message] = []
        self.rank_frames = 0

    def count(self) -> int:
        """The flood's frames the rank socket received so far."""
        while self.rank.poll(0):
            if self.rank.recv() == FLOOD:
                self.flood_seen += 1
        return self.flood_seen

    def read_upstream(self) -> None:
        """What the relay sent its "monitor": its reports kept, rank frames counted."""
        while self.squatter.poll(0):
            parts = self.squatter.recv_multipart()
            for part in parts[1:]:
                if wire.envelope(part).kind == "relay":
                    self.reports.append(wire.decode(part))
                else:
                    self.rank_frames += 1

    def close(self) -> None:
        self.relay.stop()
        self.thread.join(10)
        self.rank.close(0)
        self.squatter.close(0)
        self.ctx.term()


def test_a_flood_stops_at_the_relay_is_counted_said_and_a_pace_after_it_reaches_the_rank(
        short_dir: Path, short_pauses: None, capsys: pytest.CaptureFixture[str]) -> None:
    node = _Node(short_dir)
    pub = Publisher(RankKey("behind", "node", 4242, 1, 0), node.listen)  # a real probe behind the relay
    pub.hello_fields = dict(HELLO)
    pub.start()
    try:
        assert wait_until(lambda: pub.subscribers == 1, 5.0)
        start = time.monotonic()
        for _ in range(5000):
            node.squatter.send(FLOOD)  # an XSUB drops past its high-water mark: not all arrive
        last = [node.count(), time.monotonic()]

        def settled() -> bool:  # nothing more for 0.4 s: what the flood sent is read
            if node.count() != last[0]:
                last[:] = [node.count(), time.monotonic()]
            return time.monotonic() - last[1] >= 0.4
        assert wait_until(settled, 4.0)
        elapsed = time.monotonic() - start
        # The wire's bound: the whole burst passes, then RATE_PER_S a second (one more for the
        # token that may accrue between two reads); 5,000 minus what an XSUB drops, before.
        bound = command_bound.BURST + command_bound.RATE_PER_S * elapsed + 1
        assert command_bound.BURST <= node.flood_seen <= bound, (node.flood_seen, elapsed)
        assert node.relay.commands_dropped >= 100  # at least what one read drained
        said = [line for line in capsys.readouterr().err.splitlines() if "commands/s or more" in line]
        assert len(said) == 1 and said[0].startswith("flowtop relay: ") and "relay's upstream socket" in said[0]
        print(f"{node.flood_seen} of the flood reached the rank in {elapsed:.2f} s (bound {bound:.0f}); "
              f"the relay dropped {node.relay.commands_dropped:,}")

        # Its report carries the count; the monitor says it once.
        assert wait_until(lambda: (node.read_upstream(), bool(node.reports) and
                                    node.reports[-1].fields.get("commands_dropped", 0) > 0)[1], 3.0)
        report = node.reports[-1]
        assert 0 < report.fields["commands_dropped"] <= node.relay.commands_dropped
        model = Model()
        model.ingest(report, 1.0)
        (notice,) = model.notices.take()
        assert notice.severity == "warning" and notice.text.startswith(
            f"the relay on {report.key.host} dropped {report.fields['commands_dropped']:,} commands unread")
        (shown,) = model.relays.snapshot(1.0)
        assert shown.commands_dropped == report.fields["commands_dropped"]

        # The flood is over: the bucket refills and a monitor's pace reaches the rank.
        node.squatter.send(wire.encode_control("pace", None, None, 0.5))
        assert wait_until(lambda: pub._pace.flush_s == 0.5, 2.0)
    finally:
        pub.close(timeout_s=0.2)
        node.close()


def test_an_endless_flood_still_lets_the_ranks_frames_and_reports_out(short_dir: Path, short_pauses: None) -> None:
    """The turn that ends each pause sends what waits, though its read starts the next pause."""
    node = _Node(short_dir)
    try:
        start = time.monotonic()
        end = start + 2.0
        sent = 0
        while time.monotonic() < end:
            for _ in range(200):  # one thread owns the socket: flood and read by turns
                node.squatter.send(FLOOD)
            sent += 1
            node.rank.send(wire.encode("hello", RankKey("j", "node", 1, 0, 0), sent, time.time(), {}))
            node.read_upstream()
            time.sleep(0.01)
        flooded = [r.fields.get("commands_dropped", 0) for r in node.reports]
        assert node.relay.commands_dropped > 0 and node.rank_frames > 0, (node.relay.commands_dropped, node.rank_frames)
        assert len([d for d in flooded if d > 0]) >= 2, flooded  # reported at each pause's end, growing
        assert flooded == sorted(flooded)
        assert node.count() <= command_bound.BURST + command_bound.RATE_PER_S * (time.monotonic() - start) + 1
    finally:
        node.close()


def test_the_monitor_says_a_flooded_relay_once() -> None:
    """The count arrives in the relay's report; the monitor shows the latest and says the first
    report of each relay that dropped any, once per relay."""
    model = Model()
    seq = [0]

    def report(relay: str, host: str, dropped: int) -> wire.Message:
        seq[0] += 1
        fields: dict[str, Any] = {
            "relay": relay, "listen": "ipc:///r", "upstream": "tcp://m:5758", "ranks": 1, "frames_in": 0,
            "frames_out": 0, "bytes_in": 0, "bytes_out": 0, "drops": 0, "queued": 0, "commands": 0,
            "link_ups": 1, "uptime_s": 1.0, "commands_dropped": dropped,
        }  # fmt: skip
        return wire.decode(wire.encode("relay", RankKey("", host, 7, 0, 0), seq[0], 1.0, fields))

    model.ingest(report("a:7:1", "a", 0), 1.0)
    assert model.notices.take() == ()
    model.ingest(report("a:7:1", "a", 250), 2.0)
    model.ingest(report("a:7:1", "a", 900), 3.0)  # the same relay: not said again
    model.ingest(report("b:7:2", "b", 40), 3.0)  # another relay: said
    texts = [n.text for n in model.notices.take()]
    assert [t.split(" commands")[0] for t in texts] == ["the relay on a dropped 250", "the relay on b dropped 40"]
    assert "a relay takes 32, then 4 a second" in texts[0]
    assert [r.commands_dropped for r in model.relays.snapshot(3.0)] == [900, 40]
    snap = model.snapshot(3.0)
    assert [relay_json(r)["commands_dropped"] for r in snap.relays] == [900, 40]
    from flowtop.export.exporter import snapshot_families

    (exported,) = [f for f in snapshot_families(snap) if f.name == "flowtop_relay_commands_dropped"]
    assert {s.labels["relay"]: s.value for s in exported.samples} == {"a": 900, "b": 40}
    from flowtop.monitor.snapshot_json import to_json

    assert_valid_snapshot(to_json(snap))
