"""`flowtop doctor`: each check's pass and fail paths, with real child interpreters (flowtop run's
environment), real sockets, real key files and real resource limits."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from flowtop.tools import keys
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tools.doctor import render
from flowtop.tools.doctor_checks import Finding, address_findings, fd_findings, key_findings
from monitor_thread import MonitorThread

FLOWTOP = [sys.executable, "-m", "flowtop.cli"]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTOP_")}
    env.pop("PYTHONPATH", None)
    return env


def _unprivileged() -> list[str]:
    """A prefix that makes root obey file permissions (no DAC override), or [] for other users."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: file permissions cannot be made to apply")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}", "--"]


class Doctors:
    """This module's ``flowtop doctor`` runs, side by side. Each run is its own test's (its own
    arguments, environment, files and limits, set up in :func:`doctors`); they are started in the
    tests' order, at most ``LIMIT`` at once, and a test waits for its own. Each run takes seconds,
    most of it its child interpreter importing torch: one after another, they left one of CI's two
    cores idle (7 to 22 s a test under load)."""

    LIMIT = 3
    TIMEOUT_S = 240.0  # per run, from its start

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.pending: list[tuple[str, list[str], dict[str, Any]]] = []
        self.running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
        self.done: dict[str, tuple[int, str, str]] = {}

    def add(self, name: str, *args: str, env: dict[str, str], prefix: list[str] | None = None,
            preexec: Any = None) -> None:
        """``flowtop doctor ARGS`` (under ``prefix``, after ``preexec``), to run as ``name``."""
        self.pending.append((name, [*(prefix or []), *FLOWTOP, "doctor", *args], {"env": env, "preexec_fn": preexec}))

    def _start(self, name: str, argv: list[str], kwargs: dict[str, Any]) -> None:
        # stdout and stderr to files: a run nobody reads yet must never block on a full pipe
        with open(self.out_dir / f"{name}.out", "wb") as out, open(self.out_dir / f"{name}.err", "wb") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, **kwargs)
        self.running[name] = (proc, time.monotonic())

    def _reap(self) -> None:
        for name, (proc, started) in list(self.running.items()):
            if proc.poll() is None and time.monotonic() - started > self.TIMEOUT_S:
                proc.kill()
                proc.wait()
            if proc.poll() is not None:
                del self.running[name]
                self.done[name] = (proc.returncode, (self.out_dir / f"{name}.out").read_text(),
                                   (self.out_dir / f"{name}.err").read_text())
        while self.pending and len(self.running) < self.LIMIT:
            self._start(*self.pending.pop(0))

    def result(self, name: str) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of run ``name``, once it has ended."""
        while name not in self.done:
            queued = [i for i, (n, _, _) in enumerate(self.pending) if n == name]
            assert queued or name in self.running, f"no doctor run {name!r} was set up (see doctors())"
            if queued:  # its test comes before the runs ahead of it: start it now
                self._start(*self.pending.pop(queued[0]))
            self._reap()
            if name not in self.done:
                time.sleep(0.05)
        assert self.done[name][0] >= 0, f"{name} ran past {self.TIMEOUT_S} s: {self.done[name][2]}"
        return self.done[name]

    def json(self, name: str) -> tuple[int, dict[str, Any], str]:
        """A ``--json`` run's (exit code, the JSON, stderr)."""
        rc, out, err = self.result(name)
        assert out.strip(), err
        return rc, json.loads(out), err

    def close(self) -> None:
        self.pending.clear()
        for proc, _ in self.running.values():
            proc.kill()
            proc.wait()


def _low_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


@pytest.fixture(scope="module")
def doctors(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doctors]:
    """The runs of the tests selected in this module, queued in their order (see :class:`Doctors`)."""
    here = {item.originalname for item in request.session.items if item.module is request.module}
    tmp = tmp_path_factory.mktemp("doctors")
    runs = Doctors(tmp)
    ports = _distinct_ports()
    undo: list[Any] = []
    if "test_clean_environment_passes" in here:
        runs.add("clean", "--json", "--listen", f"tcp://127.0.0.1:{next(ports)}", env=_clean_env())
    if "test_flowtop_disable_fails_with_its_fix" in here:
        env = {**_clean_env(), "FLOWTOP_DISABLE": "1"}
        runs.add("disable", "--json", "--listen", f"tcp://127.0.0.1:{next(ports)}", env=env)
        runs.add("disable text", "--listen", f"tcp://127.0.0.1:{next(ports)}", env=env)
    if "test_busy_port_and_a_running_monitor" in here:
        s = socket.socket()  # a program that is not a monitor holds the port (until the module ends)
        undo.append(s.close)
        s.bind(("127.0.0.1", 0))
        s.listen()
        runs.add("busy port", "--json", "--listen", f"tcp://127.0.0.1:{s.getsockname()[1]}", env=_clean_env())
    if "test_no_key_directory_is_fine_on_loopback_only" in here:
        runs.add("no keys", "--json", "--listen", f"tcp://0.0.0.0:{next(ports)}", env=_clean_env())
    if "test_unreadable_key_directory_fails_with_its_fix" in here and (os.geteuid() != 0 or shutil.which("setpriv")):
        d = keys.create(tmp / "k")  # its monitor key file unreadable
        hidden = keys.create(tmp / "hidden")  # the directory itself cannot be entered
        listen = f"tcp://0.0.0.0:{next(ports)}"
        os.chmod(d / "server.key_secret", 0)
        os.chmod(hidden, 0)
        undo.append(lambda: os.chmod(d / "server.key_secret", stat.S_IRUSR | stat.S_IWUSR))
        undo.append(lambda: os.chmod(hidden, stat.S_IRWXU))
        for name, where in (("unreadable key", d), ("hidden keys", hidden)):
            runs.add(name, "--json", "--listen", listen, "--curve-dir", str(where), env=_clean_env(),
                     prefix=_unprivileged())
    if "test_a_user_sitecustomize_is_reported_as_chained" in here:
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
        runs.add("user site", "--json", "--listen", f"tcp://127.0.0.1:{next(ports)}",
                 env={**_clean_env(), "PYTHONPATH": str(tmp / "site")})
    if "test_an_interpreter_that_ignores_pythonpath_fails" in here:
        wrapper = tmp / "python-E"
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -E \"$@\"\n")
        wrapper.chmod(0o755)
        runs.add("python -E", "--json", "--listen", f"tcp://127.0.0.1:{next(ports)}", "--python", str(wrapper),
                 env=_clean_env())
    if "test_open_file_limit_for_the_expected_ranks" in here:
        runs.add("low fds", "--json", "--listen", f"tcp://127.0.0.1:{next(ports)}", "--ranks", "1000",
                 env=_clean_env(), preexec=_low_fds)
    try:
        yield runs
    finally:
        runs.close()
        for fn in undo:
            fn()


def _distinct_ports() -> Iterator[int]:
    """Free port pairs, none shared: the runs' port checks happen at the same time."""
    got: list[int] = []
    while True:
        port = free_port_pair()
        if all(abs(port - p) > 1 for p in got):
            got.append(port)
            yield port


def find(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"] == check]


def one(report: dict[str, Any], check: str) -> dict[str, Any]:
    (f,) = find(report, check)
    return f


@pytest.mark.slow
def test_clean_environment_passes(doctors: Doctors) -> None:
    rc, report, _ = doctors.json("clean")
    assert rc == 0 and report["ok"], report
    for check in ("disable", "sitecustomize", "probe import", "attach", "torch", "security", "port"):
        assert one(report, check)["status"] == "ok", one(report, check)
    assert "attached when a torch.optim optimizer was built" in one(report, "attach")["summary"]
    assert "is free" in one(report, "port")["summary"]
    (peak,) = find(report, "peak")  # a CPU machine: one device, its estimated fp32 peak
    assert peak["status"] == "ok" and peak["details"]["source"].startswith("estimated")
    assert peak["details"]["flops"] > 0
    assert "a CPU rank's own peak counts only the cores it computes on" in peak["summary"]
    assert one(report, "nvml")["status"] in ("ok", "info")  # no driver here: info, not a failure
    # The words of the same findings (the CLI's text mode, run end to end in the next test).
    text = render([Finding(**f) for f in report["findings"]])
    assert "[FAIL]" not in text and "nothing would stop monitoring" in text


@pytest.mark.slow
def test_flowtop_disable_fails_with_its_fix(doctors: Doctors) -> None:
    rc, report, _ = doctors.json("disable")
    text_rc, text_out, text_err = doctors.result("disable text")  # the text report of the same environment
    assert rc == 1 and not report["ok"]
    off = one(report, "disable")
    assert off["status"] == "fail" and "FLOWTOP_DISABLE=1" in off["summary"] and "unset FLOWTOP_DISABLE" in off["fix"]
    attach = one(report, "attach")
    assert attach["status"] == "fail" and "did not attach" in attach["summary"]
    assert text_rc == 1, text_err
    assert "[FAIL] disable" in text_out and "fix: unset FLOWTOP_DISABLE" in text_out
    assert "would stop monitoring: disable, attach" in text_out


@pytest.mark.slow
def test_busy_port_and_a_running_monitor(doctors: Doctors) -> None:
    rc, report, _ = doctors.json("busy port")  # a program that is not a monitor holds the port
    assert rc == 1
    port = one(report, "port")
    assert port["status"] == "fail" and "not a flowtop monitor" in port["summary"]
    assert "pick another port" in port["fix"]
    monitor = MonitorThread()  # a real monitor: the port answers with a ZeroMQ greeting
    try:
        (f,) = [f for f in address_findings(monitor.listen, None, False) if f.check == "port"]
        assert f.status == "ok" and "ZeroMQ listener" in f.summary
        time.sleep(0.5)
        assert monitor.snapshot().rejected == 0  # the doctor's look is no failed handshake
    finally:
        monitor.close()


def test_addresses_beyond_loopback_and_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port_pair()
    (sec,) = [f for f in address_findings(f"tcp://0.0.0.0:{port}", None, False) if f.check == "security"]
    assert sec.status == "fail" and "flowtop keys DIR" in sec.fix
    (sec,) = [f for f in address_findings(f"tcp://0.0.0.0:{port}", "/some/keys", False) if f.check == "security"]
    assert sec.status == "ok"
    (bad,) = address_findings("udp://x", None, False)
    assert bad.status == "fail" and "tcp://HOST:PORT" in bad.summary
    # No packet may leave this machine (tests reach loopback only): the connection to an address
    # of no interface here times out and the name does not resolve, both faked at the socket.
    far_host = "192.0.2.1"  # TEST-NET-1: never contacted, the fake answers for it
    real_connect, real_lookup = socket.socket.connect, socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> None:
        if address[0] == far_host:
            raise socket.timeout("timed out")
        assert address[0] in ("127.0.0.1", "0.0.0.0", "::1"), f"a test connected to {address}"
        real_connect(self, address)

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "no-such-host.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    # Not reachable from here: probes here could not reach a monitor there; a warning (the monitor
    # may simply not run yet), not a failure.
    (far,) = [f for f in address_findings(f"tcp://{far_host}:5759", None, True) if f.check == "port"]
    assert far.status == "warn" and not far.details["local"] and far_host in far.summary
    refused = [f for f in address_findings("tcp://no-such-host.invalid:5759", None, False) if f.check == "address"]
    assert refused and refused[0].status == "fail" and "does not resolve" in refused[0].summary


def test_keys_present_and_readable(tmp_path: Path) -> None:
    d = keys.create(tmp_path / "k")
    assert all(f.status == "ok" for f in key_findings(str(d)))
    (d / "client.key_secret").unlink()
    (missing,) = [f for f in key_findings(str(d)) if f.status == "fail"]
    assert "client.key_secret" in missing.summary and "flowtop keys" in missing.fix
    for p in (d / "clients").glob("*.key"):
        p.unlink()
    assert any("no client public keys" in f.summary for f in key_findings(str(d)))


@pytest.mark.slow
def test_no_key_directory_is_fine_on_loopback_only(doctors: Doctors) -> None:
    """Beyond loopback without keys the security check fails and says what keys are for: the
    keys check adds no "fine on loopback" after it (a new user read the two as a contradiction)."""
    rc, report, _ = doctors.json("no keys")  # --listen tcp://0.0.0.0:PORT
    assert rc == 1 and one(report, "security")["status"] == "fail"
    assert not find(report, "keys"), find(report, "keys")
    assert key_findings(None)[0].summary.endswith("fine on loopback")  # what a loopback run says


def test_unreadable_key_directory_fails_with_its_fix(doctors: Doctors) -> None:
    _unprivileged()  # root without setpriv: skipped, saying why
    # Two key directories (doctors): one whose monitor key file cannot be read, one that cannot
    # be entered; file permissions apply to the runs (as root: without DAC override).
    rc, report, _ = doctors.json("unreadable key")
    rc2, out2, err2 = doctors.result("hidden keys")
    hidden = doctors.out_dir / "hidden"
    assert rc == 1
    (bad,) = [f for f in find(report, "keys") if f["status"] == "fail"]
    assert "server.key_secret (monitor) cannot be read: Permission denied" in bad["summary"]
    assert "chmod" in bad["fix"]
    assert one(report, "security")["status"] == "ok"  # keys are given: only their file is the problem
    assert out2.strip(), err2
    assert rc2 == 1
    # The directory is the problem, said once with its own fix (it was one finding per file it
    # hides, each telling to chmod that file, and one telling to chmod DIR/clients).
    (bad,) = find(json.loads(out2), "keys")
    assert bad["status"] == "fail" and f"{hidden} cannot be entered by this user (mode 0000" in bad["summary"]
    assert f"chmod u+rx {hidden}" in bad["fix"]


def test_a_missing_key_directory_and_the_verdict_line(tmp_path: Path) -> None:
    from flowtop.tools.doctor import render
    from flowtop.tools.doctor_checks import Finding

    (gone,) = key_findings(str(tmp_path / "nowhere"))
    assert gone.status == "fail" and "does not exist" in gone.summary and f"flowtop keys {tmp_path}" in gone.fix
    (file_,) = key_findings(str(keys.create(tmp_path / "k") / "server.key"))
    assert file_.status == "fail" and "is not a directory" in file_.summary
    fails = [Finding("keys", "fail", f"k{i}", "fix") for i in range(3)] + [Finding("port", "fail", "p", "fix")]
    assert render(fails).endswith("4 problem(s) would stop monitoring: keys (3), port")


def test_a_user_sitecustomize_is_reported_as_chained(doctors: Doctors) -> None:
    rc, report, _ = doctors.json("user site")  # PYTHONPATH: a directory with its own sitecustomize.py
    assert rc == 0
    user = one(report, "user sitecustomize")
    assert user["details"]["file"] == str(doctors.out_dir / "site" / "sitecustomize.py")
    assert "chained" in user["summary"]
    assert one(report, "attach")["status"] == "ok"


def test_an_interpreter_that_ignores_pythonpath_fails(doctors: Doctors) -> None:
    rc, report, _ = doctors.json("python -E")  # --python: a wrapper that runs python -E
    assert rc == 1
    site = one(report, "sitecustomize")
    assert site["status"] == "fail" and "ignores PYTHONPATH" in site["summary"] and "probe.attach()" in site["fix"]


def test_open_file_limit_for_the_expected_ranks(doctors: Doctors) -> None:
    (ok,) = fd_findings(8)
    assert ok.status == "ok" and "enough for 8 ranks" in ok.summary
    rc, report, _ = doctors.json("low fds")  # --ranks 1000 with an open-file limit of 64 (_low_fds)
    assert rc == 1
    files = one(report, "open files")
    assert files["status"] == "fail" and files["details"]["hard"] == "64"
    assert files["details"]["capacity"] < 64 and "relay" in files["fix"] and "ulimit -Hn" in files["fix"]


def test_bad_doctor_arguments_exit_2() -> None:
    out = subprocess.run([*FLOWTOP, "doctor", "--ranks", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "must be positive" in out.stderr


def test_flowtop_disable_set_to_off_is_named_not_called_unset() -> None:
    from flowtop.tools.doctor_checks import probe_findings

    def disable(value: str) -> Any:
        child = {"flowtop_disable": value, "site": {"ours_ran": True}, "probe": {"ok": True},
                 "attach": {"tried": True, "attached": value in ("", "0")}}
        (f,) = [f for f in probe_findings(child, "python") if f.check == "disable"]
        return f

    assert disable("").summary == "FLOWTOP_DISABLE is not set"
    assert disable("0").status == "ok" and disable("0").summary == "FLOWTOP_DISABLE=0: the probe stays on"
    assert disable("Yes").status == "fail"  # the probe reads it without case
