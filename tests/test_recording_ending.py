"""How a recording ends, and whether its bytes are intact (format version 2): the end marker a clean
close writes, a file cut between two records, a record whose bytes changed, a version 1 file, a
gzip'd one, a recording stopped by a full file, and a closed terminal. Real Recorder, real frames."""

from __future__ import annotations

import gzip
import json
import math
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from flowtop.monitor.recording import Recorder, read_recording, replay_all
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair
from probe import wire

ROOT = Path(__file__).resolve().parent.parent
KEY = wire.RankKey("j", "h", 1, 0, 0)
HEAD = 14  # b"FLOWTOP-REC 2\n"


def step(seq: int, wall_s: float = 0.1) -> bytes:
    return wire.encode("step", KEY, seq, 1.0, {"step": seq + 1, "wall_s": wall_s, "tokens": 10, "drops": 0})


def record(path: Path, n: int) -> Path:
    """``n`` step frames received a second apart from monitor time 10 s, closed half a second
    after the last (its marker: n frames, n - 0.5 s recorded)."""
    rec = Recorder(path)
    for i in range(n):
        rec.write(10.0 + i, step(i))
    rec.close(now=10.0 + n - 0.5)
    return path


def offsets(data: bytes) -> list[int]:
    """Where each record of a version 2 recording starts (an 8-byte head: length, CRC-32; then the body)."""
    assert data[:HEAD] == b"FLOWTOP-REC 2\n"
    out, off = [], HEAD
    while off < len(data):
        out.append(off)
        off += 8 + int.from_bytes(data[off:off + 4], "big")
    return out


def bodies(data: bytes) -> list[list]:
    return [msgpack.unpackb(data[o + 8:o + 8 + int.from_bytes(data[o:o + 4], "big")]) for o in offsets(data)]


def no_marker(path: Path, frames: int, seconds: float) -> str:
    return (f"recording {path} has no end marker: the monitor stopped without closing it after {frames} frames "
            f"({seconds:.1f} s recorded); the run may have gone on after that, so its ranks look as they were then")


def test_a_clean_close_reads_without_a_word_and_its_marker_counts_it(tmp_path: Path) -> None:
    path = record(tmp_path / "clean.rec", 6)
    said: list[str] = []
    notes: list[str] = []
    got = list(read_recording(path, said.append, notes.append))
    assert [t for t, _ in got] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and said == notes == []
    assert [wire.decode(f).fields["step"] for _, f in got] == [1, 2, 3, 4, 5, 6]
    *frames, end = bodies(path.read_bytes())
    assert len(frames) == 6 and end[:2] == [5.5, "end"]  # closed at 15.5 s, counted from the first frame's 10 s
    assert {k: end[2][k] for k in ("frames", "records", "seconds", "why")} == {
        "frames": 6, "records": 6, "seconds": 5.5, "why": ""}
    assert abs(end[2]["closed"] - time.time()) < 60
    model = make_model()
    assert replay_all(path, model).jobs[0].ranks[0].step == 6 and not model.notices.take()


@pytest.mark.parametrize("keep", [4, 6])
def test_a_file_cut_between_two_records_is_said_to_be_cut(tmp_path: Path, keep: int) -> None:
    """A monitor killed (kill -9, power loss) just after a whole record: the file read as complete
    and the replay showed its ranks live where it stopped (a hostile-input trial). ``keep`` 6: only
    the marker is missing."""
    path = record(tmp_path / "cut.rec", 6)
    data = path.read_bytes()
    path.write_bytes(data[:offsets(data)[keep]])
    said: list[str] = []
    assert len(list(read_recording(path, said.append))) == keep
    assert said == [no_marker(path, keep, keep - 1)]  # the frames were at 0, 1, ... s
    model = make_model()
    assert replay_all(path, model).jobs[0].ranks[0].step == keep
    assert [(n.severity, n.text) for n in model.notices.take()] == [("warning", said[0])]


def test_gathered_records_reach_the_file_within_a_second_of_monitor_time(tmp_path: Path) -> None:
    """The recorder gathers small records before writing them; a quiet job's last frames waited
    for 8 KiB more — a SIGKILL then lost minutes. The collector asks it at every turn of its loop."""
    path = tmp_path / "quiet.rec"
    rec = Recorder(path)
    rec.write(10.0, step(0))
    rec.write(10.2, step(1))
    rec.flush_due(10.9)  # the oldest gathered is 0.9 s old: not yet
    assert path.read_bytes() == b""  # nothing written yet, the format line included
    rec.flush_due(11.0)
    assert [wire.decode(f).fields["step"] for _, f in read_recording(path, lambda _: None)] == [1, 2]
    rec.write(30.0, step(2))
    rec.flush_due(30.5)
    assert len(bodies(path.read_bytes())) == 2  # written at 11 s, the next one not due before 31 s
    rec.flush_due(31.0)
    assert len(bodies(path.read_bytes())) == 3
    rec.close(now=31.0)


def test_snapshot_replay_says_a_missing_end_marker(tmp_path: Path) -> None:
    path = record(tmp_path / "cut.rec", 5)
    data = path.read_bytes()
    path.write_bytes(data[:offsets(data)[-1]])
    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(path), "--json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1, out.stderr  # not whole: the run may have gone on
    assert out.stderr == f"flowtop: {no_marker(path, 5, 4)}\n" and json.loads(out.stdout)["jobs"]


def test_snapshot_replay_of_a_recording_cut_in_its_last_frame_prints_it_and_exits_1(tmp_path: Path) -> None:
    """A monitor killed mid-write: the last frame's record lacks its last 3 bytes. The snapshot up
    to the cut is printed in full; exit 1 (not 2, a file that is no recording), the cut's byte on
    stderr, so a script does not take it for the run's end. Whole, the same file exits 0."""
    path = record(tmp_path / "run.rec", 5)
    data = path.read_bytes()
    *_, last_frame, marker = offsets(data)
    cmd = [sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(path), "--json"]
    whole = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (whole.returncode, whole.stderr) == (0, "")
    assert [r["step"] for r in json.loads(whole.stdout)["jobs"][0]["ranks"]] == [5]
    path.write_bytes(data[:marker - 3])
    cut = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert cut.returncode == 1, cut.stderr
    assert [r["step"] for r in json.loads(cut.stdout)["jobs"][0]["ranks"]] == [4]  # frames 1-4 of 5 whole
    assert cut.stderr == (f"flowtop: recording {path} is cut short in its record at byte {last_frame}, after 4 "
                          "frames (3.0 s recorded): what came after is missing, so its ranks look as they were then\n")
    text = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=60, cwd=ROOT)  # the text report alike
    assert text.returncode == 1 and "is cut short in its record at byte" in text.stderr and "ranks" in text.stdout


@pytest.mark.parametrize("keep", [7, 8, 12, HEAD - 1])
def test_a_recording_cut_inside_its_header_is_a_cut_recording_exit_1(tmp_path: Path, keep: int) -> None:
    """A real recording truncated to its first ``keep`` bytes (inside the 14-byte header, "FLOWTOP"
    at least): a cut recording, said with the cut's byte offset, nothing replayed, exit 1 as other
    cut recordings (it read "not a flowtop recording (bad header)", exit 2). Gzip'd and cut alike,
    the same."""
    path = record(tmp_path / "run.rec", 3)
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    said: list[str] = []
    assert list(read_recording(path, on_cut=said.append)) == []
    assert said == [f"recording {path} is cut short in its header at byte {keep}: nothing was recorded before the "
                    "cut, so there is nothing to replay"]
    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(path), "--json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1, out.stderr
    assert out.stderr == f"flowtop: {said[0]}\n" and json.loads(out.stdout)["jobs"] == []


def test_a_gzipd_recording_cut_inside_its_header_is_a_cut_recording(tmp_path: Path) -> None:
    """``gzip run.rec`` then cut at every length that ends the stream inside the header: a cut at
    the header's byte N (gzip raises EOFError and holds back what it had: it is read a byte at a
    time), never "not a readable recording"; a stream cut before its first byte says so (exit 2:
    nothing says it held a recording)."""
    packed = gzip.compress(record(tmp_path / "run.rec", 3).read_bytes())
    offsets_seen: set[int] = set()
    gz = tmp_path / "run.rec.gz"
    for cut in range(3, len(packed)):
        gz.write_bytes(packed[:cut])
        said: list[str] = []
        try:
            frames = list(read_recording(gz, on_cut=said.append))
        except Exception as exc:  # noqa: BLE001
            assert str(exc) in [f"{gz} is a compressed file cut short {where}: not known to be a recording"
                                for where in ["before its first byte", *(f"at byte {n}" for n in range(1, 7))]]
            continue
        if not said or "in its header" not in said[0]:
            break  # past the header
        assert frames == [] and said[0].startswith(f"recording {gz} is cut short in its header at byte ")
        offsets_seen.add(int(said[0].split("at byte ")[1].split(":")[0]))
    assert offsets_seen and max(offsets_seen) < HEAD and min(offsets_seen) >= 7


@pytest.mark.parametrize("keep", [1, 2, 6])
def test_too_few_of_a_header_s_bytes_to_name_it_are_not_a_recording_exit_2(tmp_path: Path, keep: int) -> None:
    """A file of a header's first ``keep`` bytes, fewer than "FLOWTOP" (7): "F" alone, "FL",
    "FLOWTO". Nothing says it was a recording (any 1-byte file "F" read as one cut in its header,
    exit 1): "not a flowtop recording", exit 2, as an empty file; a cut is claimed from 7 bytes on."""
    path = record(tmp_path / "run.rec", 3)
    path.write_bytes(path.read_bytes()[:keep])
    assert path.read_bytes() == b"FLOWTOP"[:keep]
    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(path), "--json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr == f"flowtop: {path} is not a flowtop recording (bad header)\n"


def test_a_file_that_is_no_header_prefix_stays_not_a_recording_and_an_empty_one_too(tmp_path: Path) -> None:
    """First bytes that are not a header's first (a near miss, other text) stay "not a flowtop
    recording", exit 2; an empty file (a monitor killed before its first write, or any empty file:
    nothing says it is a recording) stays an error, exit 2, with its own words."""
    path = tmp_path / "x.rec"
    cmd = [sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(path), "--json"]
    for text in (b"FLOWTOP-RX", b"GIF89a", b"FLOWTOP_REC 2\n"):
        path.write_bytes(text)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert (out.returncode, out.stdout) == (2, ""), out.stderr
        assert out.stderr == f"flowtop: {path} is not a flowtop recording (bad header)\n"
    path.write_bytes(b"")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr == f"flowtop: {path} is empty: the monitor that wrote it stopped before writing anything\n"


def test_snapshot_replay_until_done_of_ranks_not_done_exits_3(tmp_path: Path) -> None:
    """A whole recording whose rank had not finished when it ended is not the run's end either:
    --until-done exits 3 (as a live snapshot's timeout) with the snapshot printed; with the rank's
    bye recorded, 0."""
    path = record(tmp_path / "run.rec", 5)
    cmd = [sys.executable, "-m", "flowtop.cli", "snapshot", "--replay", str(path), "--until-done", "--json"]
    going = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert going.returncode == 3, going.stderr
    assert going.stderr == ("flowtop: --until-done: not every rank had finished when the recording ends; the "
                            "output shows them as they were\n"
                            "flowtop: --until-done: j: rank 0 live\n")  # steps a second apart, closed 0.5 s after the last
    assert [r["step"] for r in json.loads(going.stdout)["jobs"][0]["ranks"]] == [5]
    rec = Recorder(tmp_path / "done.rec")
    for i in range(5):
        rec.write(10.0 + i, step(i))
    rec.write(15.0, wire.encode("bye", KEY, 5, 1.0, {"reason": "exit", "steps": 5, "drops": 0}))
    rec.close(now=15.5)
    done = subprocess.run(cmd[:5] + [str(tmp_path / "done.rec")] + cmd[6:], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_a_whole_recording_replays_to_when_its_monitor_closed_it(tmp_path: Path) -> None:
    """Steps at 10-14 s, then silence until the monitor closed the recording at 40 s: live, the
    rank read stale at the end (no frame for 26 s, past the 5 s limit); the replay ends there too,
    not at its last frame, where the rank looked live (a new user's trial: a crashed job replayed
    as running at 25 % MFU). Cut (no marker), the replay ends at its last frame: later is unknown."""
    rec = Recorder(tmp_path / "run.rec")
    for i in range(5):
        rec.write(10.0 + i, step(i))
    rec.close(now=40.0)
    snap = replay_all(tmp_path / "run.rec", make_model())
    (r,) = snap.jobs[0].ranks
    assert (snap.taken_at, r.step, r.status) == (30.0, 5, "stale")  # recorded time: 40 s - the first frame's 10 s
    data = (tmp_path / "run.rec").read_bytes()
    (tmp_path / "cut.rec").write_bytes(data[:offsets(data)[-1]])
    snap = replay_all(tmp_path / "cut.rec", make_model())
    (r,) = snap.jobs[0].ranks
    assert (snap.taken_at, r.step, r.status) == (4.0, 5, "live")


def test_a_flipped_bit_in_a_float_is_caught_with_its_place(tmp_path: Path) -> None:
    """One bit of record 3's step time flipped: the record still decodes (msgpack has no
    checksum), and was replayed as truth."""
    path = record(tmp_path / "flip.rec", 6)
    data = bytearray(path.read_bytes())
    third, fourth = offsets(bytes(data))[2:4]
    at = data.index(b"\xcb" + struct.pack(">d", 0.1), third)  # wall_s, a msgpack float64
    assert at < fourth
    data[at + 8] ^= 0x01  # its mantissa's last bit
    t, frame = msgpack.unpackb(bytes(data[third + 8:fourth]))
    assert t == 2.0 and wire.decode(frame).fields["wall_s"] == 0.1 + 2 ** -56  # what was replayed before
    path.write_bytes(data)
    said: list[str] = []
    assert [t for t, _ in read_recording(path, said.append)] == [0.0, 1.0]
    assert said == [f"recording {path} has a checksum mismatch at record 3 (byte {third}): replayed up to it "
                    "(2 frames, 1.0 s recorded); its bytes changed after they were written (a disk or a copy "
                    "went wrong), so nothing after it is replayed"]
    model = make_model()
    assert replay_all(path, model).jobs[0].ranks[0].step == 2
    assert [n.text for n in model.notices.take()] == said


def test_a_version_1_file_replays_its_frames_exactly(tmp_path: Path) -> None:
    """The layout before the marker (a 4-byte length, no checksum): read as before, with one note
    that says no more than is known."""
    frames = [(0.0, step(0)), (0.5, step(1)), (1.25, step(2, wall_s=0.3))]
    data = b"FLOWTOP-REC 1\n" + b"".join(
        len(body).to_bytes(4, "big") + body for body in (msgpack.packb([t, f], use_bin_type=True) for t, f in frames))
    path = tmp_path / "v1.rec"
    path.write_bytes(data)
    said: list[str] = []
    notes: list[str] = []
    assert list(read_recording(path, said.append, notes.append)) == frames
    assert said == [] and notes == [f"recording {path} was written by an older flowtop (format 1, no end marker): "
                                    "whether it ended cleanly is not known"]
    model = make_model()
    assert replay_all(path, model).jobs[0].ranks[0].step == 3
    assert [(n.severity, n.text) for n in model.notices.take()] == [("information", notes[0])]
    path.write_bytes(data[:-3])  # cut in its last record: that is said, the note is not
    said, notes = [], []
    assert list(read_recording(path, said.append, notes.append)) == frames[:2] and notes == []
    third = 4 + len(msgpack.packb(list(frames[2]), use_bin_type=True))  # the cut record: its length, its body
    assert said == [f"recording {path} is cut short in its record at byte {len(data) - third}, after 2 "
                    "frames (0.5 s recorded): what came after is missing, so its ranks look as they were then"]


def test_a_gzipped_recording_reads_as_it_is(tmp_path: Path) -> None:
    path = record(tmp_path / "run.rec", 6)
    data = path.read_bytes()
    gz = tmp_path / "run.rec.gz"
    gz.write_bytes(gzip.compress(data))
    said: list[str] = []
    assert list(read_recording(gz, said.append)) == list(read_recording(path)) and said == []
    gz.write_bytes(gzip.compress(data[:offsets(data)[-1]]))  # whole, without its marker
    assert len(list(read_recording(gz, said.append))) == 6 and said == [no_marker(gz, 6, 5)]
    said = []
    gz.write_bytes(gzip.compress(data)[:-4])  # the gzip trailer cut: every record whole, marker too
    assert len(list(read_recording(gz, said.append))) == 6
    assert len(said) == 1 and "compressed copy is damaged after the end marker" in said[0], said


FULL = """
import json, resource, signal, sys
from flowtop.monitor.collector import Collector
from flowtop.monitor.model import Model
from flowtop.monitor.recording import Recorder
from probe import wire

path, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
collector = Collector(Model(), "tcp://127.0.0.1:1", recorder=Recorder(path))
key, seq = wire.RankKey("j", "h", 1, 0, 0), 1000
while collector.recorder is not None:
    fields = {"step": seq, "wall_s": 0.1, "tokens": 10, "drops": 0}
    collector.handle_frame(wire.encode("step", key, seq, 1.0, fields), collector.clock.now())
    seq += 1
print(json.dumps([n.text for n in collector.notices.take()]))
"""


def test_a_recording_stopped_by_a_full_file_says_why_in_its_marker(tmp_path: Path) -> None:
    """The file cannot grow past 20,000 bytes (RLIMIT_FSIZE, as a full disk): the write that fails
    is cut back to the last whole record, and the marker that closes the file says why."""
    path, limit = tmp_path / "full.rec", 20_000
    out = subprocess.run([sys.executable, "-c", FULL, str(path), str(limit)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    # Every record the same size (seq and step from 1,000: 3-byte ints); 8 KiB gathered per write.
    frame = wire.encode("step", KEY, 1000, 1.0, {"step": 1000, "wall_s": 0.1, "tokens": 10, "drops": 0})
    size = 8 + len(msgpack.packb([0.5, frame], use_bin_type=True))
    first, later = math.ceil((8192 - HEAD) / size), math.ceil(8192 / size)
    written = first + later * ((limit - HEAD - first * size) // (later * size))  # the writes that fit
    data = path.read_bytes()
    assert offsets(data)[-1] == HEAD + written * size  # the whole records, then the marker
    said: list[str] = []
    got = list(read_recording(path, said.append))
    assert len(got) == written
    (text,) = said
    assert text.startswith(f"recording {path} stopped early after {written} frames (")
    assert text.endswith("s recorded): OSError: [Errno 27] File too large; the run may have gone on after that, "
                         "so its ranks look as they were then")
    assert json.loads(out.stdout) == [f"recording to {path} stopped after {written} frames: OSError: [Errno 27] "
                                      "File too large; monitoring goes on"]


@pytest.mark.parametrize("command", ["snapshot", "serve"])
def test_a_closed_terminal_still_closes_a_headless_recording(tmp_path: Path, command: str) -> None:
    """SIGHUP (an SSH session dropped) killed ``flowtop snapshot --record`` and ``flowtop serve
    --record`` before they closed their recording: no end marker. It now ends them as SIGTERM does."""
    import signal

    port, path = free_port_pair(), tmp_path / "hup.rec"
    metrics = f"127.0.0.1:{free_port_pair()}"
    extra = ["--timeout", "60", "--json"] if command == "snapshot" else ["--prometheus", metrics]
    # SIGHUP as a terminal leaves it: a test run under nohup (CI's) would pass it on ignored, and
    # an ignored SIGHUP rightly stays ignored.
    proc = subprocess.Popen([sys.executable, "-m", "flowtop.cli", command, "--listen", f"tcp://127.0.0.1:{port}",
                             "--record", str(path), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 30
        while True:  # bound: its signal handlers are in place before the bind
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a failed run must not leave a monitor behind
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    said: list[str] = []
    assert list(read_recording(path, said.append)) == [] and said == []
    (end,) = bodies(path.read_bytes())
    assert end[1] == "end" and (end[2]["frames"], end[2]["why"]) == (0, "")


def test_a_gzipd_file_cut_after_bytes_that_start_no_recording_is_not_a_recording(tmp_path: Path) -> None:
    """A .gz stream of b"XYZ..." cut after its 3rd decompressed byte: those bytes already say it is
    no recording (as an uncompressed file's would), not "cut short: not known to be a recording"."""
    gz = tmp_path / "x.rec.gz"
    packed = gzip.compress(b"XYZ" + b"\0" * 400, compresslevel=0)
    said = []
    for cut in range(len(packed) - 4, 10, -1):  # from most of the stream down to its first bytes
        gz.write_bytes(packed[:cut])
        try:
            list(read_recording(gz))
        except Exception as exc:  # noqa: BLE001
            said.append(str(exc))
    before_any = f"{gz} is a compressed file cut short before its first byte: not known to be a recording"
    assert said and set(said) <= {f"{gz} is not a flowtop recording (bad header)", before_any}
    assert f"{gz} is not a flowtop recording (bad header)" in said
    assert all("at byte" not in s for s in said)
