"""Wire schema: round trips, and every kind of bad frame rejected with a reason."""

from __future__ import annotations

import socket
import time

import msgpack
import pytest

from probe import wire
from probe.wire import RankKey, WireError

KEY = RankKey("job-1", "host-a", 4242, 3, 1)

GOOD = {
    "hello": {"local_rank": 1, "world_size": 8, "device": "NVIDIA H200", "probe_version": "0.1.0", "argv": ["train.py"]},
    "step": {"step": 10, "wall_s": 0.2, "device_s": 0.19, "dstep": 8, "tokens": 4096, "input_wait_s": 0.01,
             "probe_s": 1e-5, "drops": 0},
    "bye": {"reason": "exit", "steps": 10, "drops": 2},
    "flops": {"step": 2, "model_flops": 1.5e12, "executed_flops": 1.6e12, "estimated_flops": 1.4e12,
              "estimate_source": "6N+12LdT", "attention": "full", "dtype": "bf16", "peak_flops": 989.4e12,
              "peak_source": "NVIDIA H200 datasheet", "uncounted": {"aten::foo": 3}, "tokens": 4096},
    "kernels": {"window": 1, "step": 40, "device": "cuda", "step_dur_us": 6800.0, "names": ["k0", "aten::mm"],
                "events": [[0, 0, 1.0, 2.5, 7, 1, 1e6], [1, 3, 0.0, 10.0, -1, -1, -1]]},
    "telemetry": {"gpu": {"gpu_util": 100, "throttle": ["sw_power_cap"], "tensor_active": None},
                  "proc": {"rss_bytes": 123}, "reasons": {"tensor_active": "GPM unsupported"}},
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_round_trip_every_kind(kind: str) -> None:
    frame = wire.encode(kind, KEY, 17, 1234.5, GOOD[kind])
    msg = wire.decode(frame)
    assert msg.kind == kind and msg.key == KEY and msg.seq == 17 and msg.sent_at == 1234.5
    assert dict(msg.fields) == GOOD[kind]


def test_kinds_cover_schema() -> None:
    assert set(GOOD) == set(wire.KINDS)


def _raw(**over: object) -> bytes:
    body = {"v": [wire.MAJOR, 0], "k": "step", "job": "j", "rank": 0, "host": "h", "pid": 1, "inc": 0, "seq": 0,
            "t": 1.0, **GOOD["step"]}  # fmt: skip
    body.update(over)
    return msgpack.packb({k: v for k, v in body.items() if v is not ...})


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "not msgpack"),
        (b"\xc1garbage", "not msgpack"),
        (msgpack.packb([1, 2, 3]), "top level is not a map"),
        (_raw()[:-5], "not msgpack"),
        (_raw(v=[wire.MAJOR + 1, 0]), "unsupported major version"),
        (_raw(v="1.0"), "malformed version"),
        (_raw(k="pickle"), "unknown kind"),
        (_raw(rank=-1), "bad envelope field 'rank'"),
        (_raw(job=...), "missing envelope field 'job'"),
        (_raw(step="10"), "bad value for 'step'"),
        (_raw(wall_s=float("nan")), "bad value for 'wall_s'"),
        (_raw(wall_s=True), "bad value for 'wall_s'"),
        (_raw(tokens=...), "missing field 'tokens'"),
        (msgpack.packb({1: 2}), "not msgpack"),  # strict_map_key rejects int keys
        (b"\x00" * (wire.MAX_FRAME_BYTES + 1), "exceeds"),
    ],
)
def test_bad_frames_rejected_with_reason(frame: bytes, reason: str) -> None:
    with pytest.raises(WireError) as err:
        wire.decode(frame)
    assert reason in str(err.value)


def test_newer_minor_and_unknown_optional_fields_accepted() -> None:
    msg = wire.decode(_raw(v=[wire.MAJOR, 9], future_field={"x": 1}))
    assert msg.kind == "step" and "future_field" not in msg.fields


def test_control_round_trip_and_rejection() -> None:
    assert wire.decode_control(wire.encode_control("kernels_now", "j", 2)) == ("kernels_now", "j", 2)
    with pytest.raises(WireError):
        wire.decode_control(msgpack.packb({"v": [1, 0], "k": "control", "cmd": "rm -rf", "job": "j", "rank": 0}))


def test_collector_survives_hostile_traffic(monitor) -> None:
    """Raw TCP garbage, malformed and wrong-version frames over real sockets."""
    import zmq

    host, port = monitor.listen.rsplit(":", 1)
    # 1. Raw bytes that are not ZMTP at all.
    with socket.create_connection(("127.0.0.1", int(port))) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)) * 20)
        time.sleep(0.2)
    # 2. Well-formed ZeroMQ frames with bad content, then a good one.
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.connect(monitor.listen)
    time.sleep(0.5)  # subscription propagation
    for frame in (b"junk", _raw(v=[9, 0]), _raw(k="x"), msgpack.packb({"v": [1, 0]})):
        pub.send(frame)
    pub.send(wire.encode("step", KEY, 0, time.time(), GOOD["step"]))
    snap = monitor.wait_for(lambda s: s.received >= 1 and s.rejected >= 4, 10)
    pub.close(0)
    ctx.term()
    assert snap.rejected == 4
    assert snap.received == 1
    assert snap.jobs[0].ranks[0].step == 10
    assert any("unsupported major version" in r for r in snap.rejected_reasons)
