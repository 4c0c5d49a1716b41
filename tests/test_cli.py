"""CLI: clear errors for bad input, JSON snapshot with no probes, README/CI consistency."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowtop.tools.demo.launch import free_port_pair
from snapshot_schema import assert_valid_snapshot

ROOT = Path(__file__).resolve().parent.parent


def _flowtop(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowtop.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["snapshot", "--timeout", "-1"], "must be a positive number"),
        (["snapshot", "--timeout", "soon"], "expected a number"),
        (["demo", "--ranks", "0"], "must be positive"),
        (["serve", "--record", ""], "--record: expected a file name, got an empty one"),  # recorded nothing, exit 0
        (["top", "--peak-tflops", "inf"], "must be a positive number"),
        (["snapshot", "--listen", "udp://x"], "expected tcp://HOST:PORT"),
        (["snapshot", "--listen", "tcp://0.0.0.0:5999"], "--insecure-bind"),
        (["--bogus"], "flowtop top: error: unrecognized arguments: --bogus"),
        # the command's own usage and name, not the top level's
        (["snapshot", "--json", "--bogus"], "usage: flowtop snapshot"),
        (["replay", "x.rec", "--bogus"], "flowtop replay: error: unrecognized arguments: --bogus"),
        (["frobnicate"], "unknown command 'frobnicate'; commands: top, serve, run"),
        (["snaphsot", "--json"], "unknown command 'snaphsot' (did you mean 'snapshot'?)"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    out = _flowtop(*args)
    assert out.returncode == 2
    assert message in out.stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--connect", "notaurl"], {}, "bad address 'notaurl' (--connect)"),
        (["--connect", "tcp://127.0.0.1:0"], {}, "PORT 1-65535"),
        (["--connect", "ipc://"], {}, "or ipc:///PATH"),
        ([], {"FLOWTOP_ADDR": "garbage"}, "bad address 'garbage' (FLOWTOP_ADDR)"),
        (["--curve-dir", "/nonexistent"], {}, "no key directory /nonexistent"),
    ],
)
def test_run_refuses_a_bad_upstream_before_the_command_starts(
        tmp_path: Path, args: list[str], env: dict[str, str], message: str) -> None:
    """The probe would fall back to the default address (or its sender thread would stop on the
    keys) while the training ran unwatched and run exited 0: the user must hear it at once."""
    import os

    ran = tmp_path / "ran"
    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "run", *args, "--", sys.executable, "-c",
                          f"open({str(ran)!r}, 'w')"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env}, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not ran.exists()


def test_snapshot_json_with_no_probes() -> None:
    port = free_port_pair()
    out = _flowtop("snapshot", "--listen", f"tcp://127.0.0.1:{port}", "--timeout", "0.3", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert_valid_snapshot(data)
    from flowtop.monitor.snapshot_json import SCHEMA

    assert data["schema"] == SCHEMA == "flowtop.snapshot/1.14"
    assert data["jobs"] == [] and data["received"] == 0


@pytest.mark.parametrize("follow", [False, True])
def test_snapshot_until_done_that_times_out_exits_3(follow: bool) -> None:
    """A script waiting for a run's end must tell "done" (0) from "gave up waiting" (it exited 0
    either way): the snapshot is still printed, whole, and stderr says why the status is 3. With no
    rank heard at all it says that, not "not every rank had finished" (a trial: a training sent to
    another address read as ranks that did not finish)."""
    port = free_port_pair()
    out = _flowtop("snapshot", "--listen", f"tcp://127.0.0.1:{port}", "--until-done", "--timeout", "1", "--json",
                   *(["--follow", "--interval", "0.2"] if follow else []))
    assert out.returncode == 3, out.stderr
    assert out.stderr == (f"flowtop: --until-done: no rank was heard after 1 s (the timeout) (received 0, "
                          f"rejected 0 on tcp://127.0.0.1:{port}); nothing to wait for\n")
    lines = out.stdout.strip().splitlines() if follow else [out.stdout]
    assert lines and all(json.loads(line)["jobs"] == [] for line in lines)


def test_snapshot_until_done_ended_by_a_signal_exits_0() -> None:
    """Ctrl-C or SIGTERM ends the collection early: the snapshot of that moment, status 0 (as with
    --follow); only the timeout is 3."""
    import signal
    import time

    port = free_port_pair()
    proc = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", f"tcp://127.0.0.1:{port}",
                             "--until-done", "--timeout", "60", "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # started and collecting
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "not every rank" not in err and json.loads(out)["jobs"] == []


def test_a_bad_monitor_address_from_the_environment_names_its_variable() -> None:
    """``FLOWTOP_ADDR=garbage flowtop snapshot`` said "bad address 'garbage'" without saying where
    it came from (``flowtop run`` names it); now both do."""
    import os

    out = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--timeout", "0.3"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "FLOWTOP_ADDR": "garbage"})
    assert out.returncode == 2
    assert "bad address 'garbage'" in out.stderr and "(from FLOWTOP_ADDR)" in out.stderr
    given = _flowtop("snapshot", "--listen", "garbage", "--timeout", "0.3")
    assert given.returncode == 2 and "FLOWTOP_ADDR" not in given.stderr


def test_run_refuses_an_empty_connect_and_names_a_host_that_does_not_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    """``flowtop run --connect "$MONITOR"`` with the variable unset sent the ranks to the default
    address without a word, and a monitor host whose name does not resolve (a typo, another
    site's name) left the probes retrying quietly forever: the job looked as if no monitor ever
    listened (a new user's trial)."""
    from flowtop.tools import listening
    from flowtop.tools.listening import no_monitor_note, unresolved_note

    monkeypatch.setattr(listening, "RESOLVE_WAIT_S", 20.0)  # a slow resolver here is not what is tested

    empty = _flowtop("run", "--connect", "", "--", sys.executable, "-c", "print('ran')")
    assert empty.returncode == 2 and "ran" not in empty.stdout
    assert "--connect was given an empty address" in empty.stderr
    nodir = _flowtop("run", "--connect", "ipc:///nonexistent/dir/sock", "--", sys.executable, "-c", "print('ran')")
    assert nodir.returncode == 2 and "ran" not in nodir.stdout  # no relay can listen there (a trial)
    assert "its directory /nonexistent/dir does not exist" in nodir.stderr
    tab = _flowtop("run", "--job", "exp\t1", "--", sys.executable, "-c", "print('ran')")
    assert tab.returncode == 2 and "ran" not in tab.stdout  # its frames would all be refused
    assert "--job 'exp\\t1' has control characters" in tab.stderr
    note = unresolved_note("nosuchhost.invalid", "tcp://nosuchhost.invalid:6140", wait_s=20)
    assert note is not None and "'nosuchhost.invalid' (tcp://nosuchhost.invalid:6140) does not resolve here" in note
    assert no_monitor_note("tcp://nosuchhost.invalid:6140") == note
    assert unresolved_note("127.0.0.1", "tcp://127.0.0.1:6140") is None
    assert unresolved_note("localhost", "tcp://localhost:6140") is None


def test_run_says_when_no_monitor_listens_yet(tmp_path: Path) -> None:
    """A new user who starts the training first heard nothing: the probes send only while a
    monitor listens. ``flowtop run`` says so once (loopback addresses only), and says nothing
    when one listens."""
    import os
    import socket

    port = free_port_pair()
    cmd = [sys.executable, "-m", "flowtop.cli", "run", "--", sys.executable, "-c", "print('trained')"]
    env = {**os.environ, "FLOWTOP_ADDR": f"tcp://127.0.0.1:{port}"}
    alone = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert alone.returncode == 0 and alone.stdout == "trained\n"
    assert f"no monitor listens on tcp://127.0.0.1:{port} yet" in alone.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        watched = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert watched.returncode == 0 and "no monitor" not in watched.stderr, watched.stderr


def test_no_monitor_note_names_the_command_that_listens_there(tmp_path: Path) -> None:
    """A trial: ``flowtop run --connect tcp://127.0.0.1:57599`` advised a plain ``flowtop``, which
    binds the default address and never heard the job. The advice names ``--listen`` when the
    address is not the default, and a relay's command for an ipc:// path."""
    import socket

    from flowtop.tools.listening import no_monitor_note
    from probe.wire import DEFAULT_ADDR

    port = free_port_pair()
    note = no_monitor_note(f"tcp://127.0.0.1:{port}") or ""
    assert f"start `flowtop --listen tcp://127.0.0.1:{port}` (another terminal)" in note, note
    default = no_monitor_note(DEFAULT_ADDR)
    assert default is None or "start `flowtop` (another terminal)" in default
    path = tmp_path / "relay.sock"
    note = no_monitor_note(f"ipc://{path}") or ""
    assert note.startswith(f"no relay listens on ipc://{path} yet: start "
                           f"`flowtop relay --listen ipc://{path} --connect MONITOR`"), note
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        s.listen()
        assert no_monitor_note(f"ipc://{path}") is None
    assert no_monitor_note(f"ipc://{path}") is not None  # a stale socket file: nothing accepts


def test_no_monitor_note_names_no_relay_command_for_a_path_a_relay_refuses() -> None:
    """`flowtop relay --listen` takes an absolute ipc path only (relay_setup.check_listen): for an
    @abstract or a relative path the note says nothing listens and names no command that would fail."""
    from flowtop.tools.listening import no_monitor_note
    from flowtop.tools.relay_setup import RelayError, check_listen

    for addr in ("ipc://@flowtop-test-nobody-rvfix", "ipc://relative/relay.sock"):
        with pytest.raises(RelayError):
            check_listen(addr)
        assert no_monitor_note(addr) == f"no relay listens on {addr} yet; the training runs meanwhile"


def test_run_finds_a_listening_monitor_without_connecting_to_it() -> None:
    """``flowtop run`` looked for a monitor by connecting to its port: while a node relay held the
    node's one upstream connection, a second ``flowtop run`` starting made a second one for a
    moment (tests/test_relay.py saw 2 in 1 sample of 208 under CI's load). It reads the kernel's
    socket table instead: the listener is never connected to."""
    import socket

    from flowtop.tools.listening import _listens, no_monitor_note

    if _listens("127.0.0.1", 9) is None:
        pytest.skip("the kernel's socket table cannot be read here (flowtop run knocks instead)")
    for bind, asked in (("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "localhost")):
        with socket.socket() as s:
            s.bind((bind, 0))
            s.listen()
            port = s.getsockname()[1]
            assert no_monitor_note(f"tcp://{asked}:{port}") is None
            s.settimeout(0.3)
            with pytest.raises(socket.timeout):  # nothing knocked
                s.accept()
    note = no_monitor_note(f"tcp://127.0.0.1:{port}")  # closed now
    assert note is not None and f"no monitor listens on tcp://127.0.0.1:{port} yet" in note
    if socket.has_ipv6:
        for bind, asked in (("::1", "[::1]"), ("::ffff:127.0.0.1", "127.0.0.1")):
            with socket.socket(socket.AF_INET6) as s:
                try:
                    s.bind((bind, 0))
                except OSError:  # no IPv6 loopback in this container
                    continue
                s.listen()
                port = s.getsockname()[1]
                assert no_monitor_note(f"tcp://{asked}:{port}") is None
                s.settimeout(0.3)
                with pytest.raises(socket.timeout):
                    s.accept()


def test_a_listener_table_in_an_unknown_form_costs_the_run_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A /proc/net/tcp this code cannot parse: flowtop run knocks, as before."""
    import socket

    from flowtop.tools import listening

    def garbled() -> None:
        raise ValueError("non-hexadecimal number found in fromhex() arg")

    monkeypatch.setattr(listening, "_proc_listeners", garbled)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listening.no_monitor_note(f"tcp://127.0.0.1:{port}") is None  # found by knocking
    assert "no monitor listens" in (listening.no_monitor_note(f"tcp://127.0.0.1:{port}") or "")


def test_the_listener_table_read_from_proc_is_psutils() -> None:
    """flowtop run reads /proc/net/tcp{,6} itself (psutil walks every process's descriptors for
    the same table): the two agree, IPv6 and IPv4-mapped addresses included."""
    import socket

    import psutil

    from flowtop.tools.listening import _proc_listeners

    held = []
    for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"), (socket.AF_INET6, "::ffff:127.0.0.1")):
        s = socket.socket(family)
        try:
            s.bind((addr, 0))
        except OSError:
            s.close()
            continue
        s.listen()
        held.append(s)
    try:
        # The table is the whole machine's: another process may open or close a listener between
        # the two reads (seen once on a shared box), so a few tries may be needed to agree.
        for _ in range(5):
            ours = _proc_listeners()
            try:
                theirs = [(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="tcp")
                          if c.status == psutil.CONN_LISTEN and c.laddr]
            except psutil.Error:
                theirs = None
            if ours is None or theirs is None:
                pytest.skip("no /proc/net/tcp, or psutil cannot read the table here")
            if sorted(ours) == sorted(theirs):
                break
        assert sorted(ours) == sorted(theirs)
        for s in held:
            assert (s.getsockname()[0], s.getsockname()[1]) in ours
    finally:
        for s in held:
            s.close()


def test_snapshot_port_in_use_is_a_clear_error() -> None:
    import socket

    port = free_port_pair()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        out = _flowtop("snapshot", "--listen", f"tcp://127.0.0.1:{port}", "--timeout", "0.3")
    assert out.returncode == 2
    assert "cannot bind" in out.stderr and "(is another flowtop running?)" in out.stderr
    # an address no interface here has (TEST-NET-1) is not blamed on another flowtop (a trial)
    out = _flowtop("snapshot", "--listen", f"tcp://192.0.2.1:{port}", "--insecure-bind", "--timeout", "0.3")
    assert out.returncode == 2 and "cannot bind" in out.stderr
    assert "another flowtop" not in out.stderr and "no network interface of this host has that address" in out.stderr


def test_snapshot_beside_a_running_monitor_says_how_to_read_its_snapshot(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """It said only "(is another flowtop running?)": the exact URL when that monitor serves HTTP at
    flowtop serve's default address (here a free port stands for it), the general way otherwise."""
    import socket

    from flowtop import cli
    from flowtop.export.metrics_http import HostPort, MetricsServer
    from flowtop.monitor.snapshot import MonitorSnapshot
    from flowtop.tools import common

    port = free_port_pair()
    listen = f"tcp://127.0.0.1:{port}"
    snap = MonitorSnapshot(taken_at=1.0, listen=listen, jobs=(), received=0, rejected=0)
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: snap)
    where = server.start()
    monkeypatch.setattr(common, "SERVE_PROMETHEUS", f"127.0.0.1:{where.port}")
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
            for follow in ([], ["--follow"]):
                assert cli.main(["snapshot", *follow, "--listen", listen, "--timeout", "0.3"]) == 2
                err = capsys.readouterr().err
                assert f"curl -s http://127.0.0.1:{where.port}/snapshot.json" in err, err
            server.stop()
            assert cli.main(["snapshot", "--listen", listen, "--timeout", "0.3"]) == 2
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert "curl -s http://HOST:PORT/snapshot.json at its --prometheus address" in err and "--listen" in err, err


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```\n(.*?)\n```", readme, re.S)
    install, test = blocks[0].strip(), blocks[1].strip()
    assert "flowtop demo" in install and "torch==2.13.0" in install
    ci = (ROOT / ".ci" / "run").read_text()
    assert test in ci.splitlines()


def test_python_m_flowtop_is_the_flowtop_command() -> None:
    """``python -m flowtop`` (no console script on PATH) runs the CLI: a new user's trial got
    "No module named flowtop.__main__; 'flowtop' is a package and cannot be directly executed"."""
    version = subprocess.run([sys.executable, "-m", "flowtop", "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("flowtop ")
    bad = subprocess.run([sys.executable, "-m", "flowtop", "snapshot", "--timeout", "-1"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "flowtop snapshot: error: argument --timeout" in bad.stderr
