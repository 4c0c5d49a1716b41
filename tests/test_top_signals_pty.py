"""``flowtop top --record`` ended by a signal as a user's session ends it: ``kill`` (SIGTERM) or a
closed SSH connection (SIGHUP). A real process on a pseudo-terminal, fed by a real probe publisher:
it quits as on ``q`` (status 0), and the recording holds every step it received. The signal's
default action killed it with the recording's buffer unwritten (an empty file for the first
seconds, the last frames later) and the terminal left in raw mode."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from flowtop.monitor.recording import read_frames, read_recording
from flowtop.tools.demo.launch import free_port_pair
from probe import wire
from probe.wire import RankKey
from test_top_prometheus_pty import Terminal, top_fed

STEPS = 30


def _recorded_steps(path: Path) -> int:
    """Step records in the recording (every step kind: the probe batches them)."""
    n = 0
    for _, frame in read_frames(path):
        msg = wire.decode(frame)
        if msg.steps is not None:
            n += len(msg.steps.step)
    return n


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_quits_top_with_its_recording_whole(tmp_path: Path, sig: signal.Signals) -> None:
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    path = tmp_path / "top.rec"
    with top_fed(listen, ["--record", str(path)], RankKey("sig-job", "node-s", 4242, 0, 0), STEPS) as (term, pub):
        pub.publish_now("bye", {"reason": "test", "steps": STEPS, "drops": 0})
        term.until("done", time.monotonic() + 60)  # the bye shown: every frame before it was received
        term.signal(sig)
        assert term.wait(30) == 0, bytes(term.out[-2000:])
        assert _recorded_steps(path) == STEPS
        said: list[str] = []
        assert list(read_recording(path, said.append)) and said == []  # closed: its end marker written
        assert b"\x1b[?1049l" in term.out[-4000:]  # the terminal given back: the screen it took left


def test_top_under_nohup_outlives_its_terminal_and_a_second_signal_kills() -> None:
    """A SIGHUP the process was started ignoring (``nohup flowtop top``) stays ignored: the
    monitor outlives its terminal as asked. SIGTERM then quits it; a second one while it stops
    would kill it as before (never a process that only SIGKILL ends)."""
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    term = Terminal(["-m", "flowtop.cli", "top", "--listen", listen], ignore=(signal.SIGHUP,))
    try:
        term.until("Quit", time.monotonic() + 60)
        term.signal(signal.SIGHUP)
        assert term.wait(2.0) is None  # still running
        term.signal(signal.SIGTERM)
        term.signal(signal.SIGTERM)  # at once: quitting as on q, or killed by the second
        assert term.wait(30) in (0, -signal.SIGTERM), bytes(term.out[-2000:])
    finally:
        term.kill()
