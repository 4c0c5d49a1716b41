"""Step records as columns (wire MINOR 3, probe.wire.steps): what a ``stepcols`` frame carries,
what the monitor refuses, and that every step frame kind gives the model the same steps."""

from __future__ import annotations

import math
import struct

import msgpack
import pytest

from flowtop.monitor.model import Model
from probe import wire
from probe.wire import RankKey, WireError
from probe.wire.steps import encode_fields

KEY = RankKey("job-1", "host-a", 4242, 3, 1)
RECORDS = [
    {"step": 11, "wall_s": 0.001, "tokens": 64, "drops": 0},
    {"step": 12, "wall_s": 0.0012, "device_s": 0.0011, "tokens": 64, "input_wait_s": 1e-4, "lead_s": 8e-4,
     "probe_s": 1e-5, "drops": 0, "commands_refused": 1, "commands_dropped": 250},
    {"step": 13, "wall_s": 0.0013, "tokens": 60, "input_wait_s": 0.0, "stage_s": 5e-4, "drops": 0},
]


def _frame(**over: object) -> bytes:
    body = {**encode_fields(RECORDS, 7), **over}
    return wire.encode("stepcols", KEY, 5, 100.0, {k: v for k, v in body.items() if v is not ...})


def test_columns_round_trip_every_value_and_which_were_not_sent() -> None:
    msg = wire.decode(wire.encode_steps(KEY, 5, 100.0, RECORDS, 7))
    cols = msg.steps
    assert msg.kind == "stepcols" and msg.key == KEY and msg.seq == 5 and cols is not None
    assert list(cols.step) == [11, 12, 13] and list(cols.tokens) == [64, 64, 60]
    assert list(cols.wall_s) == [0.001, 0.0012, 0.0013]  # float64: exact
    assert math.isnan(cols.input_wait_s[0]) and list(cols.input_wait_s)[1:] == [1e-4, 0.0]  # 0.0 was sent
    assert cols.device_s == 0.0011 and cols.drops == 7 and cols.commands_refused == 1 and cols.commands_dropped == 250
    assert wire.records(msg) == [
        {"step": 11, "wall_s": 0.001, "tokens": 64},
        {"step": 12, "wall_s": 0.0012, "tokens": 64, "input_wait_s": 1e-4, "lead_s": 8e-4, "probe_s": 1e-5},
        {"step": 13, "wall_s": 0.0013, "tokens": 60, "input_wait_s": 0.0, "stage_s": 5e-4},
    ]


def test_a_column_no_record_has_is_not_sent() -> None:
    body = encode_fields([RECORDS[0]], 0)
    assert set(body) == {"n", "drops", "step", "wall_s", "tokens"}
    # 3 columns of 8 bytes: a one-record frame stays small
    assert len(wire.encode_steps(KEY, 1, 1.0, [RECORDS[0]], 0)) < 140


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"n": 0}, "bad value for 'n'"),
        ({"n": wire.MAX_BATCH + 1}, "bad value for 'n'"),
        ({"n": 2}, "bad column 'step'"),  # 3 values sent, 2 announced
        ({"wall_s": b"\x00" * 8}, "bad column 'wall_s'"),
        ({"tokens": "abc"}, "bad column 'tokens'"),
        ({"step": struct.pack("<3q", 11, 13, 12)}, "must increase"),
        ({"step": struct.pack("<3q", 11, 11, 12)}, "must increase"),
        ({"step": struct.pack("<3q", -3, 1, 2)}, "non-negative"),
        ({"tokens": struct.pack("<3q", 1, -1, 2)}, "non-negative"),
        ({"wall_s": struct.pack("<3d", 0.1, float("nan"), 0.1)}, "bad column 'wall_s'"),
        ({"wall_s": struct.pack("<3d", 0.1, float("inf"), 0.1)}, "bad column 'wall_s'"),
        ({"wall_s": struct.pack("<3d", 0.1, -0.5, 0.1)}, "bad column 'wall_s'"),
        ({"wall_s": struct.pack("<3d", 0.1, 2e7, 0.1)}, "bad column 'wall_s'"),
        ({"lead_s": struct.pack("<3d", float("nan"), float("inf"), 0.1)}, "bad column 'lead_s'"),
        ({"probe_s": struct.pack("<3d", float("nan"), -1.0, 0.1)}, "bad column 'probe_s'"),
        ({"drops": ...}, "bad value for 'drops'"),
        ({"drops": True}, "bad value for 'drops'"),
        ({"commands_refused": -1}, "bad value for 'commands_refused'"),
        ({"commands_dropped": -1}, "bad value for 'commands_dropped'"),
        ({"device_s": "0.1"}, "bad value for 'device_s'"),
        ({"device_s": float("nan")}, "bad value for 'device_s'"),
    ],
)
def test_bad_columns_are_refused_with_the_reason(over: dict, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        wire.decode(_frame(**over))


@pytest.mark.parametrize(
    ("steps", "ok"),
    [
        ((11, 12, 13, 14), True),  # consecutive: the range compare
        ((11, 15, 90, 2**40), True),  # gaps (records dropped by the probe's queue)
        ((11, 13, 12, 14), False),  # as many apart as consecutive ones, out of order
        ((11, 12, 12, 14), False),
        ((14, 13, 12, 11), False),
        ((11, 12, 13, 13), False),
        ((5, 5), False),
        ((5, 6), True),
        ((11, 13, 14, 15), True),  # a gap at the first pair: the pairwise test
        ((7,), True),
        (tuple(range(10**12, 10**12 + 200)), True),  # consecutive past the small ints, a 2 s pace's frame
        (tuple(range(10**12, 10**12 + 99)) + (10**12 + 100, 10**12 + 99) + tuple(range(10**12 + 101, 10**12 + 200)),
         False),  # as many apart as consecutive ones, one pair swapped
        ((2**62, 2**62 + 1, 2**62 + 2), True),
    ],
)
def test_step_numbers_must_strictly_increase(steps: tuple[int, ...], ok: bool) -> None:
    records = [{"step": s, "wall_s": 0.001, "tokens": 64} for s in steps]
    frame = wire.encode("stepcols", KEY, 5, 100.0, encode_fields(records, 0))
    if ok:
        assert list(wire.decode(frame).steps.step) == list(steps)
    else:
        with pytest.raises(WireError, match="must increase"):
            wire.decode(frame)


def test_an_envelope_is_checked_on_the_fast_path_too() -> None:
    good = msgpack.unpackb(_frame())
    wire.decode(msgpack.packb(good))  # its key is now known: a bool or float equal to a field must not pass
    for field, bad in (("job", "a\x1b[2J"), ("rank", -1), ("pid", 2**40), ("seq", -1), ("t", float("nan")),
                       ("inc", True), ("pid", 4242.0), ("rank", 3.0)):
        with pytest.raises(WireError, match=f"bad envelope field '{field}'"):
            wire.decode(msgpack.packb({**good, field: bad}))
    assert wire.decode(msgpack.packb(good)).key is wire.decode(msgpack.packb(good)).key  # one key object


def _steps_of(model: Model) -> list[tuple]:
    (st,) = model.ranks.values()
    return ([r for r in st.steps.recent(100)], st.drops, (st.commands_refused, st.commands_dropped), st.device_s,
            list(st.probe_s), list(st.stage_s))


def test_every_step_frame_kind_gives_the_model_the_same_steps() -> None:
    """The same records as one stepcols frame, one steps (MINOR 2) frame and three step frames."""
    frames = {
        "stepcols": [wire.encode_steps(KEY, 1, 1.0, RECORDS, 0)],
        "steps": [wire.encode("steps", KEY, 1, 1.0, {"records": RECORDS})],
        "step": [wire.encode("step", KEY, i + 1, 1.0, r) for i, r in enumerate(RECORDS)],
    }
    seen = {}
    for kind, fs in frames.items():
        model = Model()
        for f in fs:
            model.ingest(wire.decode(f), 50.0)
        seen[kind] = _steps_of(model)
    assert seen["stepcols"] == seen["steps"] == seen["step"]
    recs, drops, refused, device, probe_s, stage_s = seen["stepcols"]
    assert recs == [(11, 0.001, 64, None, 50.0, None), (12, 0.0012, 64, 1e-4, 50.0, 8e-4), (13, 0.0013, 60, 0.0, 50.0, None)]
    assert (drops, refused, device, probe_s, stage_s) == (0, (1, 250), 0.0011, [1e-5], [5e-4])


WHOLE = [{"step": 20 + i, "wall_s": 0.001 * (i + 1), "tokens": 64, "input_wait_s": 1e-4 * i, "lead_s": 8e-4,
          "probe_s": 1e-5 * (i + 1), "stage_s": 5e-4, "drops": 0} for i in range(70)]


def test_a_frame_whose_columns_are_whole_says_so_and_is_applied_as_the_records_are() -> None:
    """Every record sent every column: the decode says the columns are finite (the model then
    skips its NaN checks) and the model holds what the same records give one by one."""
    whole = wire.decode(wire.encode_steps(KEY, 1, 1.0, WHOLE, 0)).steps
    assert whole is not None and whole.finite
    some = wire.decode(wire.encode_steps(KEY, 1, 1.0, RECORDS, 0)).steps
    assert some is not None and not some.finite  # a NaN where a record did not send a column
    seen = []
    for frames in ([wire.encode_steps(KEY, 1, 1.0, WHOLE, 0)],
                   [wire.encode("step", KEY, i + 1, 1.0, r) for i, r in enumerate(WHOLE)]):
        model = Model()
        for f in frames:
            model.ingest(wire.decode(f), 50.0)
        seen.append(_steps_of(model))
    assert seen[0] == seen[1]
    recs, _, _, _, probe_s, stage_s = seen[0]
    assert recs[-1] == (89, 0.07, 64, 1e-4 * 69, 50.0, 8e-4) and len(recs) == 70
    assert probe_s[-1] == 1e-5 * 70 and stage_s[-1] == 5e-4


def test_records_at_or_before_the_newest_step_are_not_applied_twice() -> None:
    model = Model()
    model.ingest(wire.decode(wire.encode_steps(KEY, 1, 1.0, RECORDS[:2], 0)), 50.0)
    model.ingest(wire.decode(wire.encode_steps(KEY, 2, 1.0, RECORDS[1:], 0)), 51.0)  # step 12 again, then 13
    (st,) = model.ranks.values()
    assert [r[0] for r in st.steps.recent(10)] == [11, 12, 13] and st.step == 13
    assert [r[4] for r in st.steps.recent(10)] == [50.0, 50.0, 51.0]


def test_a_frame_longer_than_a_block_rolls_the_ring() -> None:
    """150 records in one frame (more than two 64-value blocks) keep every value in order."""
    recs = [{"step": s, "wall_s": s / 1000, "tokens": s, "drops": 0, "lead_s": (None if s % 3 else 0.5)}
            for s in range(1, 151)]
    model = Model()
    model.ingest(wire.decode(wire.encode_steps(KEY, 1, 1.0, recs, 0)), 9.0)
    (st,) = model.ranks.values()
    got = st.steps.recent(200)
    assert len(st.steps) == 150 and len(got) == 128  # RECENT keeps every field of the last 128
    assert got == [(s, s / 1000, s, None, 9.0, None if s % 3 else 0.5) for s in range(23, 151)]


def test_frames_refused_after_their_envelope_leave_no_key_behind() -> None:
    """The key cache holds keys of frames that decoded whole: 500 forged byes without a reason
    (refused) add none; a valid frame's key is then the one object every later frame gets."""
    before = len(wire._KEYS)
    for i in range(500):
        body = {"v": [wire.MAJOR, wire.MINOR], "k": "bye", "job": f"forged-{i}", "rank": 0, "host": "x" * 200,
                "pid": 1, "inc": 0, "seq": 0, "t": 1.0, "steps": 0, "drops": 0}
        with pytest.raises(WireError, match="missing field 'reason'"):
            wire.decode(msgpack.packb(body))
    assert len(wire._KEYS) == before
    a = wire.decode(wire.encode_steps(RankKey("kept", "h", 9, 0, 0), 1, 1.0, RECORDS, 0)).key
    assert wire.decode(wire.encode_steps(RankKey("kept", "h", 9, 0, 0), 2, 1.0, RECORDS, 0)).key is a


def test_a_stale_frame_changes_nothing_and_the_limits_hold_per_value() -> None:
    model = Model()
    newer = [{**r, "step": r["step"] + 10, "device_s": 0.002} for r in RECORDS]
    model.ingest(wire.decode(wire.encode_steps(KEY, 1, 1.0, newer, 3)), 50.0)
    model.ingest(wire.decode(wire.encode_steps(KEY, 2, 1.0, RECORDS, 9)), 51.0)  # steps 11-13: all seen
    (st,) = model.ranks.values()
    assert st.step == 23 and st.device_s == 0.002 and st.drops == 3  # the stale frame's totals are old
    # each value is held to the single-step schema's limit, not their sum
    big = [{"step": s, "wall_s": 5e6, "tokens": 1, "drops": 0} for s in (1, 2, 3)]
    assert list(wire.decode(wire.encode_steps(KEY, 3, 1.0, big, 0)).steps.wall_s) == [5e6] * 3
    # a nil optional column is an absent one
    msg = wire.decode(wire.encode("stepcols", KEY, 4, 1.0, {**encode_fields(RECORDS[:1], 0), "lead_s": None}))
    assert msg.steps.lead_s is None


def test_array_seq_of_many_values_indexes_across_blocks() -> None:
    from flowtop.monitor.compact import ArraySeq

    seq = ArraySeq.of("d", [float(i) for i in range(150)])
    assert seq[70] == 70.0 and seq[-1] == 149.0 and list(seq[64:70]) == [64.0, 65.0, 66.0, 67.0, 68.0, 69.0]
    assert len(seq) == 150 and tuple(seq) == tuple(float(i) for i in range(150))


@pytest.mark.parametrize("value, ok", [
    (0.0, True), (-0.0, True), (5e-324, True), (0.02, True), (1e7, True),  # 1e7: MAX_SECONDS itself
    (math.nextafter(2.0**17, 0), True), (2.0**17, True),  # either side of the high-byte fast path
    (math.nextafter(1e7, math.inf), False), (-5e-324, False), (-1.0, False),
    (math.inf, False), (-math.inf, False), (math.nan, False),
])
def test_seconds_columns_accept_exactly_finite_seconds_up_to_the_limit(value: float, ok: bool) -> None:
    # Every float column is checked at once by the values' high bytes, then by their bit patterns
    # (steps._all_seconds), and column
    # by column where that says "look closer" (-0.0 and NaN read large): the verdict is the rule's,
    # 0 <= value <= MAX_SECONDS and finite, at the edges too; NaN in an optional column is a
    # record that did not send the field.
    assert wire.steps.MAX_SECONDS == 1e7
    for column, nan_ok in (("wall_s", False), ("lead_s", True)):
        frame = _frame(**{column: struct.pack("<3d", 0.1, value, 0.1)})
        if ok or (nan_ok and math.isnan(value)):
            got = getattr(wire.decode(frame).steps, column)[1]
            assert got == value or (math.isnan(value) and math.isnan(got))
        else:
            with pytest.raises(WireError, match=f"bad column '{column}'"):
                wire.decode(frame)
