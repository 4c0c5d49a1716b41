"""Node relays (flowtop relay, and the one flowtop run hosts), with real sockets and processes:
ranks behind two relays reach one collector, commands reach the right rank, a dead relay marks
its ranks only, a restarted one brings them back, frames keep the relay's receive times, step
times are the same through a relay, and two flowtop run processes of a node share one upstream
connection, handing the relay over when the first ends."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import msgpack
import psutil
import pytest
import zmq

from flowtop.tools import keys
from flowtop.cli import main as cli_main
from flowtop.monitor.collector import Collector
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tools.relay import PathLock
from flowtop.monitor.relays import encode_stamp
from probe.wire import WireError
from flowtop.monitor.rankview import job_context
from flowtop.monitor.snapshot_json import to_json
from flowtop.export.textreport import render
from flowtop.monitor.wiring import make_model
from monitor_thread import MonitorThread
from probe import wire
from probe.transport.publisher import Publisher
from probe.wire import RankKey
from snapshot_schema import assert_valid_snapshot

ROOT = Path(__file__).resolve().parent.parent
HELLO = {"local_rank": 0, "world_size": 4, "device": "cpu (test)", "probe_version": "test"}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short private directory: ipc paths are limited to ~100 bytes."""
    d = Path(tempfile.mkdtemp(prefix="ftr"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _relay(listen: str, upstream: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flowtop.cli", "relay", "--listen", listen, "--connect", upstream,
                             *extra], stderr=subprocess.PIPE, text=True)  # fmt: skip


class _Ranks:
    """Real probe publishers stepping every 20 ms on a thread; commands they obey are kept."""

    def __init__(self, job: str, addrs: dict[int, str]) -> None:
        self.pubs: dict[int, Publisher] = {}
        self.commands: list[tuple[int, str]] = []
        for rank, addr in addrs.items():
            pub = Publisher(RankKey(job, "node-a" if rank < 2 else "node-b", 5000 + rank, rank, 0), addr)
            pub.hello_fields = dict(HELLO, local_rank=rank % 2)
            pub.on_control(lambda cmd, rank=rank: self.commands.append((rank, cmd)))
            pub.start()
            self.pubs[rank] = pub
        self._stop = False
        self._thread = threading.Thread(target=self._step, daemon=True)
        self._thread.start()

    def _step(self) -> None:
        step = 0
        while not self._stop:
            step += 1
            for pub in self.pubs.values():
                pub.publish("step", {"step": step, "wall_s": 0.02, "tokens": 64, "drops": 0})
            time.sleep(0.02)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        for pub in self.pubs.values():
            pub.close()


def _ranks(snap: Any) -> dict[int, Any]:
    return {r.rank: r for j in snap.jobs for r in j.ranks}


def test_two_relays_every_rank_commands_and_a_dead_relay_marks_only_its_ranks(short_dir: Path) -> None:
    mon = MonitorThread()
    a, b = f"ipc://{short_dir}/a.sock", f"ipc://{short_dir}/b.sock"
    relays = {"a": _relay(a, mon.listen), "b": _relay(b, mon.listen)}
    ranks = _Ranks("two-relays", {0: a, 1: a, 2: b, 3: b})
    try:
        t0 = time.monotonic()
        snap = mon.wait_for(lambda s: len(_ranks(s)) == 4 and all(r.step > 5 for r in _ranks(s).values())
                            and len(s.relays) == 2 and all(r.ranks_connected == 2 for r in s.relays), 15)
        print(f"4 ranks through 2 relays seen after {time.monotonic() - t0:.2f} s")
        by_listen = {r.listen: r for r in snap.relays}
        assert set(by_listen) == {a, b} and all(r.status == "live" and r.hosted_by == "flowtop relay" for r in snap.relays)
        first_a = by_listen[a].relay
        assert [_ranks(snap)[i].relay for i in range(4)] == [first_a, first_a, by_listen[b].relay, by_listen[b].relay]
        assert all(r.status == "live" and r.cut is None for r in _ranks(snap).values())
        assert all(r.ranks == 2 and r.drops == 0 and r.frames_out <= r.frames_in for r in snap.relays)
        assert_valid_snapshot(to_json(snap))

        # A command for rank 3 travels monitor -> relay b -> its two ranks; only rank 3 obeys.
        mon.call(lambda: mon.collector.request_kernels("two-relays", 3))
        mon.call(lambda: mon.collector.request_kernels("two-relays", 0))
        deadline = time.monotonic() + 5
        while len(ranks.commands) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # nobody else obeys late either
        assert sorted(ranks.commands) == [(0, "kernels_now"), (3, "kernels_now")]
        # The monitor sends a command on every connection and each relay carries it down (the
        # figure arrives with their next report): the probes' filter is what picks the rank.
        snap = mon.wait_for(lambda s: all(r.commands == 2 for r in s.relays), 3)
        assert {r.listen: r.commands for r in snap.relays} == {a: 2, b: 2}

        # Relay a dies without a word: its ranks are marked, the job still runs on relay b's.
        relays["a"].kill()
        relays["a"].wait()
        killed = time.monotonic()
        snap = mon.wait_for(lambda s: all(_ranks(s)[i].status == "stale" for i in (0, 1)), 10)
        print(f"ranks of the killed relay marked after {time.monotonic() - killed:.2f} s")
        r = _ranks(snap)
        assert [r[i].status for i in range(4)] == ["stale", "stale", "live", "live"]
        assert r[0].status_reason_at(snap.taken_at).startswith(f"relay {by_listen[a].host} silent for ")
        assert r[2].cut is None and snap.jobs[0].status == "running"
        # Unheard, not stopped: no rate (None, not 0) and no lag; the job's figures over the heard.
        assert r[0].tokens_per_s is None and r[1].tokens_per_s is None
        job = snap.jobs[0]
        assert len(job.unheard) == 2 and job.over_phrase == f"over 2 of 4 ranks; 2 unheard behind relay {by_listen[a].host}"
        assert job.tokens_per_s == pytest.approx(r[2].tokens_per_s + r[3].tokens_per_s)  # summed (no mesh)
        ctx = job_context(job.ranks)  # the lead is the heard ranks' (the cut ones' steps are as last heard)
        assert ctx.lag(r[0]) is None and ctx.lead_step == max(r[2].step, r[3].step) and ctx.lag(r[2]) is not None
        assert to_json(snap)["jobs"][0]["unheard_ranks"] == 2
        snap = mon.wait_for(lambda s: any(h.id == "relay_silent" for h in s.jobs[0].hints), 5)
        (hint,) = [h for h in snap.jobs[0].hints if h.id == "relay_silent"]
        assert hint.evidence["unheard_ranks"] == 2 and hint.evidence["hosts"] == [by_listen[a].host]
        r = _ranks(snap)
        assert {x.listen: x.status for x in snap.relays} == {a: "silent", b: "live"}
        assert_valid_snapshot(to_json(snap))
        text = render(snap)  # flowtop snapshot's text says it too
        assert "relays: 2 (1 live, 1 silent)" in text and f"stale ({r[0].status_reason_at(snap.taken_at)})" in text

        # A relay on the same path again: the ranks come back through it, as after a monitor restart.
        relays["a"] = _relay(a, mon.listen)
        restarted = time.monotonic()
        snap = mon.wait_for(lambda s: all(_ranks(s)[i].status == "live" and _ranks(s)[i].relay != first_a
                                          for i in (0, 1)), 15)
        print(f"ranks back through the restarted relay after {time.monotonic() - restarted:.2f} s")
        r = _ranks(snap)
        assert all(r[i].status == "live" and r[i].cut is None for i in range(4))
        assert r[0].relay == r[1].relay != first_a
        # The probes held or dropped (and counted) while nobody listened; nothing blocked.
        print("probe drops while relay a was away:", {i: ranks.pubs[i].drops for i in range(4)})
    finally:
        ranks.close()
        for p in relays.values():
            p.terminate()
            p.wait(10)
        mon.close()


def _batch(sock: Any, relay: str, clock: float, frames: list[bytes], ages_us: list[int]) -> None:
    sock.send_multipart([encode_stamp(relay, clock, ages_us), *frames])


def test_frames_count_as_received_when_the_relay_received_them() -> None:
    """A frame held 1.5 s in the relay, and a batch delayed 1 s on the upstream link, count at the
    relay's receive time; a batch without a valid stamp is refused and counted."""
    mon = MonitorThread()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)  # what a relay's upstream side is
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(mon.listen)
    key = RankKey("stamped", "node-s", 9, 0, 0)
    try:
        assert sock.recv() == b"\x01"  # the collector's subscription
        hello = wire.encode("hello", key, 0, time.time(), dict(HELLO, world_size=1))

        def step(n: int) -> bytes:
            return wire.encode("step", key, n, time.time(), {"step": n, "wall_s": 0.1, "tokens": 8, "drops": 0})

        # A prompt batch (the offset between the clocks is learnt from it) whose frames the relay
        # held 1.5 s: they count 1.5 s before it arrived.
        t0 = time.monotonic()
        _batch(sock, "node-s:1:00000001", t0, [hello, step(1)], [1_500_000, 1_500_000])
        # A batch sent now that the upstream link delays by 1 s: it counts now, not on arrival.
        t1 = time.monotonic()
        frames = [encode_stamp("node-s:1:00000001", t1, [0]), step(2)]
        time.sleep(1.0)
        sock.send_multipart(frames)
        snap = mon.wait_for(lambda s: any(r.step == 2 for r in _ranks(s).values()), 5)
        reached = dict(_ranks(snap)[0].history.reached)
        print(f"step 1 counted at {reached[1] - t0:+.3f} s (held 1.5 s), step 2 at {reached[2] - t1:+.3f} s "
              f"(arrived 1 s late)")
        assert abs(reached[1] - (t0 - 1.5)) < 0.1 and abs(reached[2] - t1) < 0.1
        relay = snap.relays[0]
        assert relay.relay == "node-s:1:00000001" and relay.batches == 2 and 0.9 < relay.link_lag_s < 1.3
        assert relay.ranks == 1 and _ranks(snap)[0].relay == relay.relay

        sock.send_multipart([b"not a stamp", step(3)])
        _batch(sock, "node-s:1:00000001", time.monotonic(), [step(3), step(4)], [0])  # ages for 1 of 2
        snap = mon.wait_for(lambda s: s.rejected >= 2, 5)
        assert _ranks(snap)[0].step == 2
        assert any("relay stamp" in why for why in snap.rejected_reasons), snap.rejected_reasons
    finally:
        sock.close(0)
        ctx.term()
        mon.close()


def test_a_curve_monitor_admits_the_relay_and_its_keyless_ranks(short_dir: Path) -> None:
    d = keys.create(short_dir / "k")
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    mon = MonitorThread(listen=listen, collector=Collector(make_model(), listen, curve=keys.load_server(d)))
    addr = f"ipc://{short_dir}/c.sock"
    relay = _relay(addr, listen, "--curve-dir", str(d))
    ranks = _Ranks("curve", {0: addr})
    try:
        snap = mon.wait_for(lambda s: any(r.step > 3 for r in _ranks(s).values()), 15)
        assert _ranks(snap)[0].status == "live" and snap.relays[0].status == "live" and snap.rejected == 0
    finally:
        ranks.close()
        relay.terminate()
        relay.wait(10)
        mon.close()


@pytest.mark.slow
def test_a_relay_holding_another_server_key_says_so(short_dir: Path) -> None:
    """A relay given another key directory (a stale copy) than its keyed monitor's: the monitor
    drops each connection before the handshake and the relay's socket reports only that; it
    said nothing and forwarded nothing (a new user's trial, behind `flowtop run`)."""
    d = keys.create(short_dir / "k")
    other = keys.create(short_dir / "o")
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    mon = MonitorThread(listen=listen, collector=Collector(make_model(), listen, curve=keys.load_server(d)))
    relay = _relay(f"ipc://{short_dir}/w.sock", listen, "--curve-dir", str(other))
    try:
        mon.wait_for(lambda s: s.rejected >= 3, 15)
        time.sleep(0.5)
    finally:
        relay.terminate()
        _, err = relay.communicate(timeout=10)
        mon.close()
    assert err.count("closed the relay's connection during its CURVE handshake") == 1, err
    assert f"the monitor at {listen}" in err and "CURVE server.key is not the one" in err


def test_bad_relay_input_is_refused_clearly(short_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    up = "tcp://127.0.0.1:5999"
    cases = [
        (["relay", "--listen", "tcp://0.0.0.0:6001", "--connect", up], "a relay serves the ranks of its own node"),
        (["relay", "--listen", "ipc://relative.sock", "--connect", up], "expected ipc:///ABSOLUTE/PATH"),
        (["relay", "--listen", f"ipc://{short_dir}/x.sock", "--connect", "login:5759"], "expected tcp://HOST:PORT"),
        (["relay", "--listen", f"ipc://{short_dir}/x.sock", "--connect", up, "--curve-dir", str(short_dir / "none")],
         "no key directory"),
        (["relay", "--listen", up, "--connect", up], "the relay would send to itself"),
    ]  # fmt: skip
    for argv, message in cases:
        assert cli_main(argv) == 2
        assert message in capsys.readouterr().err
    lock = PathLock(f"{short_dir}/held.sock")
    assert lock.acquire(blocking=False)  # as a running relay holds it
    try:
        assert cli_main(["relay", "--listen", f"ipc://{short_dir}/held.sock", "--connect", up]) == 2
        assert "another relay serves" in capsys.readouterr().err
    finally:
        lock.release()


TRAIN = textwrap.dedent(
    """
    import os, sys, time, torch
    steps, extra_s = int(sys.argv[1]), float(sys.argv[2])
    after = sys.argv[3] if len(sys.argv) > 3 else None  # step on until this file exists, then `steps` more
    torch.manual_seed(0)
    torch.set_num_threads(1)
    emb, lin = torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512)
    opt = torch.optim.SGD(list(emb.parameters()) + list(lin.parameters()), lr=0.01)
    x = torch.randint(0, 512, (16, 32))

    def step():
        for _ in range(3):
            lin(emb(x)).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(extra_s)

    done = 0
    while after and not os.path.exists(after):
        step()
        done += 1
    print(f"steps {done + steps}", flush=True)
    for _ in range(steps):
        step()
    """
)


def _run(listen: str, relay: str, script: Path, steps: int, extra_s: float, *after: str,
         **env: str) -> subprocess.Popen[str]:
    e = dict(os.environ, FLOWTOP_KERNELS="0", FLOWTOP_TELEMETRY="0", **env)
    cmd = [sys.executable, "-m", "flowtop.cli", "run", "--connect", listen, "--relay", relay, "--",
           sys.executable, str(script), str(steps), str(extra_s), *after]  # fmt: skip
    return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Wait for each; their stdout."""
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_step_times_are_the_same_through_a_relay(short_dir: Path) -> None:
    """The same short CPU training, at once, directly and through flowtop run's relay."""
    mon = MonitorThread()
    script = short_dir / "train.py"
    script.write_text(TRAIN)
    try:
        steps = 30
        direct = _run(mon.listen, "off", script, steps, 0.0, FLOWTOP_JOB="direct", XDG_RUNTIME_DIR=str(short_dir))
        relayed = _run(mon.listen, "on", script, steps, 0.0, FLOWTOP_JOB="relayed", XDG_RUNTIME_DIR=str(short_dir))
        _finish([direct, relayed])
        # the relay's closing report may arrive a tick after its ranks' byes (a loaded machine)
        snap = mon.wait_for(lambda s: sum(r.status == "done" for j in s.jobs for r in j.ranks) == 2
                            and bool(s.relays) and all(x.status == "closed" for x in s.relays), 15)
        jobs = {j.job: j.ranks[0] for j in snap.jobs}
        d, r = jobs["direct"], jobs["relayed"]
        assert (d.step, r.step) == (steps, steps) and d.tokens_per_step == r.tokens_per_step == 16 * 32 * 3
        assert d.relay is None and r.relay == snap.relays[0].relay and snap.relays[0].status == "closed"
        assert snap.relays[0].drops == 0 and snap.relays[0].frames_in == snap.relays[0].frames_out
        assert d.dropped_messages == r.dropped_messages == d.lost_messages == r.lost_messages == 0
        med_d = statistics.median(d.history.step_time_s[1:])
        med_r = statistics.median(r.history.step_time_s[1:])
        print(f"median step time: direct {med_d * 1e3:.2f} ms, through the relay {med_r * 1e3:.2f} ms "
              f"(ratio {med_r / med_d:.3f}); relay frames {snap.relays[0].frames_in}, "
              f"batches {snap.relays[0].batches}")
        assert_valid_snapshot(to_json(snap))
    finally:
        mon.close()


def _upstream_connections(port: int) -> int:
    """Established TCP connections into the collector's port (it runs in this process)."""
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_two_flowtop_runs_of_a_node_share_one_upstream_connection(short_dir: Path) -> None:
    """srun of the script itself: one flowtop run per rank. The first hosts the node's relay, the
    second joins it; when the first ends, the second takes the relay over and its rank goes on."""
    mon = MonitorThread()
    port = int(mon.listen.rsplit(":", 1)[1])
    script = short_dir / "train.py"
    script.write_text(TRAIN)
    counts: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            counts.append(_upstream_connections(port))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    env = {"FLOWTOP_JOB": "srun", "WORLD_SIZE": "2", "XDG_RUNTIME_DIR": str(short_dir)}
    try:
        first = _run(mon.listen, "on", script, 5, 0.1, RANK="0", LOCAL_RANK="0", **env)
        mon.wait_for(lambda s: bool(s.relays), 15)  # it hosts: its relay reports before its rank says hello
        ended = short_dir / "first-ended"
        second = _run(mon.listen, "on", script, 10, 0.1, str(ended), RANK="1", LOCAL_RANK="1", **env)
        _finish([first])
        ended.touch()  # rank 1 makes 10 more steps once the relay's first host is gone
        steps_1 = int(_finish([second])[0].split()[-1])
        snap = mon.wait_for(lambda s: sum(r.status == "done" for j in s.jobs for r in j.ranks) == 2
                            and len(s.relays) == 2 and all(x.status == "closed" for x in s.relays), 15)
    finally:
        stop.set()
        watcher.join(2)
        mon.close()
    r = _ranks(snap)
    hosts = [x for x in snap.relays]
    print(f"upstream connections seen: max {max(counts)}, samples {len(counts)}; relays: "
          + ", ".join(f"{x.relay} {x.status} frames {x.frames_in}/{x.frames_out} drops {x.drops}" for x in hosts)
          + f"; rank 1 lost {r[1].lost_messages}, dropped {r[1].dropped_messages}")
    assert max(counts) == 1 and counts.count(1) > len(counts) // 2
    assert (r[0].step, r[1].step) == (5, steps_1) and r[0].status == r[1].status == "done"
    assert len(hosts) == 2 and all(x.status == "closed" and x.hosted_by == "flowtop run" for x in hosts)
    first_relay = next(x for x in hosts if x.relay.split(":")[1] == str(first.pid))
    assert r[0].relay == first_relay.relay != r[1].relay  # rank 1 ended through the relay it took over
    assert_valid_snapshot(to_json(snap))
    assert list((short_dir / f"flowtop-{os.getuid()}").iterdir()) == []  # no socket or lock file left on the node


def test_a_lock_holder_that_dies_hands_the_path_over(short_dir: Path) -> None:
    """The relay's path lock is the kernel's: a holder killed with SIGKILL releases it."""
    path = f"{short_dir}/dies.sock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from flowtop.tools.relay import PathLock
        assert PathLock({path!r}).acquire(blocking=False)
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lock = PathLock(path)
        assert not lock.acquire(blocking=False)
        holder.send_signal(signal.SIGKILL)
        holder.wait(5)
        assert lock.acquire(blocking=False)
        lock.release()
    finally:
        holder.kill()
        holder.wait(5)


def test_a_lock_waiter_holds_the_file_at_the_path_after_a_release(short_dir: Path) -> None:
    """A clean release removes the lock file; whoever waited on the removed file takes the lock
    on the file now at the path, so a third relay still finds it held (one relay per path)."""
    first, second, third = (PathLock(f"{short_dir}/w.sock") for _ in range(3))
    assert first.acquire(blocking=False)
    took = threading.Event()
    waiter = threading.Thread(target=lambda: second.acquire(blocking=True) and took.set(), daemon=True)
    waiter.start()
    time.sleep(0.2)  # the waiter blocks in flock on the first holder's file
    assert not took.is_set()
    first.release()
    assert took.wait(5)
    assert os.path.exists(first.path)
    assert not third.acquire(blocking=False)
    second.release()
    assert not os.path.exists(first.path)
    assert third.acquire(blocking=False)
    third.release()


def _lines(proc: subprocess.Popen[str]) -> Callable[[], str]:
    """A reader of ``proc``'s stderr lines: each call gives the next one, or "" when none comes
    within 15 s (a thread reads them: select() on the pipe missed a second line that the first
    readline had already buffered)."""
    import queue

    got: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    stream = proc.stderr
    threading.Thread(target=lambda: [got.put(line) for line in stream], daemon=True).start()

    def next_line() -> str:
        try:
            return got.get(timeout=15)
        except queue.Empty:
            return ""

    return next_line


def test_a_relay_stopped_by_a_signal_leaves_no_file(short_dir: Path) -> None:
    """``flowtop relay`` on the node's address: its socket and lock files go when it ends."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(short_dir)}
    upstream = f"tcp://127.0.0.1:{free_port_pair()}"
    relay = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "relay", "--connect", upstream],
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = _lines(relay)
        banner = line()
        assert "ranks connect to ipc://" in banner and "(flowtop run --connect ipc://" in banner, banner
        # ... and, as flowtop run says it, that nothing listens upstream yet (it said nothing).
        note = line()
        assert note.startswith(f"flowtop relay: no monitor listens on {upstream} yet"), note
        node = short_dir / f"flowtop-{os.getuid()}"
        deadline = time.monotonic() + 10
        while len(list(node.iterdir())) < 2 and time.monotonic() < deadline:  # it binds after its banner
            time.sleep(0.05)
        assert sorted(p.suffix for p in node.iterdir()) == [".lock", ".sock"]
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(10) == 0
        assert list(node.iterdir()) == []
    finally:
        relay.kill()
        relay.wait(5)


def test_a_relay_on_a_busy_address_says_only_that() -> None:
    """A busy address printed "ranks connect to ..." first, then that it could not bind it."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "flowtop.cli", "relay", "--listen", f"tcp://127.0.0.1:{port}",
                              "--connect", f"tcp://127.0.0.1:{free_port_pair()}"], capture_output=True, text=True,
                             timeout=30)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [l for l in out.stderr.splitlines() if "cannot bind" in l] != [], out.stderr
    # the address once: pyzmq's text repeats it ("... (addr='tcp://...')"; a new user's trial)
    assert out.stderr.count(f"127.0.0.1:{port}") == 1 and "Address already in use" in out.stderr, out.stderr


def test_relay_report_is_a_wire_message() -> None:
    frame = wire.encode("relay", RankKey("", "n", 1, 0, 0), 0, time.time(), {
        "relay": "n:1:0", "listen": "ipc:///x", "upstream": "tcp://m:1", "ranks": 1, "frames_in": 1,
        "frames_out": 1, "bytes_in": 1, "bytes_out": 1, "drops": 0, "queued": 0, "commands": 0,
        "link_ups": 1, "uptime_s": 1.0})  # fmt: skip
    assert wire.decode(frame).kind == "relay"
    assert msgpack.unpackb(encode_stamp("n:1:0", 1.0, [5]))["a"] == [5]


def test_a_stamp_far_ahead_of_its_relays_clock_is_refused() -> None:
    """One forged batch with the clock of a live relay's id at 1e15 s set its offset 1e15 s
    back for good (the least-delayed path): the relay read silent, 1e15 s behind, and a hung
    rank behind it was blamed on it (a hostile-input trial). Such a stamp is refused now; the
    relay's next batches map as before."""
    from flowtop.monitor.relays import MAX_CLOCK_LEAD_S, Relays

    relays = Relays()
    assert relays.unstamp([encode_stamp("n:1:0", 100.0, [0]), b""], 1000.0) == ("n:1:0", [1000.0])
    with pytest.raises(WireError, match="ahead of its relay's earlier batches"):
        relays.unstamp([encode_stamp("n:1:0", 1e15, [0]), b""], 1001.0)
    relay, (t,) = relays.unstamp([encode_stamp("n:1:0", 105.0, [0]), b""], 1005.2)
    assert t == pytest.approx(1005.0, abs=1e-2) and relays.lag_of("n:1:0") == pytest.approx(0.2, abs=1e-2)
    # a path that got faster within the bound (a backlog drained) moves the mapping
    relays.unstamp([encode_stamp("n:1:0", 110.0 + MAX_CLOCK_LEAD_S - 1, [0]), b""], 1010.0)
    assert relays.lag_of("n:1:0") == 0.0


def test_a_relay_is_taken_again_after_the_monitor_paused() -> None:
    """The monitor's clock leaves out its own pauses (SIGSTOP, a suspended laptop), its relays'
    clocks do not: after a 300 s pause every batch read 300 s ahead and was refused for good —
    the relay silent, its ranks stale (a review). Batches that agree on the new mapping are
    taken from the CLOCK_JUMP_BATCHES-th on; a lone forged stamp among them still is not."""
    from flowtop.monitor.clock import MonitorClock
    from flowtop.monitor.relays import CLOCK_JUMP_BATCHES, Relays

    raw, rel = [1000.0], [50.0]
    clock = MonitorClock(raw=lambda: raw[0])
    relays = Relays()

    def batch(clock_at: float | None = None) -> bool:
        try:
            relays.unstamp([encode_stamp("n:1:0", rel[0] if clock_at is None else clock_at, [0]), b""],
                           clock.now() + 0.01)
            return True
        except WireError:
            return False
        finally:
            raw[0] += 1
            rel[0] += 1

    assert all(batch() for _ in range(5))
    raw[0] += 300
    rel[0] += 300  # the monitor paused: its clock does not count the 300 s, the relay's does
    got = [batch() for _ in range(6)]
    assert got == [False] * (CLOCK_JUMP_BATCHES - 1) + [True] * (7 - CLOCK_JUMP_BATCHES)
    assert relays.lag_of("n:1:0") < 0.1
    assert not batch(1e15) and batch()  # a forged one between: refused, the relay's next taken


def test_readme_lists_the_relay_fields_of_the_schema() -> None:
    import re

    from flowtop.monitor.snapshot_json import RELAY_FIELDS
    from flowtop.monitor.snapshot_json import json_schema

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    text = readme[readme.index("Relays (`relays[]`"):]
    text = text[:text.index("\n\n")]
    named = re.findall(r"`(\w+)`", text)
    assert [n for n in named if n in RELAY_FIELDS] == list(RELAY_FIELDS)
    assert list(json_schema()["$defs"]["relay"]["properties"]) == list(RELAY_FIELDS)


def test_a_recording_of_relayed_frames_replays(tmp_path: Path) -> None:
    """Relayed frames are recorded at their arrival (live order, never before the recording's
    start), and the relay's reports replay as its record."""
    from flowtop.monitor.recording import Recorder, replay_all

    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    rec = Recorder(tmp_path / "relayed.rec")
    mon = MonitorThread(listen=listen, collector=Collector(make_model(), listen, recorder=rec))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(listen)
    key = RankKey("recorded", "node-r", 7, 0, 0)
    relay = "node-r:3:0000000a"
    report = wire.encode("relay", RankKey("", "node-r", 3, 0, 0), 0, time.time(), {
        "relay": relay, "listen": "ipc:///tmp/x.sock", "upstream": listen, "ranks": 1, "frames_in": 4,
        "frames_out": 4, "bytes_in": 400, "bytes_out": 400, "drops": 0, "queued": 0, "commands": 0,
        "link_ups": 1, "uptime_s": 3.0, "hosted_by": "flowtop relay"})  # fmt: skip
    try:
        assert sock.recv() == b"\x01"
        frames = [wire.encode("hello", key, 0, time.time(), dict(HELLO, world_size=1))]
        frames += [wire.encode("step", key, n, time.time(), {"step": n, "wall_s": 0.1, "tokens": 8, "drops": 0})
                   for n in (1, 2, 3)]  # fmt: skip
        # Held up to 2.5 s in the relay: before the recording's first frame arrived.
        _batch(sock, relay, time.monotonic(), [*frames, report], [2_500_000, 2_400_000, 2_300_000, 2_200_000, 0])
        mon.wait_for(lambda s: any(r.step == 3 for r in _ranks(s).values()), 5)
    finally:
        sock.close(0)
        ctx.term()
        mon.close()
    snap = replay_all(tmp_path / "relayed.rec", make_model())
    assert snap.rejected == 0 and _ranks(snap)[0].step == 3
    assert [(r.relay, r.ranks_connected, r.hosted_by) for r in snap.relays] == [(relay, 1, "flowtop relay")]


def test_a_monitor_restart_behind_a_relay_looks_like_one_to_the_ranks(short_dir: Path) -> None:
    """The relay mirrors the monitor's presence: while it is away the ranks hold and drop (counted),
    and a new monitor on the same port gets their hello at once, through the relay's new link."""
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    addr = f"ipc://{short_dir}/m.sock"
    mon = MonitorThread(listen=listen)
    relay = _relay(addr, listen)
    ranks = _Ranks("restart", {0: addr})
    try:
        mon.wait_for(lambda s: any(r.step > 3 for r in _ranks(s).values()), 15)
        mon.close()
        pub = ranks.pubs[0]
        deadline = time.monotonic() + 10
        while pub.subscribers and time.monotonic() < deadline:  # the relay unsubscribed its ranks
            time.sleep(0.05)
        assert pub.subscribers == 0
        time.sleep(2.5)  # longer than the probe holds frames
        mon = MonitorThread(listen=listen)
        back = time.monotonic()
        snap = mon.wait_for(lambda s: any(r.device == "cpu (test)" and r.status == "live" for r in _ranks(s).values())
                            and any(x.link_ups == 2 for x in s.relays), 15)
        print(f"rank and relay back {time.monotonic() - back:.2f} s after the monitor restarted; "
              f"probe drops meanwhile {pub.drops}")
        assert _ranks(snap)[0].status == "live" and snap.relays[0].link_ups == 2 and pub.drops > 0
    finally:
        ranks.close()
        relay.terminate()
        relay.wait(10)
        mon.close()


def test_two_simulated_nodes_on_one_machine_are_two_nodes(short_dir: Path) -> None:
    """README "Several nodes on one machine": a node each, by its own XDG_RUNTIME_DIR (its relay
    socket) and FLOWTOP_HOST (the host its ranks and its relay report; socket.gethostname() is
    the same machine's for both). Two hosts in the snapshot, each rank behind its own node's relay."""
    mon = MonitorThread()
    script = short_dir / "train.py"
    script.write_text(TRAIN)
    try:
        procs = []
        for rank, node in enumerate(("node-a", "node-b")):
            runtime = short_dir / node
            runtime.mkdir(mode=0o700)
            procs.append(_run(mon.listen, "on", script, 5, 0.0, FLOWTOP_JOB="sim", RANK=str(rank), WORLD_SIZE="2",
                              XDG_RUNTIME_DIR=str(runtime), FLOWTOP_HOST=node))
        _finish(procs)
        snap = mon.wait_for(lambda s: sum(r.status == "done" for j in s.jobs for r in j.ranks) == 2
                            and len(s.relays) == 2 and all(x.status == "closed" for x in s.relays), 30)
        (job,) = snap.jobs
        hosts = {r.rank: r.host for r in job.ranks}
        assert hosts == {0: "node-a", 1: "node-b"}
        relay_hosts = {x.relay: x.host for x in snap.relays}
        assert sorted(relay_hosts.values()) == ["node-a", "node-b"]
        assert {r.rank: relay_hosts[r.relay] for r in job.ranks if r.relay is not None} == hosts
    finally:
        mon.close()
