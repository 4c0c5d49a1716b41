"""A monitor started (or restarted) while a job hangs: the ranks' hellos say their last step and
the seconds since its boundary (``last_step``, ``step_age_s``), so the new monitor shows them
stalled and the hang hint fires as one that watched all along would (flowtop.monitor.rankstate.
heard_step; probe.steps.tracker.StepTracker.hello_step)."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

import probe
from flowtop.monitor.model import Model
from flowtop.monitor.rankstate import RankHello
from flowtop.monitor.wiring import make_model
from probe import wire
from test_review_monitor import Feeder as BaseFeeder

torch = pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train])")
nn = torch.nn
WORLD = 4


def _key(rank: int) -> wire.RankKey:
    return wire.RankKey("j", "h", 100 + rank, rank, 0)


class Feeder(BaseFeeder):
    """Frames through the wire's encode and decode, as the collector hands them to the model."""
    def hello(self, key: wire.RankKey, now: float, **step: Any) -> None:
        self.send(key, "hello", now, local_rank=key.rank, world_size=WORLD, device="cpu (test)",
                  probe_version="t", **step)


def _hang(model: Model, t: float) -> Any:
    snap = model.tick(t)
    (job,) = snap.jobs
    return job, {h.id: h for h in job.hints}


def test_a_monitor_started_during_a_hang_sees_the_ranks_stalled_at_their_step() -> None:
    """Ranks 0-2 block in an all-reduce at step 305 (their hellos: 40 s since its boundary),
    rank 3 is stopped (never heard by this monitor): stalled ~40 s at step 305, the job stalled,
    hang_all critical naming rank 3. Without the fields the ranks read live at step 0, no hint."""
    model = make_model()
    f = Feeder(model)
    for t in (100.0, 102.0, 104.0):  # a hello every HELLO_S while hung; each built 40 s + since
        for rank in range(3):
            f.hello(_key(rank), t, last_step=305, step_age_s=40.0 + (t - 100.0))
    job, hints = _hang(model, 104.5)
    assert sorted(r.rank for r in job.ranks) == [0, 1, 2]
    for r in job.ranks:
        assert (r.status, r.step) == ("stalled", 305)
        assert r.flops is None or r.flops.reason_at(104.5) == "no step for 44 s"
    assert job.status == "stalled"
    hang = hints["hang_all"]
    assert hang.severity == "critical"
    assert hang.evidence_at(104.5)["stalled_s"] == pytest.approx(44.5)
    assert hang.evidence["last_step"] == 305
    assert hang.evidence["never_heard_ranks"] == [3]
    assert hang.evidence["by_hello_ranks"] == [0, 1, 2]
    assert hang.evidence["median_step_time_s"] is None  # none seen: the limit is the floor
    text = hang.summary_at(104.5)
    assert "step 305" in text and "nothing ever heard from rank 3 of 4" in text


def test_old_probes_hellos_without_the_fields_read_as_before() -> None:
    """No ``last_step``: a rank with no step seen is not stalled (today's behaviour)."""
    model = make_model()
    f = Feeder(model)
    for t in (100.0, 102.0, 104.0):
        for rank in range(3):
            f.hello(_key(rank), t)
    job, hints = _hang(model, 104.5)
    assert [(r.status, r.step) for r in job.ranks] == [("live", 0)] * 3
    assert job.status == "running" and "hang_all" not in hints


def test_a_rank_before_its_first_step_is_not_hung() -> None:
    """Hellos with no step (loading data, compiling) for minutes: still warming up, not hung;
    and a hello whose step is older than the records seen changes nothing."""
    model = make_model()
    f = Feeder(model)
    for t in range(0, 200, 2):
        f.hello(_key(0), float(t))
    job, hints = _hang(model, 199.0)
    assert job.ranks[0].status == "live" and "hang_all" not in hints and "hang_rank" not in hints


def test_a_hello_of_a_stepping_rank_does_not_stall_it() -> None:
    """Steps flow and a hello (every HELLO_MAX_S) says the last one, a moment ago: live."""
    model = make_model()
    f = Feeder(model)
    for i in range(1, 51):
        f.send(_key(0), "step", i * 0.1, step=i, wall_s=0.1, tokens=10, drops=0)
        if i % 20 == 0:
            f.hello(_key(0), i * 0.1 + 0.01, last_step=i, step_age_s=0.02)
    job, _ = _hang(model, 5.05)
    assert job.ranks[0].status == "live" and job.ranks[0].step == 50


def test_the_hellos_step_decodes_to_a_typed_record() -> None:
    """The wire decodes a hello's step fields into one record beside its fields (both present and
    valid), None where it says no step; a hello of the other field alone says none either."""
    hello = {"local_rank": 0, "world_size": WORLD, "device": "cpu (test)", "probe_version": "t"}

    def decoded(**step: Any) -> wire.Message:
        return wire.decode(wire.encode("hello", _key(0), 0, 1.0, {**hello, **step}))

    msg = decoded(last_step=305, step_age_s=40)
    assert msg.hello_step == wire.HelloStep(305, 40.0) and isinstance(msg.hello_step.age_s, float)
    assert msg.fields["last_step"] == 305  # the fields as sent, the wire format unchanged
    assert decoded().hello_step is None
    assert decoded(last_step=3).hello_step is None and decoded(step_age_s=0.5).hello_step is None
    step = wire.encode("step", _key(0), 0, 1.0, {"step": 1, "wall_s": 0.1, "tokens": 1, "drops": 0})
    assert wire.decode(step).hello_step is None


@pytest.mark.parametrize("bad", [{"last_step": -1}, {"last_step": "305"}, {"last_step": True},
                                 {"last_step": 3.5}, {"step_age_s": -1.0}, {"step_age_s": float("nan")},
                                 {"step_age_s": "40"}, {"step_age_s": 2e9}])
def test_bad_step_fields_are_refused_or_ignored(bad: dict[str, Any]) -> None:
    """A hello with a bad step field is refused by the wire (its reason counted); the same fields
    read by hand give no step: a rank with no step seen stays live at step 0."""
    from flowtop.monitor.recording import feed
    from probe.wire.hello import hello_step

    fields = {"local_rank": 0, "world_size": WORLD, "device": "cpu (test)", "probe_version": "t",
              "last_step": 305, "step_age_s": 40.0, **bad}
    with pytest.raises(wire.WireError, match="bad value for '(last_step|step_age_s)'"):
        wire.decode(wire.encode("hello", _key(0), 0, 1.0, fields))
    assert hello_step(fields) is None
    model = make_model()
    for seq, t in enumerate((100.0, 102.0, 104.0)):
        feed(model, wire.encode("hello", _key(0), seq, 1.0, fields), t)  # as the collector feeds it
    snap = model.tick(104.5)
    assert model.rejected == 3 and not snap.jobs


def test_a_hello_built_by_hand_without_its_record_says_no_step() -> None:
    """A message not from the wire's decode (a tool's, a test's) carries no step record: its step
    fields are left out of the kept hello and read as no step, whatever they hold."""
    model = make_model()
    fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "t",
              "last_step": "305", "step_age_s": None}
    model.ingest(wire.Message("hello", _key(0), 0, 1.0, fields), 100.0)
    st = model.ranks[_key(0)]
    assert (st.step, st.hello_step_at) == (0, None) and st.hello == RankHello(world_size=1, device="cpu (test)")
    job, _ = _hang(model, 100.5)
    assert [(r.status, r.step) for r in job.ranks] == [("live", 0)]


# --- the probe's side: the hello it builds ----------------------------------------------------


@pytest.fixture
def attached(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    monkeypatch.setenv("FLOWTOP_ADDR", "tcp://127.0.0.1:1")  # nothing listens
    assert probe.attach(job="t")
    try:
        yield probe._current()
    finally:
        probe.detach()


def test_the_probes_hello_carries_its_last_step_and_its_age(attached: Any) -> None:
    """Real CPU training: no step before the first boundary; after 3 steps the hello says step 3
    and the seconds since its boundary, growing while the rank does not step; it validates."""
    pub = attached.publisher
    assert "last_step" not in pub.hello_now() and "step_age_s" not in pub.hello_now()
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    first = pub.hello_now()
    assert first["last_step"] == 3 and 0.0 <= first["step_age_s"] < 1.0
    time.sleep(0.3)
    later = pub.hello_now()
    assert later["last_step"] == 3 and later["step_age_s"] >= first["step_age_s"] + 0.25
    msg = wire.decode(wire.encode("hello", _key(0), 0, 1.0, later))
    assert msg.fields["last_step"] == 3
    assert "last_step" not in pub.hello_fields  # the kept hello stays the same object's fields


def test_a_real_monitor_started_while_a_real_rank_hangs_shows_it_stalled(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: a real probe trains 20 CPU steps, then its training thread stops stepping (as
    when blocked in a collective; its sender thread heartbeats); a real collector started 2.5 s later
    hears only hellos, and shows the rank stalled at step 20 past the 5 s limit, hang_all
    firing at the (lowered) floor. Before the change: live at step 0, no hint."""
    from flowtop.tools.demo.launch import free_port
    from monitor_thread import MonitorThread

    address = f"tcp://127.0.0.1:{free_port()}"
    monkeypatch.setenv("FLOWTOP_ADDR", address)
    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    monkeypatch.setenv("FLOWTOP_FLOPS", "0")
    assert probe.attach(job="hung", rank=0, world_size=1)
    monitor = None
    try:
        model = nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(20):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        hung_at = time.monotonic()
        # The hang has begun before the monitor starts, and the last steps waiting for a monitor
        # have expired (max_age_s 2 s): it hears only hellos, as one restarted minutes into a hang.
        time.sleep(2.5)
        monitor = MonitorThread(listen=address, hint_overrides={"hang": {"floor_s": 5.5}})

        def stalled(snap: Any) -> bool:
            ranks = [r for j in snap.jobs if j.job == "hung" for r in j.ranks]
            return bool(ranks) and ranks[0].status == "stalled" and any(h.id == "hang_all" for h in snap.jobs[0].hints)

        snap = monitor.wait_for(stalled, timeout=12.0)
        (job,) = [j for j in snap.jobs if j.job == "hung"]
        (r,) = job.ranks
        assert (r.status, r.step, job.status) == ("stalled", 20, "stalled"), (r.status, r.step, job.status)
        # stalled from the boundary, not from when this monitor first heard the rank
        assert time.monotonic() - hung_at < 9.0
        hang = next(h for h in job.hints if h.id == "hang_all")
        assert hang.evidence["by_hello_ranks"] == [0] and hang.evidence["last_step"] == 20
    finally:
        probe.detach()
        if monitor is not None:
            monitor.close()
