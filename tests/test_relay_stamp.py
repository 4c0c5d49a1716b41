"""A relay batch's stamp: every refusal's reason, and the frames' times Relays.stamp_times gives
(its checks and its min and max are written out for speed: bench/frame_path.py)."""

from __future__ import annotations

import math
import random

import msgpack
import pytest

from flowtop.monitor.relays import DRIFT, MAX_STAMP_BYTES, Relays, Stamp, decode_stamp, encode_stamp
from probe.wire import WireError

GOOD = {"k": "stamp", "r": "node1:42:00000001", "c": 1000.5, "a": [0, 1500]}


def _with(**changes: object) -> bytes:
    return msgpack.packb({**GOOD, **changes})


@pytest.mark.parametrize("raw, frames, reason", [
    (b"\x00" * (MAX_STAMP_BYTES + 1), 2, f"relay stamp of {MAX_STAMP_BYTES + 1} bytes exceeds {MAX_STAMP_BYTES}"),
    (b"\xc1", 2, "relay stamp: not msgpack: FormatError"),
    (msgpack.packb({1: 2}), 2, "relay stamp: not msgpack: ValueError"),  # strict_map_key, msgpack's default
    (msgpack.packb([GOOD]), 2, "multi-part message without a relay stamp first"),
    (_with(k="stamps"), 2, "multi-part message without a relay stamp first"),
    (_with(r=""), 2, "relay stamp: bad relay id"),
    (_with(r="r" * 301), 2, "relay stamp: bad relay id"),
    (_with(r="a\x1bb"), 2, "relay stamp: bad relay id"),
    (_with(r=b"bytes"), 2, "relay stamp: bad relay id"),
    (_with(c=True), 2, "relay stamp: bad clock"),
    (_with(c="1"), 2, "relay stamp: bad clock"),
    (_with(c=None), 2, "relay stamp: bad clock"),
    (_with(c=math.nan), 2, "relay stamp: bad clock"),
    (_with(c=math.inf), 2, "relay stamp: bad clock"),
    (_with(c=-0.5), 2, "relay stamp: bad clock"),
    (_with(a=None), 2, "relay stamp: no ages for 2 frames"),
    (_with(a=[0]), 2, "relay stamp: 1 ages for 2 frames"),
    (_with(a=[0, True]), 2, "relay stamp: bad age"),
    (_with(a=[0, 1.0]), 2, "relay stamp: bad age"),
    (_with(a=[-1, 0]), 2, "relay stamp: bad age"),
    (_with(a=[0, 10**12 + 1]), 2, "relay stamp: bad age"),
])
def test_refusals(raw: bytes, frames: int, reason: str) -> None:
    with pytest.raises(WireError) as exc:
        decode_stamp(raw, frames)
    assert str(exc.value) == reason
    with pytest.raises(WireError) as again:
        Relays().stamp_times(raw, frames, 2000.0)
    assert str(again.value) == reason


def test_valid() -> None:
    assert decode_stamp(_with(c=7, a=[0, 10**12]), 2) == Stamp("node1:42:00000001", 7.0, (0, 10**12))


def test_times_as_min_and_max_give_them() -> None:
    """Each frame at the relay's clock mapped by the least-queued offset (creeping up by DRIFT),
    never in the future, never before the relay's previous frame."""
    rng = random.Random(3)
    relays = Relays()
    offset, offset_at, last_t = None, 0.0, -math.inf
    now = 5000.0
    for _ in range(2000):
        now += rng.random() * 0.05
        taken = rng.choice([None, now - 0.01, now + rng.random() * 0.2])
        clock = now - 4000.0 - rng.random() * rng.choice([0.001, 0.5, 3.0])
        ages = [rng.randrange(0, 3_000_000) for _ in range(rng.randrange(1, 5))]
        relay, times = relays.stamp_times(encode_stamp("r", clock, ages), len(ages), now, taken)
        observed = (now if taken is None else max(now, taken)) - clock
        offset = observed if offset is None else min(offset + DRIFT * max(0.0, now - offset_at), observed)
        offset_at = now
        want = []
        for age in ages:
            last_t = min(now, max(last_t, clock + offset - age * 1e-6))
            want.append(last_t)
        assert (relay, times) == ("r", want)
        assert relays.lag_of("r") == observed - offset


def test_two_stamps_worked_by_hand() -> None:
    """First batch: taken by the monitor at 2000.0, stamped 1000.5 on the relay's clock, its two
    frames received 1,500 µs and 0 µs before: the offset is 2000.0 - 1000.5 = 999.5, the frames at
    1000.5 + 999.5 - 0.0015 = 1999.9985 and 2000.0, lag 0. Second batch 1.0 s later at 2001.0,
    stamped 1001.0: observed 1000.0, the least offset crept by DRIFT (1e-4 a second) over 1.0 s is
    999.5001, so the frame is at 1001.0 + 999.5001 = 2000.5001 and the link lagged 0.4999 s. A
    third at 2002.0 stamped 1131.5: observed 870.5, 999.5001 - 870.5 = 129.0 s ahead of that
    mapping, past MAX_CLOCK_LEAD_S (120 s): refused."""
    relays = Relays()
    assert relays.stamp_times(encode_stamp("r", 1000.5, [1500, 0]), 2, 2000.0) == ("r", [1999.9985, 2000.0])
    assert relays.lag_of("r") == 0.0
    relay, (t,) = relays.stamp_times(encode_stamp("r", 1001.0, [0]), 1, 2001.0)
    assert relay == "r" and t == pytest.approx(2000.5001, abs=1e-9)
    assert relays.lag_of("r") == pytest.approx(0.4999, abs=1e-9)
    with pytest.raises(WireError, match="clock 129 s ahead"):
        relays.stamp_times(encode_stamp("r", 1131.5, [0]), 1, 2002.0)
