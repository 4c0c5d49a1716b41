"""Monitor/CLI fixes from the code review: stalled ranks, FLOP/s per token, CLI error paths,
collector robustness, job eviction, `flowtop run` signals and PYTHONPATH, IPv6 addresses."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from flowtop.monitor import accounting
from flowtop.monitor.collector import AddressError, Collector, check_listen, parse_tcp
from flowtop.tools.demo.launch import DemoSource, _headless, free_port_pair
from flowtop.monitor.model import EVICT_AFTER_S, Model
from flowtop.monitor.recording import Recorder
from flowtop.tools.runner import BOOTSTRAP_DIR, probe_env
from flowtop.monitor.snapshot_json import to_json
from flowtop.monitor.wiring import make_model
from probe import wire
from snapshot_schema import assert_valid_snapshot

ROOT = Path(__file__).resolve().parent.parent
PEAK = 1e12  # FLOP/s


def _key(rank: int = 0, job: str = "j", inc: int = 0) -> wire.RankKey:
    return wire.RankKey(job, "h", 100 + rank, rank, inc)


class Feeder:
    """Sends validated messages into a model with per-rank sequence numbers."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.seq: dict[wire.RankKey, int] = {}

    def send(self, key: wire.RankKey, kind: str, now: float, **fields: Any) -> None:
        seq = self.seq.get(key, 0)
        self.seq[key] = seq + 1
        self.model.ingest(wire.decode(wire.encode(kind, key, seq, 1.0, fields)), now)

    def hello(self, key: wire.RankKey, now: float = 0.0, world: int = 1) -> None:
        self.send(key, "hello", now, local_rank=0, world_size=world, device="cpu (test)", probe_version="t")

    def flops(self, key: wire.RankKey, now: float, tokens: int = 100) -> None:
        self.send(key, "flops", now, step=2, model_flops=1e9, executed_flops=1.2e9, attention="full",
                  dtype="fp32", peak_flops=PEAK, peak_source="test", uncounted={}, tokens=tokens)

    def steps(self, key: wire.RankKey, first: int, last: int, t0: float, wall: float = 0.1,
              tokens: int = 100) -> float:
        """Steps ``first..last``, one every ``wall`` seconds from ``t0``; returns the last time."""
        t = t0
        for i, step in enumerate(range(first, last + 1)):
            t = t0 + i * wall
            self.send(key, "step", t, step=step, wall_s=wall, tokens=tokens, drops=0)
        return t

    def heartbeat(self, key: wire.RankKey, now: float) -> None:
        self.send(key, "telemetry", now, gpu={"gpu_util": 100}, proc={})


def _rank(snap: Any, job: str = "j", rank: int = 0) -> Any:
    (j,) = [x for x in snap.jobs if x.job == job]
    return next(r for r in j.ranks if r.rank == rank)


# --- 1. a hung rank stops showing throughput ---------------------------------------------


def test_stalled_rank_has_zero_throughput_and_mfu() -> None:
    model = Model()
    f = Feeder(model)
    k = _key()
    f.hello(k)
    f.flops(k, 0.0)
    last = f.steps(k, 1, 10, 0.1)  # last step received at t = 1.0
    live = _rank(model.snapshot(last + 4.9))  # 4.9 s without a step: under the 5 s floor
    assert live.status == "live"
    assert live.tokens_per_s == pytest.approx(1000.0)
    assert live.flops.flops_per_s == pytest.approx(1e10) and live.flops.mfu == pytest.approx(0.01)
    # Heartbeats go on (the sender thread), steps do not: a hang in a collective.
    for t in (3.0, 5.0, 7.0):
        f.heartbeat(k, t)
    snap = model.snapshot(7.0)
    r = _rank(snap)
    assert r.status == "stalled" and r.age_s(snap.taken_at) == 0.0
    assert r.tokens_per_s == 0.0
    assert (r.flops.flops_per_s, r.flops.executed_flops_per_s, r.flops.mfu, r.flops.hfu) == (0.0, 0.0, 0.0, 0.0)
    assert r.flops.reason_at(snap.taken_at) == "no step for 6 s" and r.flops.mfu_reason == ""
    assert r.flops.model_flops_per_step == 1e9  # the counted step's figure is kept
    assert r.history.mfu[-1] == 0.0  # the MFU sparkline drops with it
    job = snap.jobs[0]
    assert (job.status, job.tokens_per_s, job.flops.flops_per_s, job.flops.mfu) == ("stalled", 0.0, 0.0, 0.0)
    assert job.flops.reason_at(snap.taken_at) == "no step for 6 s"
    data = to_json(snap)
    assert_valid_snapshot(data)
    assert data["jobs"][0]["status"] == "stalled" and data["jobs"][0]["ranks"][0]["status"] == "stalled"
    assert data["jobs"][0]["ranks"][0]["mfu"] == 0.0 and data["jobs"][0]["tokens_per_s"] == 0.0
    # A step again: live, and the throughput of the recent steps is back.
    f.steps(k, 11, 11, 7.1)
    r = _rank(model.snapshot(7.2))
    assert r.status == "live" and r.tokens_per_s == pytest.approx(1000.0)


def test_stall_limit_is_five_median_steps_when_longer_than_five_seconds() -> None:
    model = Model()
    f = Feeder(model)
    k = _key()
    f.hello(k)
    last = f.steps(k, 1, 5, 2.0, wall=2.0)  # median step 2 s: limit 10 s
    f.heartbeat(k, last + 9.5)
    assert _rank(model.snapshot(last + 9.5)).status == "live"
    f.heartbeat(k, last + 10.5)
    assert _rank(model.snapshot(last + 10.5)).status == "stalled"


def test_silent_rank_is_stale_with_zero_throughput_and_done_rank_keeps_its_figures() -> None:
    model = Model()
    f = Feeder(model)
    a, b = _key(0), _key(1)
    for k in (a, b):
        f.hello(k, world=2)
        f.flops(k, 0.0)
        f.steps(k, 1, 10, 0.1)
    f.send(b, "bye", 1.1, reason="exit", steps=10, drops=0)
    snap = model.snapshot(8.0)
    ra, rb = _rank(snap, rank=0), _rank(snap, rank=1)
    assert ra.status == "stale" and ra.tokens_per_s == 0.0 and ra.flops.mfu == 0.0
    assert rb.status == "done" and rb.tokens_per_s == pytest.approx(1000.0)
    assert snap.jobs[0].status == "stale"


def test_a_ranks_telemetry_is_the_record_received_and_its_series_take_numbers_only() -> None:
    """A telemetry frame is kept as the view every snapshot shows (as received, its arrival the
    monitor's time) until the next; a sample that is not a number (a bool, a list, absent) adds
    nothing to its sparkline."""
    model = Model()
    f = Feeder(model)
    key = _key(0)
    f.hello(key)
    f.steps(key, 1, 5, 0.1)
    f.send(key, "telemetry", 1.0, gpu={"power_w": 500.0, "sm_clock_mhz": True, "tensor_active": ["x"]},
           proc={"rss_bytes": 7}, reasons={"tensor_active": "GPM unsupported"})
    first, again = _rank(model.snapshot(1.2)).telemetry, _rank(model.snapshot(1.4)).telemetry
    assert again is first and first.received_at == 1.0
    assert (dict(first.device), dict(first.host), dict(first.reasons)) == (
        {"power_w": 500.0, "sm_clock_mhz": True, "tensor_active": ["x"]}, {"rss_bytes": 7},
        {"tensor_active": "GPM unsupported"})
    f.send(key, "telemetry", 2.0, gpu={"power_w": 450}, proc={})
    later = _rank(model.snapshot(2.2))
    assert later.telemetry.received_at == 2.0 and dict(later.telemetry.reasons) == {}
    assert list(later.history.power_w) == [500.0, 450.0]
    assert list(later.history.sm_clock_mhz) == [] and list(later.history.tensor_active) == []


def test_a_ranks_hello_is_kept_as_the_record_its_views_read() -> None:
    """The hello's fields the views show (local rank, device with its control characters escaped,
    coordinates, stages, the world size) come from one record; a re-sent equal hello keeps it, so
    the views' coordinates stay the same object; a changed one replaces it."""
    model = Model()
    f = Feeder(model)
    key = _key(1)
    hello = dict(local_rank=1, world_size=4, device="GPU\x1b[31m", probe_version="t",
                 coords={"dp": [0, 2], "pp": [1, 2]}, coords_source="mesh", pp_stages=[1], argv=["x"])
    f.send(key, "hello", 0.0, **hello)
    kept = model.ranks[key].hello
    f.send(key, "hello", 2.0, **hello)
    assert model.ranks[key].hello is kept
    r = _rank(model.snapshot(2.5), rank=1)
    assert (r.local_rank, r.device, r.coords_source, r.pp_stages) == (1, "GPU\\x1b[31m", "mesh", (1,))
    assert r.coords is kept.coords and dict(r.coords) == {"dp": (0, 2), "pp": (1, 2)}
    assert model.snapshot(2.5).jobs[0].world_size == 4
    f.send(key, "hello", 4.0, **dict(hello, device="H200"))
    assert _rank(model.snapshot(4.5), rank=1).device == "H200"


def test_a_resent_hello_makes_no_record_unless_its_fields_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hello (1.6 k/s at 16 k ranks) carries a new step and step age: the record (printable
    text, coordinates, interning) is made again only when the fields it is made of differ from
    those of the kept one, not at each hello; the step fields still reach the rank."""
    from flowtop.monitor import rankstate as rs

    made: list[int] = []
    real = rs.hello_of
    monkeypatch.setattr(rs, "hello_of", lambda fields: made.append(1) or real(fields))
    model = Model()
    f = Feeder(model)
    key = _key(1)
    hello = dict(local_rank=1, world_size=4, device="H100", probe_version="t",
                 coords={"dp": [0, 2], "pp": [1, 2]}, coords_source="mesh", pp_stages=[1], argv=["x"])
    f.send(key, "hello", 0.0, **hello, last_step=5, step_age_s=0.5)
    kept = model.ranks[key].hello
    f.send(key, "hello", 2.0, **dict(hello, argv=["y"]), last_step=9, step_age_s=0.25)  # argv: not shown
    f.send(key, "hello", 4.0, **dict(hello, coords={"pp": [1, 2], "dp": [0, 2]}), last_step=12, step_age_s=0.0)
    assert len(made) == 1 and model.ranks[key].hello is kept
    assert model.ranks[key].hello_step == 12 and model.ranks[key].hello_step_at == pytest.approx(4.0)
    f.send(key, "hello", 6.0, **dict(hello, pp_stages=[1, 3]), last_step=13, step_age_s=0.0)
    assert len(made) == 2 and model.ranks[key].hello.pp_stages == (1, 3)


def test_stalled_rank_still_gets_the_hang_hint() -> None:
    model = make_model(hint_overrides={"hang": {"floor_s": 5.0}})
    f = Feeder(model)
    ranks = [_key(0), _key(1)]
    for k in ranks:
        f.hello(k, world=2)
        f.flops(k, 0.0)
        f.steps(k, 1, 20, 0.1)  # last step at t = 2.0
    for t in range(3, 10):
        for k in ranks:
            f.heartbeat(k, float(t))
    snap = model.tick(9.0)  # hints advance in ticks (flowtop.monitor.ticker), not in snapshots
    assert [r.status for r in snap.jobs[0].ranks] == ["stalled", "stalled"]
    hang = [h for h in snap.jobs[0].hints if h.id == "hang_all"]
    assert len(hang) == 1 and hang[0].evidence_at(snap.taken_at)["stalled_s"] == pytest.approx(7.0)
    assert hang[0].evidence["silent_ranks"] == []  # both still talk: none is "stale"


# --- 2. FLOP/s from FLOPs per token × tokens/s --------------------------------------------


def test_flops_per_s_scales_with_the_tokens_of_the_steps() -> None:
    msg = {"step": 2, "model_flops": 1e9, "executed_flops": 1.5e9, "peak_flops": PEAK, "tokens": 100}
    # Steps twice the counted shape: 2000 tokens/s at 0.1 s per step.
    v = accounting.rank_flops(wire.flops_report(msg), 0.1, None, tokens_per_s=2000.0)
    assert v.flops_per_s == pytest.approx(2e10) and v.executed_flops_per_s == pytest.approx(3e10)
    assert v.mfu == pytest.approx(0.02) and v.hfu == pytest.approx(0.03)
    assert v.model_flops_per_step == 1e9 and v.flops_per_token == pytest.approx(1e7)
    # Without tokens (in the count, or a tokens/s): per-step FLOPs ÷ median step time.
    assert accounting.rank_flops(wire.flops_report(msg), 0.1, None).flops_per_s == pytest.approx(1e10)
    no_tokens = wire.flops_report({**msg, "tokens": 0})
    assert accounting.rank_flops(no_tokens, 0.1, None, 2000.0).flops_per_s == pytest.approx(1e10)


def test_model_uses_tokens_of_recent_steps_for_flops_per_s() -> None:
    model = Model()
    f = Feeder(model)
    k = _key()
    f.hello(k)
    f.flops(k, 0.0, tokens=100)  # counted on a short step
    last = f.steps(k, 1, 10, 0.1, wall=0.1, tokens=300)  # then the steps grew 3x
    r = _rank(model.snapshot(last))
    assert r.tokens_per_s == pytest.approx(3000.0)
    assert r.flops.flops_per_s == pytest.approx(1e9 / 100 * 3000.0)
    assert r.flops.model_flops_per_step == 1e9


# --- 3. CLI error paths --------------------------------------------------------------------


def _flowtop(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowtop.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_parse_tcp_rejects_bad_ports_with_address_error() -> None:
    for bad in ("tcp://127.0.0.1:99999", "tcp://127.0.0.1:abc", "tcp://127.0.0.1:0", "tcp://127.0.0.1", "garbage"):
        with pytest.raises(AddressError, match="expected tcp://HOST:PORT"):
            check_listen(bad, allow_remote=False)
    check_listen("tcp://127.0.0.1:65535", allow_remote=False)  # no second port is needed any more
    assert parse_tcp("tcp://[::1]:5759") == ("::1", 5759)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["snapshot", "--listen", "tcp://127.0.0.1:99999", "--timeout", "0.2"], "expected tcp://HOST:PORT"),
        (["top", "--listen", "tcp://127.0.0.1:abc"], "expected tcp://HOST:PORT"),
        (["demo", "--headless", "--listen", "garbage"], "expected tcp://HOST:PORT"),
        (["demo", "--headless", "--listen", "tcp://0.0.0.0:5000"], "loopback"),
        (["demo", "--listen", "tcp://127.0.0.1:99999"], "expected tcp://HOST:PORT"),
    ],
)
def test_bad_listen_addresses_exit_2_without_a_traceback(args: list[str], message: str) -> None:
    out = _flowtop(*args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_demo_on_a_busy_port_exits_2() -> None:
    port = free_port_pair()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        out = _flowtop("demo", "--headless", "--steps", "1", "--listen", f"tcp://127.0.0.1:{port}")
    assert out.returncode == 2, out.stderr
    assert "cannot bind" in out.stderr and "Traceback" not in out.stderr


def test_bad_address_does_not_truncate_the_recording(tmp_path: Path) -> None:
    rec = tmp_path / "keep.rec"
    rec.write_bytes(b"precious")
    out = _flowtop("snapshot", "--listen", "tcp://0.0.0.0:5999", "--record", str(rec), "--timeout", "0.2")
    assert out.returncode == 2 and "--insecure-bind" in out.stderr
    assert rec.read_bytes() == b"precious"


def test_top_exits_2_when_the_port_is_taken(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from flowtop import cli
    from flowtop.tui.app import FlowtopApp

    async def quit_soon(pilot: Any) -> None:
        await pilot.pause()
        assert "cannot bind" in pilot.app.source.start_error  # shown in the UI meanwhile
        await pilot.press("q")

    original = FlowtopApp.run
    monkeypatch.setattr(FlowtopApp, "run", lambda self: original(self, headless=True, auto_pilot=quit_soon))
    port = free_port_pair()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        code = cli.main(["top", "--listen", f"tcp://127.0.0.1:{port}"])
    assert code == 2
    assert "cannot bind" in capsys.readouterr().err


def test_headless_demo_does_not_wait_its_deadline_when_training_fails(tmp_path: Path) -> None:
    collector = Collector(Model(), f"tcp://127.0.0.1:{free_port_pair()}")
    source = DemoSource(collector, [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ),
                        str(tmp_path / "log"))
    # The deadline is 600 s; the wait after the training exited is a few seconds at most.
    snap, code = asyncio.run(asyncio.wait_for(_headless(source, timeout_s=600.0), 45))
    assert code == 3 and snap.jobs == ()


# --- 4. collector robustness ---------------------------------------------------------------


def _step_frame(seq: int) -> bytes:
    return wire.encode("step", _key(), seq, 1.0, {"step": seq + 1, "wall_s": 0.1, "tokens": 10, "drops": 0})


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_recording_to_a_full_disk_stops_recording_and_keeps_receiving(capsys: pytest.CaptureFixture[str]) -> None:
    """One notice for the user (the TUI shows it; stderr belongs to the TUI), monitoring goes on."""
    collector = Collector(Model(), f"tcp://127.0.0.1:{free_port_pair()}", recorder=Recorder("/dev/full"))
    for seq in range(400):  # > the file buffer: the write fails with ENOSPC on a flush
        collector.handle_frame(_step_frame(seq), 1.0 + seq * 0.01)
    assert collector.recorder is None
    assert collector.model.received == 400 and _rank(collector.model.snapshot(5.0)).step == 400
    notices = collector.notices.take()
    assert [n.severity for n in notices] == ["error"]
    assert "recording to /dev/full stopped" in notices[0].text and "No space left" in notices[0].text
    assert capsys.readouterr().err == ""


def test_a_failing_hint_engine_costs_only_the_hints(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def evaluate(self, job: Any, now: float, phase: Any = None) -> Any:
            raise RuntimeError("bug")

    model = Model(hint_engine=Broken())
    f = Feeder(model)
    f.hello(_key())
    f.steps(_key(), 1, 5, 0.1)
    with caplog.at_level(logging.ERROR, logger="flowtop.model"):
        first, second = model.tick(1.0), model.tick(1.5)
    assert first.jobs[0].hints == () and second.jobs[0].step == 5
    assert sum("hint engine failed" in r.getMessage() for r in caplog.records) == 1
    (notice,) = model.notices.take()  # once, for the user: the TUI shows it
    assert notice.severity == "error" and "RuntimeError: bug" in notice.text


def test_finished_and_silent_jobs_are_evicted_after_ten_minutes() -> None:
    forgotten: list[str] = []

    class Engine:  # records what the model tells the hint engine to forget
        def evaluate(self, job, now, phase=None):  # type: ignore[no-untyped-def]
            return ()

        def forget(self, job: str) -> None:
            forgotten.append(job)

    model = Model(hint_engine=Engine())
    f = Feeder(model)
    done, silent, alive = _key(job="done"), _key(job="silent"), _key(job="alive")
    old, new = _key(job="alive", rank=1, inc=0), _key(job="alive", rank=1, inc=1)
    for k in (done, silent, alive, old):
        f.hello(k, world=2)
        f.steps(k, 1, 3, 0.1)
    f.send(done, "bye", 1.0, reason="exit", steps=3, drops=0)
    f.hello(new, 2.0, world=2)
    f.steps(alive, 4, 4, EVICT_AFTER_S - 10)
    f.steps(new, 1, 1, EVICT_AFTER_S - 10)
    assert [j.job for j in model.snapshot(EVICT_AFTER_S).jobs] == ["alive", "done", "silent"]
    f.steps(alive, 5, 5, EVICT_AFTER_S + 5)
    # A snapshot only reads: eviction is a tick's.
    assert len(model.snapshot(EVICT_AFTER_S + 5).jobs) == 3 and model.evicted_jobs == 0
    snap = model.tick(EVICT_AFTER_S + 5)
    assert [j.job for j in snap.jobs] == ["alive"] and model.evicted_jobs == 2
    assert sorted(forgotten) == ["done", "silent"]  # their hint state goes with them
    # The superseded incarnation of rank 1 went too; the live ones stay.
    assert set(model.ranks) == {alive, new}


# --- 5. flowtop run: signals and PYTHONPATH --------------------------------------------------

COUNT_SIGINT = """
import os, signal
count = 0
def on_int(s, f):
    global count
    count += 1
def on_term(s, f):
    print(count, flush=True)
    os._exit(0)
signal.signal(signal.SIGINT, on_int)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    signal.pause()
"""


def test_ctrl_c_reaches_the_command_once() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowtop.cli", "run", "--", sys.executable, "-c", COUNT_SIGINT],
        stdout=subprocess.PIPE, text=True, start_new_session=True,  # its own process group, like a job
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        # SIGTERM goes to flowtop run alone and is forwarded after any forwarded SIGINT.
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().strip() == "1"
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_pythonpath_bootstrap_first_user_next_package_root_last() -> None:
    root = str(BOOTSTRAP_DIR.parent.parent)
    env = probe_env({"PYTHONPATH": os.pathsep.join(["/a", "/b"])})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP_DIR), "/a", "/b", root]
    assert probe_env({})["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP_DIR), root]


def test_package_root_does_not_shadow_user_modules(tmp_path: Path) -> None:
    # A module of the user's named like a package in the probe's package root.
    (tmp_path / "flowtop.py").write_text("WHO = 'user'\n")
    env = probe_env(dict(os.environ, PYTHONPATH=str(tmp_path)))
    out = subprocess.run([sys.executable, "-c", "import flowtop; print(getattr(flowtop, 'WHO', 'flowtop'))"],
                         env=env, capture_output=True, text=True, timeout=60, cwd=str(tmp_path.parent))
    assert out.stdout.strip() == "user", out.stderr


# --- 6. IPv6 --------------------------------------------------------------------------------


def _ipv6_loopback_port() -> int | None:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            return int(s.getsockname()[1])
    except OSError:
        return None


def test_monitor_binds_and_receives_on_ipv6_loopback() -> None:
    port = _ipv6_loopback_port()
    if port is None:
        pytest.skip("no IPv6 loopback here")
    listen = f"tcp://[::1]:{port}"

    async def main() -> tuple[int, bool]:
        collector = Collector(Model(), listen)
        await collector.start()
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.IPV6, 1)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(listen)
        try:
            seq = 0
            deadline = time.monotonic() + 20
            while collector.model.received == 0 and time.monotonic() < deadline:
                pub.send(_step_frame(seq))  # PUB drops until the connection is up: resend
                seq += 1
                await asyncio.sleep(0.05)
            return collector.model.received, collector._send is not None
        finally:
            pub.close(0)
            ctx.term()
            await collector.stop()

    received, control_bound = asyncio.run(main())
    assert received > 0 and control_bound


def test_job_kernel_merge_is_reused_until_a_new_window_arrives() -> None:
    from flowtop.monitor.kernels.merge import CumulativeKernels
    from flowtop.monitor.model import Model
    from flowtop.monitor.rankkernels import KernelTables

    calls: list[int] = []

    def merge(tables):  # type: ignore[no-untyped-def]
        calls.append(len(tables))
        return object()

    model = Model(kernels=KernelTables(merge=merge))
    feed = Feeder(model)
    for rank in (0, 1):
        feed.hello(_key(rank), world=2)
        model.ranks[_key(rank)].kernels_cumulative = CumulativeKernels()
        model.ranks[_key(rank)].kernels_cumulative.windows = 1
    first = model.snapshot(1.0).jobs[0].kernels_merged
    assert model.snapshot(1.5).jobs[0].kernels_merged is first and calls == [2]
    model.ranks[_key(1)].kernels_cumulative.windows = 2  # a new window on rank 1
    assert model.snapshot(2.0).jobs[0].kernels_merged is not first and calls == [2, 2]
