"""A recording of a relayed job replays what the live monitor showed when its relay died
(flowtop.monitor.relayrecord): the frames keep their relay and their relay-clock times, so the cut
ranks are unheard in the replay too, not hung. Frames go through a real Collector's batch and frame
handlers and its Recorder, ticked on the instants a live monitor ticks at (replay ticks alike)."""

from __future__ import annotations

from pathlib import Path

import msgpack

from flowtop.monitor.collector import Collector
from flowtop.monitor.recording import Recorder, replay_all
from flowtop.monitor.relayrecord import relayed_of, relayed_record
from flowtop.monitor.relays import SILENT_AFTER_S, encode_stamp
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json
from flowtop.monitor.thinning import recorded
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey

RELAY = "node-b:7:1"
KEYS = [RankKey("j", "node-a", 100, 0, 0), RankKey("j", "node-b", 101, 1, 0)]  # rank 1 behind the relay
FLOPS = {"step": 1, "model_flops": 1e9, "executed_flops": 1.2e9, "attention": "full", "dtype": "bf16",
         "peak_flops": 1e12, "peak_source": "test", "uncounted": {}, "tokens": 256}


class _LiveJob:
    """Two ranks stepping every 0.05 s into a recording collector; rank 1's frames in batches of
    its relay (held 0.02 s there), until the relay dies at ``cut_at`` (a relay again from
    ``back_at``); byes at ``end_at``. ``wait_s``: rank 1's input wait each step. ``ticks``: each
    tick's snapshot."""

    def __init__(self, path: Path, wait_s: float = 0.0) -> None:
        self.collector = Collector(make_model(), "tcp://127.0.0.1:5999", recorder=Recorder(path))
        self.seq = dict.fromkeys(KEYS, 0)
        self.wait_s = wait_s
        self.ticks: list[MonitorSnapshot] = []

    def send(self, key: RankKey, kind: str, fields: dict[str, object], now: float, relayed: bool) -> None:
        self.seq[key] += 1
        frame = wire.encode(kind, key, self.seq[key], now, fields)
        if key.rank == 0:
            self.collector.handle_frame(frame, now)
        elif relayed:
            self.collector.handle_batch([encode_stamp(RELAY, 500.0 + now, [20_000]), frame], now, now + 0.01)

    def run(self, cut_at: float, end_at: float, back_at: float | None = None) -> MonitorSnapshot:
        now, step, snap = 0.0, 0, None
        for key in KEYS:
            self.send(key, "hello", {"local_rank": 0, "world_size": 2, "device": "cpu (test)",
                                     "probe_version": "test"}, now, True)
            self.send(key, "flops", FLOPS, now, True)
        for n in range(1, round(end_at / 0.05) + 1):
            now = n * 0.05
            step += 1
            if n % 10 == 0:  # a tick runs before the frames received at it (the collector's loop, a replay)
                snap = self.collector.model.tick(now)
                self.ticks.append(snap)
            relayed = now < cut_at or (back_at is not None and now >= back_at)
            for key in KEYS:
                fields = {"step": step, "wall_s": 0.05, "tokens": 256, "drops": 0}
                if key.rank == 1 and self.wait_s:
                    fields["input_wait_s"] = self.wait_s
                self.send(key, "step", fields, now, relayed)
        for key in KEYS:  # rank 1's bye is lost with its relay
            self.send(key, "bye", {"reason": "exit", "steps": step, "drops": 0}, now, False)
        assert self.collector.recorder is not None
        self.collector.recorder.close()
        return self.collector.model.tick(now + 0.5) if snap is not None else snap


def _shown(snap: MonitorSnapshot) -> tuple[object, ...]:
    (job,) = snap.jobs
    return (job.status, [r.status for r in job.ranks], [r.relay for r in job.ranks], job.over_phrase,
            sorted((h.id, h.severity, h.target) for h in job.hints))


def test_a_dead_relays_replay_shows_its_ranks_unheard_as_live_did(tmp_path: Path) -> None:
    live = _LiveJob(tmp_path / "cut.rec").run(cut_at=3.0, end_at=3.0 + SILENT_AFTER_S + 3.0)
    status, ranks, relays, over, hints = _shown(live)
    assert status == "done" and ranks == ["done", "stale"] and relays == [None, RELAY]
    assert over == "over 1 of 2 ranks; 1 unheard behind relay node-b"
    assert ("relay_silent", "warning", "") in hints and not [h for h in hints if h[0].startswith("hang")]
    replayed = replay_all(tmp_path / "cut.rec", make_model())
    assert replayed.rejected == 0
    assert _shown(replayed) == _shown(live)
    assert to_json(replayed)["jobs"][0]["ranks"][1]["relay"] == RELAY


def _rank_hints(snap: MonitorSnapshot) -> tuple[object, ...]:
    """A tick's hints as (id, target, ended), and whether rank 1 is unheard."""
    (job,) = snap.jobs
    return job.ranks[1].cut is not None, sorted((h.id, h.target, h.ended) for h in job.hints)


def test_a_cut_ranks_hints_are_suspended_in_the_replay_tick_by_tick_as_live(tmp_path: Path) -> None:
    """Rank 1, behind the relay, waits for input 0.01 s of each 0.05 s step (20 %): an input_wait
    hint. Its relay dies at 3 s: while rank 1 is unheard, no hint of it is active, only the job's
    relay_silent (its input_wait kept, marked ended); a relay again from 9 s: its new steps wait 20 % again and the hint is back (with
    relay_silent held for HOLD_S after the relay is heard again). The replay of the recording
    shows the same hints at every tick."""
    live = _LiveJob(tmp_path / "back.rec", wait_s=0.01)
    live.run(cut_at=3.0, end_at=21.0, back_at=9.0)
    shown = {round(s.taken_at / 0.5): _rank_hints(s) for s in live.ticks}
    wait = ("input_wait", "rank 1", False)
    assert shown[round(3.0 / 0.5)] == (False, [wait])
    unheard = [hints for cut, hints in shown.values() if cut]
    # its hint from before the cut kept marked ended (as last measured), none active but relay_silent
    assert unheard and all(hints == [("input_wait", "rank 1", True), ("relay_silent", "", False)] for hints in unheard)
    assert shown[round(10.0 / 0.5)] == (False, [wait, ("relay_silent", "", False)])  # held for HOLD_S
    assert shown[round(21.0 / 0.5)] == (False, [wait])
    replayed: list[MonitorSnapshot] = []
    replay_all(tmp_path / "back.rec", make_model(), on_tick=replayed.append)
    assert replayed
    again = {round(s.taken_at / 0.5): _rank_hints(s) for s in replayed}
    common = sorted(set(shown) & set(again))
    assert len(common) >= len(shown) - 1
    assert [again[k] for k in common] == [shown[k] for k in common]


def test_a_forged_batch_record_is_refused_in_the_replay_as_live() -> None:
    """A peer's frame with the bytes of a batch record is kept altered: the replay reads it as a
    frame (an array: refused, as live), not as a stamp for the frames after it."""
    forged = relayed_record(encode_stamp(RELAY, 1.0, [0]), 1, 0.0)
    assert relayed_of(forged) is not None
    kept = recorded(forged)
    assert relayed_of(kept) is None and msgpack.unpackb(kept)[:4] == msgpack.unpackb(forged)
    for frame in (forged, kept):
        try:
            wire.decode(frame)
        except wire.WireError as exc:
            reason = str(exc)
        assert reason  # both refused by the wire
    assert relayed_of(relayed_record(b"s", -1, 0.0)) is None and relayed_of(relayed_record(b"s", 1, -1.0)) is None


def test_a_decoders_slip_is_a_refusal_live_and_in_a_replay(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Any exception out of the wire's decode (a BytesWarning under ``python -bb``) refuses that frame
    at the one place live and replayed frames are decoded, never ends the receive loop."""
    from flowtop.monitor import rankkernels
    from flowtop.monitor.recording import feed

    def slip(frame: bytes, admit: object = None) -> object:
        raise BytesWarning("comparison between bytes and str")

    monkeypatch.setattr(rankkernels.wire, "decode", slip)
    model = make_model()
    feed(model, b"\x80", 1.0)
    assert model.rejected == 1 and "decode: BytesWarning" in next(iter(model.rejected_reasons))
