"""The probe's sender as it stops: what it sent reaches a slow monitor within close()'s time, a
signal cannot cut that wait short, and its ZeroMQ context ends with it whatever fails on the way.
Real sockets (tests/test_sender_wakeups.RawMonitor: a real XSUB where the monitor would be)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from probe.transport import link as link_module
from probe.transport import sender as sender_module
from probe.transport.publisher import Publisher
from test_sender_wakeups import RawMonitor, _started, _wait_until

pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train])")

WINDOW = {"window": 1, "step": 1, "device": "cpu", "step_dur_us": 1.0, "names": ["k" * 8000] * 32,
          "ops": [], "acts": []}  # a ~256 KB kernel window: 40 of them back up past the socket buffers


def _small_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small kernel buffers on the probe's side: what the paused monitor has not taken stays in
    ZeroMQ's hands whatever the host's TCP autotuning allows (10 MB fit in its buffers on some
    hosts)."""
    options = sender_module.upstream_options
    monkeypatch.setattr(sender_module, "upstream_options", lambda addr: [*options(addr), ("SNDBUF", 64 * 1024)])


def _backed_up(monitor: RawMonitor) -> Publisher:
    """A probe that sent 40 windows to ``monitor``, paused: most of them still in ZeroMQ's hands."""
    pub = _started("slow", monitor.addr)
    assert _wait_until(lambda: pub.subscribers > 0)
    time.sleep(0.2)
    monitor.paused = True
    for _ in range(40):
        pub.publish_now("kernels", WINDOW)
    assert _wait_until(lambda: pub._sent >= 41)  # the hello and the windows: all in ZeroMQ's hands
    return pub


def _close_while(pub: Publisher, during: Any) -> float:
    """close(3 s) on a thread, ``during()`` on this one meanwhile; the seconds close() took."""
    closing = threading.Thread(target=pub.close, kwargs={"timeout_s": 3.0})
    began = time.monotonic()
    closing.start()
    during()
    closing.join(5.0)
    assert not closing.is_alive()
    return time.monotonic() - began


def test_close_waits_for_what_a_slow_monitor_has_not_yet_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """What was sent before close() reaches a monitor that takes it within close's time: the
    socket lingers that long in the sender's own context (LINGER 0 dropped what ZeroMQ still
    held the moment the sender stopped, 4 of 40 windows arriving here: a job's last batch and
    its bye, now and then, at exit). close() still returns within its time."""
    _small_buffers(monkeypatch)
    monitor = RawMonitor(rcvhwm=2)
    pub = _backed_up(monitor)
    try:
        def resume() -> None:
            time.sleep(0.5)
            monitor.paused = False  # the monitor takes its frames again while close() waits

        assert _close_while(pub, resume) < 3.5  # its 3 s, and the join's 0.2 s
        assert _wait_until(lambda: monitor.kinds().count("kernels") == 40, 5.0), monitor.kinds().count("kernels")
        assert pub.drops == 0
    finally:
        pub.close(timeout_s=0.5)
        monitor.close()


def test_a_signal_on_the_sender_thread_does_not_cut_its_linger_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal with a Python handler (a DataLoader's SIGCHLD, SIGINT) that lands on the sender
    thread while it waits out its linger: ZeroMQ's wait ended with EINTR and pyzmq gave the
    context up unterminated (the thread gone at once, the context's two threads left running for
    good). The thread blocks such signals for that wait: it waits on, and its context ends."""
    _small_buffers(monkeypatch)
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    before = _threads()
    monitor = RawMonitor(rcvhwm=2)
    pub = _backed_up(monitor)
    waited: list[bool] = []
    try:
        thread = pub._thread
        assert thread is not None and thread.ident is not None

        def interrupt_then_resume() -> None:
            time.sleep(0.4)  # the sender waits in its context's end by now
            signal.pthread_kill(thread.ident, signal.SIGUSR1)
            time.sleep(0.2)
            waited.append(thread.is_alive())
            monitor.paused = False

        _close_while(pub, interrupt_then_resume)
        assert waited == [True]  # still waiting for the monitor 0.2 s after the signal
        assert _wait_until(lambda: monitor.kinds().count("kernels") == 40, 5.0), monitor.kinds().count("kernels")
    finally:
        signal.signal(signal.SIGUSR1, previous)
        pub.close(timeout_s=0.5)
        monitor.close()
    assert _wait_until(lambda: _threads() <= before, 5.0), (before, _threads())  # no ZeroMQ thread left


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_the_context_ends_with_the_thread_when_closing_its_socket_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing the link's monitor socket raises: the socket and the context are closed anyway,
    so no ZeroMQ thread (I/O, reaper) outlives the sender; the failure is said once."""
    def broken(self: Any) -> None:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(link_module.Link, "close", broken)
    before = _threads()
    monitor = RawMonitor()
    try:
        for _ in range(3):
            pub = _started("broken", monitor.addr)
            assert _wait_until(lambda: pub.subscribers > 0)
            pub.close(timeout_s=0.5)
            assert pub._thread is not None and not pub._thread.is_alive()
    finally:
        monitor.close()
    assert _wait_until(lambda: _threads() <= before, 5.0), (before, _threads())
