"""Recordings: write, read back, replay through the model, and drive the TUI from one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typing import Any

from flowtop.tui.app import FlowtopApp
from flowtop.monitor.recording import (MAGIC, MAGIC_V1, Recorder, RecordingError, RecordingSource, read_recording,
                                       replay_all)
from synthetic.replay import ReplaySource
from flowtop.monitor.wiring import make_model
from probe import wire
from snapshot_schema import assert_valid_snapshot

HERE = Path(__file__).resolve().parent
REC = HERE / "data" / "demo-2rank.rec"  # a real 2-rank CPU DDP run (tests/data/make_recording.py)
GOLDEN = HERE / "snapshots" / "kernels-recording.txt"


def _frame(seq: int, step: int) -> bytes:
    key = wire.RankKey("j", "h", 1, 0, 0)
    fields = {"step": step, "wall_s": 0.1, "tokens": 10, "drops": 0}
    return wire.encode("step", key, seq, 1.0, fields)


def test_round_trip_and_truncated_tail(tmp_path: Path) -> None:
    path = tmp_path / "x.rec"
    rec = Recorder(path)
    for i in range(3):
        rec.write(10.0 + i, _frame(i, i + 1))
    rec.close()
    got = list(read_recording(path))
    assert [t for t, _ in got] == [0.0, 1.0, 2.0]
    assert [wire.decode(f).fields["step"] for _, f in got] == [1, 2, 3]
    # A monitor killed mid-write leaves a partial record: what came before still reads.
    data = path.read_bytes()
    from test_recording_ending import offsets

    marker_at = offsets(data)[-1]  # the end marker's record; the 3rd frame's ends there
    path.write_bytes(data[:marker_at - 5])
    said: list[str] = []
    assert len(list(read_recording(path, said.append))) == 2
    third = offsets(data)[2]  # the 3rd frame's record, cut
    assert said == [f"recording {path} is cut short in its record at byte {third}, after 2 frames (1.0 s recorded): "
                    "what came after is missing, so its ranks look as they were then"]
    path.write_bytes(data)  # whole: nothing to say
    assert len(list(read_recording(path, said.append))) == 3 and len(said) == 1


def test_a_replay_of_a_recording_cut_short_says_so(tmp_path: Path) -> None:
    """Its ranks look live where it stops: the replay must say the file ends mid-record."""
    cut = tmp_path / "cut.rec"
    cut.write_bytes(REC.read_bytes()[:20_000])
    model = make_model()
    snap = replay_all(cut, model)
    assert snap.jobs and snap.jobs[0].status != "done"
    (notice,) = model.notices.take()
    assert notice.severity == "warning" and "is cut short in its record at byte" in notice.text
    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(cut), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and json.loads(out.stdout)["jobs"]  # printed whole; the recording is not
    assert f"flowtop: recording {cut} is cut short in its record at byte" in out.stderr


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.rec"
    bad.write_bytes(b"not a recording")
    with pytest.raises(RecordingError, match="bad header"):
        list(read_recording(bad))
    huge = tmp_path / "huge.rec"
    huge.write_bytes(MAGIC + (2**31).to_bytes(4, "big") + bytes(4))
    with pytest.raises(RecordingError, match="larger than any frame"):
        list(read_recording(huge))
    with pytest.raises(RecordingError, match="cannot read"):
        list(read_recording(tmp_path / "missing.rec"))
    bad.write_bytes(b"")  # a monitor killed before its first write
    with pytest.raises(RecordingError, match="is empty: the monitor that wrote it stopped before writing anything"):
        list(read_recording(bad))
    bad.write_bytes(b"FLOWTOP-REC 3\n")
    with pytest.raises(RecordingError, match=r"is a recording of a newer format \(3\): a newer flowtop reads it"):
        list(read_recording(bad))


def test_replay_of_a_real_run() -> None:
    snap = replay_all(REC, make_model())
    job = snap.jobs[0]
    assert job.status == "done" and job.ranks_seen == 2 and job.world_size == 2
    assert [r.step for r in job.ranks] == [60, 60]
    assert all(r.tokens_per_step == 256 for r in job.ranks)
    assert job.flops is not None and job.flops.mfu is not None
    assert all(r.kernels is not None and r.kernels.device == "cpu" for r in job.ranks)


def test_snapshot_replay_cli_and_bad_file(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(REC), "--json"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert_valid_snapshot(data)
    assert [r["step"] for r in data["jobs"][0]["ranks"]] == [60, 60]
    bad = tmp_path / "bad.rec"
    bad.write_bytes(b"xx")
    for args in (["snapshot", "--replay", str(bad)], ["replay", str(bad)]):
        out = subprocess.run([sys.executable, "-m", "flowtop.cli", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "not a flowtop recording" in out.stderr


@pytest.mark.asyncio
async def test_tui_plays_a_recording() -> None:
    source = RecordingSource(REC, make_model(), speed=1e6)  # everything due at once
    app = FlowtopApp(source, refresh_s=0)
    async with app.run_test(size=(80, 24)) as pilot:
        app.refresh_snapshot()
        await pilot.pause()
        snap = app.latest
        assert snap is not None and [r.step for r in snap.jobs[0].ranks] == [60, 60]
        # A recording cannot be asked for a kernel window: no "k Capture" in the footer, and the
        # key does nothing (it said "asked rank 0 of ... for a kernel window").
        from test_tui_snapshots import screen_text

        assert "Capture" not in screen_text(app)
        await pilot.press("k")
        await pilot.pause()
        # Only the note that this old file cannot say how it ended (its playback is at its end).
        assert [n.message for n in app._notifications] == [
            f"recording {REC} was written by an older flowtop (format 1, no end marker): whether it ended "
            "cleanly is not known"]
        await pilot.press("q")


@pytest.mark.asyncio
async def test_kernel_screen_from_recording_matches_golden() -> None:
    from test_tui_snapshots import screen_text

    snap = replay_all(REC, make_model())
    app = FlowtopApp(ReplaySource([snap], advance=False), refresh_s=0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        text = screen_text(app)
    assert "CPU operators" in text and "aten::mm" in text
    if os.environ.get("FLOWTOP_UPDATE_SNAPSHOTS") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")


@pytest.mark.asyncio
async def test_tui_replay_builds_kernel_windows_off_its_loop() -> None:
    """The H200 recording's windows (≈50 ms each to build) reach the TUI through the worker."""
    source = RecordingSource(Path(__file__).parent / "data" / "h200-gpt-large.rec.gz", make_model(), speed=1e6)
    await source.start()
    try:
        assert source.model.kernels is not None and source.model.kernels.submit is not None
        source.snapshot()  # feeds every frame: the windows are queued, not built here
        await source._worker.idle()
        snap = source.snapshot()
        assert snap.jobs[0].ranks[0].kernels.anatomy.step_basis == "device"
    finally:
        await source.stop()
    assert source.model.kernels is not None and source.model.kernels.submit is None


def test_a_record_with_an_impossible_time_is_damage(tmp_path: Path) -> None:
    """A replay takes a snapshot every recorded second up to each record's time: t = inf (or a
    negative time) would never end it."""
    import msgpack

    import zlib

    for t in (float("inf"), float("nan"), -1.0):
        bad = tmp_path / "t.rec"
        rec = msgpack.packb([t, b"frame"], use_bin_type=True)
        bad.write_bytes(MAGIC_V1 + len(rec).to_bytes(4, "big") + rec)
        with pytest.raises(RecordingError, match="damaged record"):
            list(read_recording(bad))
        bad.write_bytes(MAGIC + len(rec).to_bytes(4, "big") + zlib.crc32(rec).to_bytes(4, "big") + rec)
        with pytest.raises(RecordingError, match="damaged record"):
            list(read_recording(bad))


def test_a_damaged_record_midway_replays_up_to_it(tmp_path: Path) -> None:
    """One record's length made 3 bytes too long (record 10 of a real run): the whole recording
    was refused ("damaged record", exit 2, nothing shown, in the TUI too; a new user's trial),
    where a file cut short replays up to the cut. It now replays up to the damaged record and
    says where it is."""
    import struct

    data = bytearray(REC.read_bytes())
    assert data[:len(MAGIC_V1)] == MAGIC_V1  # not compressed, version 1: the lengths can be walked
    off = len(MAGIC_V1)
    for _ in range(9):
        off += 4 + struct.unpack(">I", data[off:off + 4])[0]
    size = struct.unpack(">I", data[off:off + 4])[0]
    data[off:off + 4] = struct.pack(">I", size + 3)
    bad = tmp_path / "bad.rec"
    bad.write_bytes(bytes(data))
    said: list[str] = []
    frames = list(read_recording(bad, said.append))
    assert len(frames) == 9
    assert frames == list(read_recording(REC))[:9]
    (text,) = said
    assert f"has a damaged record at record 10 (byte {off}): replayed up to it (9 frames" in text
    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(bad), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr  # printed, but not the whole recording (2: no recording at all)
    assert "has a damaged record at record 10" in out.stderr and json.loads(out.stdout)["schema"]


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["in a record", "between records"])
async def test_a_tui_replay_says_the_cut_when_it_reaches_it(tmp_path: Path, how: str) -> None:
    """Said at the start, the cut's notice was gone (6 s) long before the replay reached the cut,
    where its ranks freeze looking live (a new user's trial at --speed 1). Between records: a
    recording without its end marker (format 2), 6 frames a second apart."""
    import asyncio

    from test_recording_ending import offsets, record

    cut = tmp_path / "cut.rec"
    if how == "in a record":
        cut.write_bytes(REC.read_bytes()[:20_000])
    else:
        data = record(cut, 6).read_bytes()
        cut.write_bytes(data[:offsets(data)[-1]])
    source = RecordingSource(cut, make_model(), speed=5.0)
    await source.start()
    try:
        first = source.model.notices.take()
        source.speed = 1e6  # then everything due at once
        for _ in range(100):
            source.catch_up()
            if source._next >= len(source._records):
                break
            await asyncio.sleep(0.01)
        later = source.model.notices.take()
    finally:
        await source.stop()
    said = "is cut short in its record" if how == "in a record" else "has no end marker"
    assert not [n for n in first if said in n.text]
    assert [n.severity for n in later if said in n.text] == ["warning"]


def test_a_corrupt_frame_in_a_replay_is_said_with_its_reason(tmp_path: Path) -> None:
    """A record whose frame is garbage (its container intact) was only counted in the header's
    ``rej`` (a new user's trial): the replay now says what was refused and why, at once; further
    refusals within REJECT_NOTICE_S are counted into the next notice, at the next refusal or at
    a tick once that long has passed (a flood that stops is still said)."""
    from flowtop.monitor.model import REJECT_NOTICE_S

    path = tmp_path / "x.rec"
    rec = Recorder(path)
    rec.write(10.0, _frame(0, 1))
    rec.write(11.0, b"\x93garbage, not a frame")
    rec.write(12.0, b"\x00")  # 1 s later: counted, not said yet
    rec.write(12.5, _frame(1, 2))
    rec.write(12.0 + REJECT_NOTICE_S, _frame(2, 3))  # the tick a minute on says the one unsaid
    rec.write(20.0 + 2 * REJECT_NOTICE_S, b"\xc1")  # long after: said at once
    rec.close()
    model = make_model()
    snap = replay_all(path, model)
    assert snap.rejected == 3 and snap.jobs[0].ranks[0].step == 3  # the good frames around them stand
    said = [n for n in model.notices.history if n.text.startswith("refused ")]
    assert [n.at for n in said] == [1.0, 1.0 + REJECT_NOTICE_S, 10.0 + 2 * REJECT_NOTICE_S]
    first, second, third = (n.text for n in said)
    assert first.startswith("refused a frame: record 2 (1.0 s): ") and "(1 refused in all; `rej` in the header" in first
    assert third.startswith("refused a frame: record 6 (130.0 s): ")  # where in the file
    assert second.startswith("refused a frame: ") and "(2 refused in all;" in second
    assert third.startswith("refused a frame: ") and "(3 refused in all;" in third
    assert all(n.severity == "warning" for n in said)


def test_refusals_are_bucketed_by_kind_not_by_byte() -> None:
    """2,000 random frames made a bucket per byte value and position ("can't decode byte 0x9e
    in position 0") until the 100 buckets were full, and a later wrong-key or future-version
    refusal was counted but never named (a hostile-input trial)."""
    from flowtop.monitor.model import MAX_REASONS, OTHER_REASONS

    model = make_model()
    for b in range(256):
        model.reject(f"UnicodeDecodeError: 'utf-8' codec can't decode byte 0x{b:02x} in position {b % 7}: invalid")
    model.reject("unsupported major version 9")
    assert dict(model.rejected_reasons) == {
        "UnicodeDecodeError: 'utf-#' codec can't decode byte # in position #: invalid": 256,
        "unsupported major version #": 1}
    for k in range(MAX_REASONS + 5):
        model.reject(f"kind {chr(65 + k % 26)}{chr(65 + k // 26)}")
    assert model.rejected_reasons[OTHER_REASONS] == 7 and len(model.rejected_reasons) == MAX_REASONS + 1


def test_a_monitor_that_cannot_bind_leaves_the_recording_file_alone(tmp_path: Path) -> None:
    """A second `flowtop serve --record run.rec` started by mistake while the first records to
    run.rec: it finds the port taken and exits 2, and it emptied the first one's recording
    (its own header and end marker at the start, the live monitor's records after a hole of zero
    bytes: "not a flowtop recording (bad header)"). Nothing is written before the bind now."""
    import asyncio

    import zmq

    from flowtop.monitor.collector import AddressError, Collector
    from flowtop.tools.demo.launch import free_port_pair

    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    held = zmq.Context.instance().socket(zmq.SUB)
    held.bind(listen)  # the first monitor
    path = tmp_path / "run.rec"
    path.write_bytes(MAGIC + b"the first monitor's records")
    fresh = tmp_path / "new.rec"
    try:
        for p in (path, fresh):
            collector = Collector(make_model(), listen, recorder=Recorder(p))
            with pytest.raises(AddressError):
                asyncio.run(collector.start())
    finally:
        held.close(linger=0)
    assert path.read_bytes() == MAGIC + b"the first monitor's records"
    assert not fresh.exists()  # and none is left behind where there was none


def test_a_restarted_monitor_keeps_the_earlier_recording_aside(tmp_path: Path) -> None:
    """A trial: `flowtop serve --record run.rec` killed mid-job and started again with the same
    command line emptied the first run's 500 KB recording without a word. The earlier file keeps
    its bytes as run.rec.1 (then .2: run.rec.1 taken), the monitor says so, and the new recording
    is whole in its place; an empty file there is simply reused."""
    import asyncio

    from flowtop.monitor.collector import Collector
    from flowtop.tools.demo.launch import free_port_pair

    path = tmp_path / "run.rec"
    earlier = MAGIC + b"the first run's records"

    def one_run() -> Collector:
        collector = Collector(make_model(), f"tcp://127.0.0.1:{free_port_pair()}", recorder=Recorder(path))

        async def run() -> None:
            await collector.start()
            await collector.stop()

        asyncio.run(run())
        return collector

    path.write_bytes(earlier)
    (tmp_path / "run.rec.1").write_bytes(b"kept before")
    collector = one_run()
    assert (tmp_path / "run.rec.2").read_bytes() == earlier
    assert (tmp_path / "run.rec.1").read_bytes() == b"kept before"
    assert [n.text for n in collector.model.notices.history] == [
        f"{path} held an earlier file: kept as {tmp_path / 'run.rec.2'}, this recording starts afresh"]
    assert path.read_bytes().startswith(MAGIC) and read_recording(path) is not None
    path.write_bytes(b"")
    one_run()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.rec", "run.rec.1", "run.rec.2"]


def test_a_recording_whose_earlier_file_cannot_be_kept_records_nothing(tmp_path: Path) -> None:
    """Where the earlier file cannot be moved (here: every name beside it taken), it stays whole
    and nothing is recorded; the reason is the recorder's error, which the CLI prints."""
    from flowtop.monitor import rec_aside

    path = tmp_path / "run.rec"
    path.write_bytes(b"earlier")
    for n in range(1, rec_aside.MAX_ASIDE + 1):
        (tmp_path / f"run.rec.{n}").write_bytes(b"")
    rec = Recorder(path)
    rec.start(0.0)
    rec.write(1.0, _frame(1, 1))
    rec.close(now=2.0)
    assert path.read_bytes() == b"earlier"
    assert rec.error == (f"recording {path} not started: the file there could not be kept aside ({path}.1 to .999 "
                         "are all taken); give --record another name")


def test_keeping_aside_never_replaces_a_name_taken_meanwhile_and_numbers_follow_age(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second monitor started at once on the same path took run.rec.1 after this one looked
    (a reviewer's case: the look then a rename replaced it, the original lost); a hard link fails
    where the name is taken. With .2 and .3 kept and .1 deleted by the user, the next goes to .4."""
    from flowtop.monitor import rec_aside

    path = tmp_path / "run.rec"
    path.write_bytes(b"earlier")
    (tmp_path / "run.rec.1").write_bytes(b"the other monitor's")
    monkeypatch.setattr(rec_aside, "_numbers", lambda real: [1, 2])  # .1 looked free when listed
    assert rec_aside.keep_aside(path) == tmp_path / "run.rec.2"
    assert (tmp_path / "run.rec.1").read_bytes() == b"the other monitor's"
    assert (tmp_path / "run.rec.2").read_bytes() == b"earlier" and not path.exists()
    monkeypatch.undo()
    (tmp_path / "run.rec.1").unlink()
    (tmp_path / "run.rec.3").write_bytes(b"third")
    path.write_bytes(b"fourth")
    assert rec_aside.keep_aside(path) == tmp_path / "run.rec.4"


def test_a_symlinked_recording_path_keeps_its_link(tmp_path: Path) -> None:
    """run.rec -> disk/run.rec: the target is kept aside beside itself and the new recording is
    written through the link (a reviewer's case: the link itself was moved, the new file written
    beside it, off the disk the link pointed to)."""
    (tmp_path / "disk").mkdir()
    target, link = tmp_path / "disk" / "run.rec", tmp_path / "run.rec"
    target.write_bytes(MAGIC + b"earlier")
    link.symlink_to(target)
    rec = Recorder(link)
    rec.start(0.0)
    rec.write(1.0, _frame(1, 1))
    rec.close(now=2.0)
    assert link.is_symlink() and rec.kept_aside == tmp_path / "disk" / "run.rec.1"
    assert (tmp_path / "disk" / "run.rec.1").read_bytes() == MAGIC + b"earlier"
    assert read_recording(target) is not None and target.read_bytes().startswith(MAGIC)


def test_a_recording_refused_at_start_is_said_at_once(tmp_path: Path) -> None:
    """Every name beside the path taken: nothing is recorded, and the monitor says why as it
    starts (a reviewer's case: only the CLI's exit said it, the TUI showed "REC stopped")."""
    import asyncio

    from flowtop.monitor import rec_aside
    from flowtop.monitor.collector import Collector
    from flowtop.tools.demo.launch import free_port_pair

    path = tmp_path / "run.rec"
    path.write_bytes(b"earlier")
    for n in range(1, rec_aside.MAX_ASIDE + 1):
        (tmp_path / f"run.rec.{n}").write_bytes(b"")
    collector = Collector(make_model(), f"tcp://127.0.0.1:{free_port_pair()}", recorder=Recorder(path))

    async def run() -> None:
        await collector.start()
        await collector.stop()

    asyncio.run(run())
    assert [n.text for n in collector.model.notices.history] == [
        f"recording {path} not started: the file there could not be kept aside ({path}.1 to .999 are all taken); "
        "give --record another name"]


def test_keeping_aside_ignores_names_that_are_not_its_numbers_and_undoes_a_link_it_cannot_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run.rec.² (a Unicode digit) and a 5,000-digit suffix beside it made int() raise at the
    monitor's start; where the old name cannot be removed after its link (another user's file in a
    sticky directory), the link made is taken back, nothing left behind (reviewers' cases)."""
    from flowtop.monitor import rec_aside

    path = tmp_path / "run.rec"
    path.write_bytes(b"earlier")
    (tmp_path / "run.rec.\u00b2").write_bytes(b"")
    (tmp_path / ("run.rec." + "9" * 200)).write_bytes(b"")
    assert rec_aside.keep_aside(path) == tmp_path / "run.rec.1"
    path.write_bytes(b"second")
    real_unlink = os.unlink

    def refuse(p: Any) -> None:
        if Path(p) == path:
            raise PermissionError(1, "Operation not permitted")
        real_unlink(p)

    monkeypatch.setattr(rec_aside.os, "unlink", refuse)
    with pytest.raises(PermissionError):
        rec_aside.keep_aside(path)
    assert not (tmp_path / "run.rec.2").exists() and path.read_bytes() == b"second"
