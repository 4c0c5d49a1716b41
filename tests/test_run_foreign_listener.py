"""``flowtop run`` says when what listens at the monitor's address is not a flowtop monitor.

A new user's trial: with ``python -m http.server 5759`` (or any TCP server) on the monitor's port,
``flowtop run`` said nothing and the ranks' frames went nowhere. Real listeners here (an HTTP
server process, a raw TCP listener that says nothing, one that writes an SSH banner, one that
closes every connection, a ZeroMQ ROUTER), a real monitor, and a real ``flowtop run`` of a real
command: the note comes once on stderr, with the address and the fix, and the command's output and
exit status are its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from flowtop.tools.demo.launch import free_port_pair
from flowtop.tools.peer_check import HANDSHAKE_S, PeerOutcome, check_peer, peer_note, start_check, watch_peer

ROOT = Path(__file__).resolve().parent.parent
NOT_A_MONITOR = "but it is not a flowtop monitor"


def _tcp_listener(port: int, behave: str) -> socket.socket:
    """A raw TCP listener on loopback: "silent" accepts and says nothing, "banner" writes an SSH
    banner and keeps the connection, "close" closes every connection at once."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return
            if behave == "banner":
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            if behave == "close":
                conn.close()
            else:
                held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    return ls


@pytest.fixture
def http_server() -> Iterator[str]:
    """``python -m http.server PORT`` on loopback, as the user ran it."""
    port = free_port_pair()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # until it accepts
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "http.server did not start"
                time.sleep(0.1)
        yield f"tcp://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def _run_until_said(addr: str, tmp_path: Path) -> tuple[int, str, str]:
    """``flowtop run --connect ADDR -- CMD`` whose CMD trains on (a loop) until the test has read
    the note, or 60 s: (exit status, stdout, stderr)."""
    go = tmp_path / "go"
    child = ("import os, time\nfor _ in range(600):\n    if os.path.exists(%r): break\n    time.sleep(0.1)\n"
             "print('trained')\nraise SystemExit(7)\n") % str(go)
    proc = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "run", "--relay", "off", "--connect", addr, "--",
                             sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stderr is not None
    err = []
    try:
        for line in proc.stderr:
            err.append(line)
            if NOT_A_MONITOR in line:
                break
        go.touch()
        out, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, "".join(err) + rest


def test_run_says_an_http_server_on_the_port_is_not_a_monitor(http_server: str, tmp_path: Path) -> None:
    rc, out, err = _run_until_said(http_server, tmp_path)
    assert (rc, out) == (7, "trained\n")  # the command's own output and status
    assert err == (f"flowtop run: something listens on {http_server} but it is not a flowtop monitor: it did not "
                   f"answer a flowtop probe's handshake within {HANDSHAKE_S:g} s; the training runs, but its ranks' "
                   "frames go nowhere: stop that program, or start the monitor on another port (flowtop --listen "
                   "tcp://HOST:OTHER) and give the same address here (--connect tcp://HOST:OTHER); `flowtop doctor` "
                   "checks it\n")  # once


@pytest.mark.parametrize("behave", ["silent", "banner", "close"])
def test_run_says_a_raw_tcp_listener_is_not_a_monitor(behave: str, tmp_path: Path) -> None:
    port = free_port_pair()
    ls = _tcp_listener(port, behave)
    try:
        rc, out, err = _run_until_said(f"tcp://127.0.0.1:{port}", tmp_path)
    finally:
        ls.close()
    assert (rc, out) == (7, "trained\n")
    assert err.count(NOT_A_MONITOR) == 1 and f"something listens on tcp://127.0.0.1:{port} " in err, err


def test_the_check_tells_each_peer_apart(http_server: str) -> None:
    """The outcome per peer, and what is said of it: an HTTP server times the handshake out, a
    peer that closes each connection "closed" it (also what a monitor with other CURVE keys does:
    the note says so), a ZeroMQ ROUTER (another ZeroMQ program) never completes it, a real flowtop
    monitor completes it (nothing said), and nothing listening is said elsewhere (nothing here)."""
    import zmq
    from monitor_thread import MonitorThread

    stop = threading.Event()
    assert watch_peer(http_server, None, stop) == PeerOutcome(True, "timeout")
    port = free_port_pair()
    ls = _tcp_listener(port, "close")
    try:
        closed = watch_peer(f"tcp://127.0.0.1:{port}", None, stop)
    finally:
        ls.close()
    assert closed == PeerOutcome(True, "closed")
    assert "(or it is a monitor that requires CURVE keys: --curve-dir)" in (peer_note("x", closed, False) or "")
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        other = watch_peer(f"tcp://127.0.0.1:{rport}", None, stop)
    finally:
        router.close(0)
    # as below: by timing libzmq reports the ROUTER's refusal as the connection closed (CI saw it)
    assert other.connected and other.handshake in ("none", "protocol", "closed") and peer_note("x", other, False)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    try:  # it greets as ZeroMQ does: given a second, patient try, and still said
        patient = check_peer(f"tcp://127.0.0.1:{rport}", None, stop, patience_s=1.0)
    finally:
        router.close(0)
    ctx.term()
    # A ROUTER refuses an XPUB peer: libzmq reports it as a protocol error or, by timing, as the
    # connection closed (CI saw "closed" once); every one of them is said as not a monitor.
    assert patient in (PeerOutcome(True, "zeromq"), PeerOutcome(True, "protocol"), PeerOutcome(True, "closed"))
    assert "but it is not a flowtop monitor" in (peer_note("x", patient, False) or "")
    mon = MonitorThread()
    try:
        assert watch_peer(mon.listen, None, stop) == PeerOutcome(True, "ok")
    finally:
        mon.close()
    assert peer_note("x", PeerOutcome(True, "ok"), False) is None
    nothing = watch_peer(f"tcp://127.0.0.1:{free_port_pair()}", None, stop, wait_s=1.0)
    assert nothing == PeerOutcome(False, "none") and peer_note("x", nothing, False) is None


def test_a_real_monitor_too_busy_to_answer_in_time_is_not_called_a_foreign_program() -> None:
    """A real monitor answers the handshake once its ZAP handler, on its loop, has: with its loop
    held 5 s (a burst of thousands of hellos and checks) the check said it was "not a flowtop
    monitor" and told the user to stop it (a reviewer's repro). Its I/O thread greets as ZeroMQ at
    once: a second, patient try completes, and nothing is said."""
    from monitor_thread import MonitorThread

    mon = MonitorThread()
    notes: list[str] = []
    try:
        mon._loop.call_soon_threadsafe(time.sleep, 5.0)  # the monitor's loop busy
        end = start_check(mon.listen, None, say=notes.append)
        deadline = time.monotonic() + 40
        while any(t.name == "flowtop-peer-check" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.1)
        end()
    finally:
        mon.close()
    assert notes == []


def test_a_monitor_whose_keys_the_probes_do_not_match_is_named_a_monitor(tmp_path: Path) -> None:
    """A real monitor with CURVE keys, ``flowtop run`` without them (or with another key directory),
    and a monitor without keys, the run with them: each closed or failed the handshake, and the note
    said "it is not a flowtop monitor ... stop that program" (a reviewer's repro: the user's own
    monitor). Its ZeroMQ greeting names its mechanism: the note names the keys instead."""
    from monitor_thread import MonitorThread

    from flowtop.monitor.collector import Collector
    from flowtop.monitor.wiring import make_model
    from flowtop.tools import keys
    from flowtop.tools.relay_setup import client_keys

    ours, other = keys.create(tmp_path / "ours"), keys.create(tmp_path / "other")
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    stop = threading.Event()
    mon = MonitorThread(listen=listen, collector=Collector(make_model(), listen, curve=keys.load_server(ours)))
    try:
        none = peer_note(listen, check_peer(listen, None, stop), False) or ""
        mismatched = peer_note(listen, check_peer(listen, client_keys(str(other)), stop), True) or ""
        assert check_peer(listen, client_keys(str(ours)), stop) == PeerOutcome(True, "ok")
    finally:
        mon.close()
    assert none.startswith(f"the monitor on {listen} requires CURVE keys (its greeting says so) and the probes "
                           "have none: give the key directory"), none
    assert mismatched.startswith(f"the monitor on {listen} uses CURVE keys but closed the handshake with the "
                                 "probes' (--curve-dir): its server.key is not"), mismatched
    plain = MonitorThread()
    try:
        unwanted = peer_note(plain.listen, check_peer(plain.listen, client_keys(str(ours)), stop), True) or ""
    finally:
        plain.close()
    assert unwanted.startswith(f"the monitor on {plain.listen} has no CURVE keys but the probes do"), unwanted
    assert NOT_A_MONITOR not in none + mismatched + unwanted


def test_the_runs_of_one_node_check_the_monitor_once() -> None:
    """``srun`` starts a ``flowtop run`` per rank: each checked the monitor (4,096 handshakes at
    once, their ZAP requests on the monitor's loop, 4,096 copies of one note). The runs sharing a
    node relay check once: three at once against a silent listener, one note among them."""
    port = free_port_pair()
    ls = _tcp_listener(port, "silent")
    cmd = [sys.executable, "-m", "flowtop.cli", "run", "--relay", "on", "--connect", f"tcp://127.0.0.1:{port}", "--",
           sys.executable, "-c", f"import time; time.sleep({HANDSHAKE_S + 6})"]
    try:
        procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(3)]
        errs = [p.communicate(timeout=60)[1] for p in procs]
    finally:
        ls.close()
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert sum(e.count(NOT_A_MONITOR) for e in errs) == 1, errs


def test_run_says_nothing_of_a_real_monitor(tmp_path: Path) -> None:
    """A real monitor: the command runs past the check's time, and nothing is said."""
    from monitor_thread import MonitorThread

    mon = MonitorThread()
    try:
        child = f"import time; time.sleep({HANDSHAKE_S + 2.5}); print('trained')"
        ran = subprocess.run([sys.executable, "-m", "flowtop.cli", "run", "--relay", "off", "--connect", mon.listen,
                              "--", sys.executable, "-c", child], capture_output=True, text=True, timeout=60, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        mon.close()
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "trained\n", "")


def test_a_standalone_relay_says_its_upstream_is_not_a_monitor(tmp_path: Path) -> None:
    """`flowtop relay --connect ADDR` with a silent TCP listener at ADDR: said once, after its ready line."""
    import signal

    port = free_port_pair()
    ls = _tcp_listener(port, "silent")
    sock = tmp_path / "relay.sock"
    proc = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "relay", "--listen", f"ipc://{sock}", "--connect",
                             f"tcp://127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stderr is not None
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if NOT_A_MONITOR in line:
                break
        proc.send_signal(signal.SIGTERM)
        lines.append(proc.communicate(timeout=30)[1])
    finally:
        ls.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = "".join(lines)
    assert said.count(NOT_A_MONITOR) == 1, said
    assert f"flowtop relay: something listens on tcp://127.0.0.1:{port} but it is not a flowtop monitor" in said
