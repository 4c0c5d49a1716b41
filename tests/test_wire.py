"""Wire schema: round trips, and every kind of bad frame rejected with a reason."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import msgpack
import pytest

from probe import wire
from probe.wire import RankKey, WireError

KEY = RankKey("job-1", "host-a", 4242, 3, 1)

GOOD = {
    "hello": {"local_rank": 1, "world_size": 8, "device": "NVIDIA H200", "probe_version": "0.1.0", "argv": ["train.py"]},
    "step": {"step": 10, "wall_s": 0.2, "device_s": 0.19, "dstep": 8, "tokens": 4096, "input_wait_s": 0.01,
             "probe_s": 1e-5, "drops": 0},
    "steps": {"records": [
        {"step": 11, "wall_s": 0.001, "tokens": 64, "drops": 0},
        {"step": 12, "wall_s": 0.0012, "device_s": None, "tokens": 64, "input_wait_s": 1e-4, "lead_s": 8e-4,
         "micro_batches": 1, "probe_s": 1e-5, "drops": 0, "commands_refused": 1}]},
    "bye": {"reason": "exit", "steps": 10, "drops": 2},
    "flops": {"step": 2, "model_flops": 1.5e12, "executed_flops": 1.6e12, "estimated_flops": 1.4e12,
              "estimate_source": "6N+12LdT", "attention": "full", "dtype": "bf16", "peak_flops": 989.4e12,
              "peak_source": "NVIDIA H200 datasheet", "uncounted": {"aten::foo": 3}, "tokens": 4096},
    "kernels": {"window": 1, "step": 40, "device": "cuda", "step_dur_us": 6800.0, "typical_step_us": 6500.0,
                "cost_s": 0.002, "names": ["aten::mm", "cudaLaunchKernel", "nvjet_gemm", "aten::conv2d"],
                "ops": [[0, 7, 0.0, 10.0, 5, [[32, 64], [64, 16]], [None, None]],
                        [3, 7, 11.0, 20.0, 6, [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], []],
                         [None, None, None, [1, 1], [0], [1, 1], 1, 0.5, True, "same", [True, False]]],
                        [0, 7, 21.0, 22.0, 0, None, None]],
                "acts": [[1, 4, 1.0, 3.0, -1, 5, 11], [2, 0, 4.0, 9.5, 7, 5, 11], [2, 2, 9.5, 9.6, 7, 0, 12]]},
    "telemetry": {"gpu": {"gpu_util": 100, "throttle": ["sw_power_cap"], "tensor_active": None},
                  "proc": {"rss_bytes": 123}, "reasons": {"tensor_active": "GPM unsupported"}},
    "relay": {"relay": "node-3:77:1a2b3c4d", "listen": "ipc:///tmp/flowtop-1000/relay.sock",
              "upstream": "tcp://login:5759", "ranks": 8, "frames_in": 900, "frames_out": 890, "bytes_in": 10**6,
              "bytes_out": 10**6, "drops": 10, "queued": 0, "commands": 1, "link_ups": 2, "uptime_s": 90.5,
              "closing": False, "hosted_by": "flowtop run"},
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_round_trip_every_kind(kind: str) -> None:
    frame = wire.encode(kind, KEY, 17, 1234.5, GOOD[kind])
    msg = wire.decode(frame)
    assert msg.kind == kind and msg.key == KEY and msg.seq == 17 and msg.sent_at == 1234.5
    assert dict(msg.fields) == GOOD[kind]


def test_kinds_cover_schema() -> None:
    assert set(GOOD) | {"stepcols"} == set(wire.KINDS)  # stepcols: tests/test_wire_steps.py


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


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_an_envelope_read_alone_is_the_decoded_one(kind: str) -> None:
    frame = wire.encode(kind, KEY, 17, 1234.5, GOOD[kind])
    head, msg = wire.envelope(frame), wire.decode(frame)
    assert (head.kind, head.key, head.seq, head.sent_at) == (msg.kind, msg.key, msg.seq, msg.sent_at)
    assert head.fields == {} and head.frame is frame and msg.frame is None


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"", "not msgpack"),
        (b"\xc1garbage", "not msgpack"),
        (msgpack.packb([1, 2, 3]), "not msgpack"),
        (_raw()[:-5], "not msgpack"),
        (_raw() + b"\x00", "extra data"),
        (_raw(v=[wire.MAJOR + 1, 0]), "unsupported major version"),
        (_raw(v="1.0"), "malformed version"),
        (_raw(k="pickle"), "unknown kind"),
        (_raw(rank=-1), "bad envelope field 'rank'"),
        (_raw(rank=True), "bad envelope field 'rank'"),
        (_raw(job=...), "missing envelope field 'job'"),
        (_raw(seq=...), "missing envelope field 'seq'"),
        (b"\x00" * (wire.MAX_FRAME_BYTES + 1), "exceeds"),
    ],
)
def test_an_envelope_read_alone_refuses_a_bad_one(frame: bytes, reason: str) -> None:
    with pytest.raises(WireError) as err:
        wire.envelope(frame)
    assert reason in str(err.value)
    with pytest.raises(WireError):
        wire.decode(frame)


def test_an_envelope_of_too_many_fields_is_left_to_decode() -> None:
    """Stepping over millions of tiny entries in Python costs more than decoding them in C: past
    MAX_FIELDS top-level entries the envelope refuses, and the monitor decodes the frame whole
    (unknown fields are allowed: it may still be valid)."""
    frame = _raw(**{f"x{i}": 0 for i in range(wire.MAX_FIELDS)})
    with pytest.raises(WireError, match="entries"):
        wire.envelope(frame)
    assert wire.decode(frame).kind == "step"


def test_an_envelope_read_alone_leaves_the_fields_to_decode() -> None:
    """Bad fields behind a good envelope: the envelope reads, the decode refuses; a field named
    like the envelope inside a nested value is stepped over, not taken for it."""
    frame = _raw(wall_s="slow", extra={"rank": 99, "k": "bye"})
    head = wire.envelope(frame)
    assert head.kind == "step" and head.key == RankKey("j", "h", 1, 0, 0)
    with pytest.raises(WireError, match="bad value for 'wall_s'"):
        wire.decode(frame)


def test_newer_minor_and_unknown_optional_fields_accepted() -> None:
    msg = wire.decode(_raw(v=[wire.MAJOR, 9], future_field={"x": 1}))
    assert msg.kind == "step" and "future_field" not in msg.fields


def test_control_round_trip_and_rejection() -> None:
    assert wire.decode_control(wire.encode_control("kernels_now", "j", 2)) == ("kernels_now", "j", 2, None, None)
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


# --- kernels: raw profiler records, strictly validated ----------------------------------------------


def _kernels(**over: object) -> bytes:
    body = {"v": [wire.MAJOR, wire.MINOR], "k": "kernels", "job": "j", "rank": 0, "host": "h", "pid": 1, "inc": 0,
            "seq": 0, "t": 1.0, **GOOD["kernels"]}  # fmt: skip
    body.update(over)
    return msgpack.packb({k: v for k, v in body.items() if v is not ...})


def _op(**over: object) -> list:
    fields = dict(zip(("name", "thread", "start", "end", "ext", "dims", "concrete"), GOOD["kernels"]["ops"][1]))
    fields.update(over)
    return [GOOD["kernels"]["ops"][0], list(fields.values())]


def _act(**over: object) -> list:
    fields = dict(zip(("name", "kind", "start", "end", "stream", "ext", "corr"), GOOD["kernels"]["acts"][1]))
    fields.update(over)
    return [GOOD["kernels"]["acts"][0], list(fields.values())]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: _kernels(events=..., ops=...), "missing field 'ops'"),
        (lambda: _kernels(acts={"0": 1}), "'acts': not a list"),
        (lambda: _kernels(ops=[(0, 7, 0, 1, 5, None, None)] * (wire.KERNEL_MAX_RECORDS + 1)), "records exceed 500000"),
        (lambda: _kernels(names=[""] * (wire.KERNEL_MAX_NAMES + 1)), "bad value for 'names'"),
        (lambda: _kernels(names=["x" * (wire.KERNEL_MAX_NAME + 1)]), "bad value for 'names'"),
        (lambda: _kernels(ops=[[0, 7, 0.0, 1.0, 5, None]]), "'ops': record 0: not a list of 7 fields"),
        (lambda: _kernels(ops=[7]), "'ops': record 0: not a list of 7 fields"),
        (lambda: _kernels(ops=_op(name=-1)), "'ops': record 1: name, thread and ext"),
        (lambda: _kernels(ops=_op(name="aten::mm")), "'ops': record 1: name, thread and ext"),
        (lambda: _kernels(ops=_op(thread=1.5)), "'ops': record 1: name, thread and ext"),
        (lambda: _kernels(ops=_op(ext=True)), "'ops': record 1: name, thread and ext"),
        (lambda: _kernels(ops=_op(start=float("inf"))), "'ops': record 1: start/end"),
        (lambda: _kernels(ops=_op(end="10")), "'ops': record 1: start/end"),
        (lambda: _kernels(ops=_op(dims=[[[1, 2]]])), "'ops': record 1: dims"),  # nested a level too deep
        (lambda: _kernels(ops=_op(dims=[[1, 2]] * 17)), "'ops': record 1: dims"),  # too many inputs
        (lambda: _kernels(ops=_op(dims=[[1] * 9])), "'ops': record 1: dims"),  # too many dims
        (lambda: _kernels(ops=_op(dims=[[2, -3]])), "'ops': record 1: dims"),
        (lambda: _kernels(ops=_op(dims=[[2, 1.0]])), "'ops': record 1: dims"),
        (lambda: _kernels(ops=_op(dims=[[2, 2**63]])), "'ops': record 1: dims"),
        (lambda: _kernels(ops=_op(dims={"a": [1]})), "'ops': record 1: dims"),
        (lambda: _kernels(ops=_op(concrete=[[[1]]])), "'ops': record 1: concrete"),  # nested a level too deep
        (lambda: _kernels(ops=_op(concrete=[[1.5, 2.0]])), "'ops': record 1: concrete"),  # float lists are not sent
        (lambda: _kernels(ops=_op(concrete=[list(range(17))])), "'ops': record 1: concrete"),
        (lambda: _kernels(ops=_op(concrete=[None] * 17)), "'ops': record 1: concrete"),
        (lambda: _kernels(ops=_op(concrete=["x" * 65])), "'ops': record 1: concrete"),
        (lambda: _kernels(ops=_op(concrete=[float("nan")])), "'ops': record 1: concrete"),
        (lambda: _kernels(ops=_op(concrete=[{"a": 1}])), "'ops': record 1: concrete"),
        (lambda: _kernels(ops=_op(concrete="[1, 1]")), "'ops': record 1: concrete"),
        (lambda: _kernels(acts=_act(kind=3)), "'acts': record 1: kind must be one of (0, 1, 2, 4)"),
        (lambda: _kernels(acts=_act(kind=1.0)), "'acts': record 1: kind"),
        (lambda: _kernels(acts=_act(kind=False)), "'acts': record 1: kind"),
        (lambda: _kernels(acts=_act(stream=-2)), "'acts': record 1: name, stream, ext and corr"),
        (lambda: _kernels(acts=_act(corr=-1)), "'acts': record 1: name, stream, ext and corr"),
        (lambda: _kernels(acts=_act(name=None)), "'acts': record 1: name, stream, ext and corr"),
        (lambda: _kernels(acts=_act(start=2e12)), "'acts': record 1: start/end"),
        (lambda: _kernels(acts=[[0, 0, 1.0, 2.0, 7, 0, 0, "extra"]]), "'acts': record 0: not a list of 7 fields"),
        (lambda: _kernels(device="tpu"), "bad value for 'device'"),
        (lambda: _kernels(step_dur_us=-1.0), "bad value for 'step_dur_us'"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_kernel_windows_rejected_with_reason(make: Callable[[], bytes], reason: str) -> None:
    with pytest.raises(WireError) as err:
        wire.decode(make())
    assert reason in str(err.value)


def test_kernel_record_limits_are_inclusive() -> None:
    """The largest shapes, inputs and strings the probe may send are accepted."""
    op = [0, 2**63 - 1, -5.0, 1e12, 2**63 - 1, [[2**62] * wire.KERNEL_MAX_DIMS] * wire.KERNEL_MAX_INPUTS,
          [list(range(wire.KERNEL_MAX_LIST)), "x" * wire.KERNEL_MAX_STR, -(2**63)] + [0.5] * 13]  # fmt: skip
    fields = wire.decode(_kernels(ops=[op], acts=[], names=["y" * wire.KERNEL_MAX_NAME])).fields
    assert fields["ops"] == [op] and fields["acts"] == []


def test_a_batch_is_validated_record_by_record() -> None:
    ok = GOOD["steps"]["records"]
    for bad, why in (([], "empty"), ([{"step": 1}], "missing wall_s/tokens/drops"),
                     ([ok[0], {**ok[1], "wall_s": -1.0}], "negative wall time"),
                     ([ok[0]] * (wire.MAX_BATCH + 1), "over MAX_BATCH"), ([ok[0], 3], "not a map")):
        with pytest.raises(WireError, match="steps: bad value for 'records'"):
            wire.decode(wire.encode("steps", KEY, 1, 1.0, {"records": bad}))
        assert why
    # unknown fields of a record are dropped, like those of a single message
    msg = wire.decode(wire.encode("steps", KEY, 1, 1.0, {"records": [{**ok[0], "extra": 1}]}))
    assert wire.records(msg) == [ok[0]]


def test_an_old_single_step_frame_still_decodes() -> None:
    old = msgpack.packb({"v": [wire.MAJOR, 1], "k": "step", "job": "j", "rank": 0, "host": "h", "pid": 1,
                         "inc": 0, "seq": 0, "t": 1.0, **GOOD["step"]})
    msg = wire.decode(old)
    assert msg.kind == "step" and wire.records(msg) == [GOOD["step"]]


def test_flat_map_names_kept_from_a_passed_map_still_refuse_bad_ones():
    """The flat-map check keeps the names of maps that passed (probe.wire.checks): a map with other
    names, a bytes name or a too long one, is still tested and refused, and so is a bad value under
    kept names, however many name sets came before."""
    from probe.wire.checks import MAX_NAME_SETS, _flat_map

    check = _flat_map()
    good = {"a": 1, "b": 2.0, "c": "x", "d": ["s"], "e": None, "f": True, "g": []}
    assert check(good) and check(dict(good))
    assert not check({**{k: v for k, v in good.items() if k != "a"}, b"a": 1})
    assert not check({b"a": 1, **{k: v for k, v in good.items() if k != "a"}})  # in a kept name's place
    assert not check({**good, "x" * 65: 1})
    assert not check({**good, "b": float("nan")})
    assert not check({**good, "d": [1]})
    for i in range(3 * MAX_NAME_SETS):
        assert check({**good, f"n{i}": 1})
    assert not check({**good, "n5": b"x"})
    assert check(good)
