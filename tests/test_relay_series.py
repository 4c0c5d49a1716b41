"""The relays' Prometheus series: one per relay address of a host, over real HTTP scrapes.

Real relays (flowtop.tools.relay.Relay on threads, FLOWTOP_HOST naming their host), real probe
publishers behind them, a real collector on its data thread, /metrics parsed with
prometheus_client. Two relays running at once on one host had been one series, the most recently
heard (a new user's trial: one of the two hidden); a relay restarted on its address must still
leave one series, not a dead duplicate beside its successor."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
import time
from typing import Any, Iterator

import pytest

from flowtop.export.exporter import ExportPolicy, snapshot_families
from flowtop.monitor.snapshot import MonitorSnapshot, RelaySnapshot
from flowtop.tools.relay import Relay, RelayConfig
from probe.wire import RankKey
from test_prometheus import Monitor, by_name, made, publisher, train  # noqa: F401  (made: the fixture)

RELAY_FAMILIES = ("flowtop_relay_status", "flowtop_relay_ranks", "flowtop_relay_frames_in_total",
                  "flowtop_relay_frames_out_total", "flowtop_relay_drops_total",
                  "flowtop_relay_commands_dropped_total", "flowtop_relay_link_lag_seconds")


class _Relay:
    """A real relay on a thread: ``listen`` on its host, forwarding to ``upstream``."""

    def __init__(self, listen: str, upstream: str) -> None:
        self.relay = Relay(RelayConfig(listen, upstream, report_s=0.2, hosted_by="test"))
        self.thread = threading.Thread(target=self.relay.run, daemon=True)
        self.thread.start()
        assert self.relay.ready.wait(10) and not self.relay.error

    def close(self) -> None:
        self.relay.stop()  # flushes, says "closing" upstream
        self.thread.join(10)


@pytest.fixture
def short_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="ftrs")  # ipc paths are short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _relay_series(text: str) -> dict[str, dict[str, float]]:
    """relay label -> family -> value, of a scrape (the status: its one state that is set)."""
    out: dict[str, dict[str, float]] = {}
    for name in RELAY_FAMILIES:
        for s in by_name(text, name):
            if name == "flowtop_relay_status":
                if s.value == 1:
                    out.setdefault(s.labels["relay"], {})[s.labels[name]] = 1
                continue
            assert s.labels.keys() == {"relay"}
            out.setdefault(s.labels["relay"], {})[name] = s.value
    return out


def _rank_relays(text: str) -> dict[int, str]:
    """rank -> its ``relay`` label, from its step series."""
    return {int(s.labels["rank"]): s.labels["relay"] for s in by_name(text, "flowtop_rank_step_seconds")}


def test_two_relays_running_at_once_on_one_host_are_two_series(
        made: list[Any], short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Two relays of node-r on two addresses (two users' flowtop run, say), 2 ranks behind the
    first, 1 behind the second: two series named by host and address, each with its own ranks."""
    monkeypatch.setenv("FLOWTOP_HOST", "node-r")
    mon = Monitor(ExportPolicy())
    made.append(mon)
    a, b = f"ipc://{short_dir}/a.sock", f"ipc://{short_dir}/b.sock"
    for listen in (a, b):
        made.append(_Relay(listen, mon.listen))
    for rank, via in enumerate((a, a, b)):
        pub = publisher(via, RankKey("two", "node-r", 4000 + rank, rank, 0), 3, rank)
        made.append(pub)
        train(pub, 20)
    mon.wait(lambda s: sorted(r["ranks"] for r in s["relays"]) == [1, 2]
             and all(r["listen"] for r in s["relays"]) and len(s["jobs"]) == 1
             and all(r["relay"] for r in s["jobs"][0]["ranks"]) and len(s["jobs"][0]["ranks"]) == 3, 30)
    text, snap = mon.moment()
    la, lb = f"node-r {a}", f"node-r {b}"
    series = _relay_series(text)
    assert sorted(series) == [la, lb]
    assert series[la]["live"] == series[lb]["live"] == 1
    assert (series[la]["flowtop_relay_ranks"], series[lb]["flowtop_relay_ranks"]) == (2, 1)
    frames = {f"node-r {r['listen']}": r["frames_in"] for r in snap["relays"]}
    assert {k: v["flowtop_relay_frames_in_total"] for k, v in series.items()} == frames
    assert _rank_relays(text) == {0: la, 1: la, 2: lb}  # a rank joins its relay's series on (relay)


def test_a_relay_restarted_on_its_address_goes_on_as_one_series(
        made: list[Any], short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """node-s's relay ends (closed) and another binds its address, as a waiting flowtop run of the
    node does: the monitor lists both, the exporter one series, the new relay's, named by the host."""
    monkeypatch.setenv("FLOWTOP_HOST", "node-s")
    mon = Monitor(ExportPolicy())
    made.append(mon)
    listen = f"ipc://{short_dir}/s.sock"
    first = _Relay(listen, mon.listen)
    made.append(first)  # closed below; closing again is a no-op
    pub = publisher(listen, RankKey("restart", "node-s", 4100, 0, 0), 1, 0)
    made.append(pub)
    train(pub, 10)
    mon.wait(lambda s: [r["ranks"] for r in s["relays"]] == [1], 30)
    first.close()
    second = _Relay(listen, mon.listen)
    made.append(second)
    for step in range(11, 40):  # the rank goes on; its probe reconnects to the new relay
        pub.publish("step", {"step": step, "wall_s": 0.05, "tokens": 512, "drops": 0, "input_wait_s": 0.0})
        time.sleep(0.05)
    mon.wait(lambda s: sorted((r["status"], r["ranks"]) for r in s["relays"]) == [("closed", 0), ("live", 1)], 30)
    text, snap = mon.moment()
    assert sorted(r["status"] for r in snap["relays"]) == ["closed", "live"]
    series = _relay_series(text)
    assert list(series) == ["node-s"]
    assert series["node-s"]["live"] == 1 and series["node-s"]["flowtop_relay_ranks"] == 1
    (live,) = [r for r in snap["relays"] if r["status"] == "live"]
    assert series["node-s"]["flowtop_relay_frames_in_total"] == live["frames_in"]
    assert _rank_relays(text) == {0: "node-s"}


def _rel(host: str, pid: int, listen: str | None, status: str = "live", age_s: float = 0.5,
         ranks: int = 2) -> RelaySnapshot:
    return RelaySnapshot(relay=f"{host}:{pid}:ab", host=host, pid=pid, status=status, age_s=age_s, listen=listen,
                         upstream="tcp://m:1", hosted_by="flowtop run", ranks_connected=ranks, ranks=ranks,
                         frames_in=10 * pid, frames_out=10 * pid, bytes_in=100, bytes_out=100, drops=0, queued=0,
                         commands=0, commands_dropped=0, link_ups=1, uptime_s=5.0, batches=4, link_lag_s=0.0)


def _ranks_by_label(relays: tuple[RelaySnapshot, ...]) -> dict[str, float]:
    snap = MonitorSnapshot(taken_at=100.0, listen="tcp://127.0.0.1:5759", jobs=(), received=0, rejected=0,
                           relays=relays)
    (fam,) = [f for f in snapshot_families(snap) if f.name == "flowtop_relay_ranks"]
    return {s.labels["relay"]: s.value for s in fam.samples}


def test_a_successor_before_its_first_report_takes_its_predecessors_series() -> None:
    """A relay that has sent batches but no report yet has no address known (a second after it
    starts): on a host whose relays are on one address it is that address's successor, not a
    series of its own for that second; a host with relays on two addresses names each, and is
    the host alone again once the monitor forgets the other."""
    old, new = _rel("node1", 10, "ipc:///x.sock", "silent", age_s=4.0, ranks=0), _rel("node1", 11, None, ranks=3)
    assert _ranks_by_label((old, new)) == {"node1": 3}  # the newest, not 0 of the dead one
    other = _rel("node1", 12, "ipc:///y.sock", ranks=1)
    assert _ranks_by_label((old, dataclasses.replace(new, listen="ipc:///x.sock"), other)) == {
        "node1 ipc:///x.sock": 3, "node1 ipc:///y.sock": 1}
    assert _ranks_by_label((other,)) == {"node1": 1}


def test_a_relay_that_ended_with_no_rank_does_not_split_its_host() -> None:
    """The job before on another socket path (closed, no rank behind it) leaves the next job's relay
    labelled with the host alone, from its start, not renamed when the monitor forgets the old
    one; a dead relay with ranks still behind it is an address of the host's."""
    ended = _rel("node1", 10, "ipc:///a.sock", "closed", age_s=30.0, ranks=0)
    live = _rel("node1", 11, "ipc:///b.sock", ranks=4)
    assert _ranks_by_label((ended, live)) == {"node1": 4}
    assert _ranks_by_label((live,)) == {"node1": 4}
    cut = dataclasses.replace(ended, status="silent", ranks=2)
    assert _ranks_by_label((cut, live)) == {"node1 ipc:///a.sock": 2, "node1 ipc:///b.sock": 4}


def test_a_relay_before_its_first_report_does_not_hide_a_live_relay() -> None:
    """A new relay (no address yet) beside a live one on another address is not that one's
    successor: the live relay's series stays its own (not 0 ranks, not a counter reset); where a
    dead relay is there too, the new one takes the dead one's address."""
    live = _rel("node1", 10, "ipc:///x.sock", age_s=0.1, ranks=4)
    new = _rel("node1", 12, None, age_s=0.05, ranks=1)
    assert _ranks_by_label((live, new)) == {"node1": 4}
    dead = _rel("node1", 11, "ipc:///y.sock", "closed", age_s=3.0, ranks=2)
    assert _ranks_by_label((live, dead, new)) == {"node1 ipc:///x.sock": 4, "node1 ipc:///y.sock": 1}
