"""The collector's drain loop waits on the XSUB's descriptor (Collector._wait_frames): a frame that
arrives ends the wait at once, also when a command goes upstream on the same socket meanwhile (a
send takes in the socket's commands, the one that says a frame waits among them: the descriptor
stayed quiet and the frame waited out the wait's 500 ms; a review)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import AsyncIterator

import zmq
import zmq.asyncio

from flowtop.monitor.collector_net import CollectorSockets, _WakingSocket


class _Owner(CollectorSockets):
    """The drain loop's wait's own state alone (no sockets of its own)."""


@dataclass(frozen=True)
class _Pair:
    owner: _Owner
    sync: zmq.Socket[bytes]  # the XSUB as the drain loop reads it
    send: _WakingSocket  # the XSUB as commands go upstream
    pub: zmq.Socket[bytes]


@contextlib.asynccontextmanager
async def _pair(name: str) -> AsyncIterator[_Pair]:
    """A subscribed XSUB bound at inproc://NAME with a PUB connected to it, and a wait's owner;
    the owner's reader and the sockets closed at the end."""
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.XSUB)
    sub.bind(f"inproc://{name}")
    owner = _Owner()
    send = _WakingSocket(sub.underlying, owner)
    send.send(b"\x01")
    pub: zmq.Socket[bytes] = zmq.Context.shadow(ctx.underlying).socket(zmq.PUB)
    pub.connect(f"inproc://{name}")
    await asyncio.sleep(0.05)
    try:
        yield _Pair(owner, zmq.Socket.shadow(sub.underlying), send, pub)
    finally:
        owner._stop_reading()
        pub.close(0)
        sub.close(0)
        ctx.term()


async def _waits(command: bool, trials: int = 10) -> list[float]:
    waited = []
    async with _pair("wait") as p:
        loop = asyncio.get_running_loop()
        for _ in range(trials):
            def arrive() -> None:
                p.pub.send(b"frame")
                if command:
                    time.sleep(0.002)  # past libzmq's throttle of command processing
                    p.send.send(b"\x02cmd", zmq.NOBLOCK)  # as the k key or a refresh's pace, during the wait

            loop.call_later(0.01, arrive)
            t0 = time.perf_counter()
            await p.owner._wait_frames(p.sync, 0.5)
            waited.append(time.perf_counter() - t0)
            assert p.sync.recv(zmq.NOBLOCK) == b"frame"
    return waited



async def _three_waits(p: _Pair, timeout: float) -> list[float]:
    """Three waits of the owner's, each woken by a frame its PUB sends 10 ms in: their seconds."""
    loop = asyncio.get_running_loop()
    waited = []
    for _ in range(3):
        loop.call_later(0.01, p.pub.send, b"frame")
        t0 = time.perf_counter()
        await p.owner._wait_frames(p.sync, timeout)
        waited.append(time.perf_counter() - t0)
        assert p.sync.recv(zmq.NOBLOCK) == b"frame"
    return waited

def test_a_frame_ends_the_wait_at_once() -> None:
    assert max(asyncio.run(_waits(command=False))) < 0.25  # of a 0.5 s wait: not its timeout


def test_a_command_sent_during_the_wait_does_not_hide_the_frame() -> None:
    assert max(asyncio.run(_waits(command=True))) < 0.25


def test_the_descriptor_is_registered_once_and_unregistered_at_close() -> None:
    """The waits keep the socket's descriptor registered with the loop between them (adding and
    removing it at each wait was ~58 k instructions a wait) and a frame still ends each at once;
    closing unregisters it (a closed socket's descriptor left in the selector)."""

    async def run() -> tuple[bool, bool, list[float]]:
        async with _pair("once") as p:
            loop = asyncio.get_running_loop()
            fd = p.sync.get(zmq.FD)
            waited = await _three_waits(p, 0.5)
            kept = p.owner._reading == (loop, fd)
            p.owner._stop_reading()
            gone = not loop.remove_reader(fd)  # False: nothing was registered for it any more
        return kept, gone, waited

    kept, gone, waited = asyncio.run(run())
    assert kept and gone
    assert max(waited) < 0.25


def test_a_drain_that_died_leaves_no_reader_to_spin_the_loop() -> None:
    """The drain loop lost to an exception (_run says so; the loop stays up for the UI) takes the
    waits' reader with it: left registered, nobody asks ZMQ_EVENTS any more, so the descriptor a
    new probe's connect makes readable stays readable, and the loop called the reader at every
    turn (~280 k a second, a core; a review). Real TCP sockets: a frame kills the drain, a second
    publisher connects, the loop turns 500 times."""
    from flowtop.monitor.collector import Collector
    from flowtop.monitor.wiring import make_model
    from flowtop.tools.demo.launch import free_port_pair

    async def run() -> tuple[bool, int, int, bool]:
        listen = f"tcp://127.0.0.1:{free_port_pair()}"
        collector = Collector(make_model(), listen)
        calls = [0]
        readable = collector._readable

        def counting() -> None:
            calls[0] += 1
            readable()

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a broken frame handler")

        collector._readable = counting  # type: ignore[method-assign]
        collector.handle_frame = broken  # type: ignore[method-assign]
        await collector.start()
        assert collector._task is not None
        ctx = zmq.Context()
        first, second = ctx.socket(zmq.PUB), ctx.socket(zmq.PUB)
        try:
            first.connect(listen)
            for _ in range(200):  # until the frame reached the drain and killed it
                first.send(b"frame")
                await asyncio.sleep(0.02)
                if collector._task.done():
                    break
            died = collector._task.done()
            fd = zmq.Socket.shadow(collector._sub.underlying).get(zmq.FD)
            calls[0] = 0
            second.connect(listen)  # a pipe attached: a command to the socket, its descriptor readable
            await asyncio.sleep(0.3)
            for _ in range(500):
                await asyncio.sleep(0)
            spun = calls[0]
            registered = asyncio.get_running_loop().remove_reader(fd)
            await collector.stop()
            return died, spun, fd, registered
        finally:
            first.close(0)
            second.close(0)
            ctx.term()

    died, spun, _, registered = asyncio.run(run())
    assert died
    assert spun == 0 and not registered


def test_a_stale_reader_on_the_descriptors_number_does_not_silence_the_waits() -> None:
    """The loop's selector may still hold a reader for the XSUB's descriptor number from a file
    closed before (pyzmq's authenticator leaves its own at stop; epoll forgot it when the file
    closed). add_reader then only swaps the callback: the descriptor kept for the socket's life
    never woke a wait again, each frame waited out the wait's timeout (a review). Real sockets;
    the stale entry made by hand: a pipe put at the descriptor's number, read, then closed."""
    import os

    async def run() -> list[float]:
        async with _pair("stale") as p:
            loop = asyncio.get_running_loop()
            fd = p.sync.get(zmq.FD)
            saved = os.dup(fd)
            r, w = os.pipe()
            os.dup2(r, fd)  # the number names the pipe a moment: a reader registered for it...
            loop.add_reader(fd, lambda: None)
            os.dup2(saved, fd)  # ... and the pipe closed: epoll forgets it, the selector does not
            for end in (saved, r, w):
                os.close(end)
            waited = await _three_waits(p, 5.0)
        return waited

    assert max(asyncio.run(run())) < 2.5  # the frame's wake, not the 5 s timeout
