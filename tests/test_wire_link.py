"""The upstream socket options a probe and a node relay share (probe.wire.link), applied to real
pyzmq sockets: every name is a pyzmq option and reads back as set."""

from __future__ import annotations

import random

import zmq

from probe.wire.link import upstream_options


def test_options_apply_to_a_real_xpub_and_read_back() -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    try:
        options = dict(upstream_options("tcp://[::1]:5759", random.Random(3)))
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        for name in ("LINGER", "SNDHWM", "IMMEDIATE", "RECONNECT_IVL", "RECONNECT_IVL_MAX", "HEARTBEAT_IVL",
                     "HEARTBEAT_TIMEOUT", "IPV6"):
            assert sock.getsockopt(getattr(zmq, name)) == options[name]
    finally:
        sock.close(0)
        ctx.term()
    assert (options["LINGER"], options["SNDHWM"], options["XPUB_NODROP"]) == (0, 1000, 1)
    assert 100 <= options["RECONNECT_IVL"] <= 400
    assert "IPV6" not in dict(upstream_options("tcp://127.0.0.1:5759"))
    # jittered per socket: a node's ranks do not reconnect in lockstep
    assert len({dict(upstream_options("tcp://h:1", random.Random(i)))["RECONNECT_IVL"] for i in range(20)}) > 5


def test_subscription_change_reads_the_xpub_protocol_byte() -> None:
    """ZeroMQ's XPUB hands up b"\x01" + topic for a subscription and b"\x00" + topic when one
    ends; anything else that arrives (an XSUB's upstream message) is a monitor's command."""
    from probe.wire.command_bound import subscription_change

    assert subscription_change(b"\x01") == 1 and subscription_change(b"\x01topic") == 1
    assert subscription_change(b"\x00") == -1
    assert subscription_change(b"") == 0 and subscription_change(b"\x92\xa4pace") == 0
