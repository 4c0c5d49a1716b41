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
from typing import Any

import pytest

from flowtop.tools import keys
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tools.doctor import render
from flowtop.tools.doctor_checks import Finding, address_findings, fd_findings, key_findings
from conftest import finished
from monitor_thread import MonitorThread

FLOWTOP = [sys.executable, "-m", "flowtop.cli"]


def doctor(*args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None,
           preexec: Any = None) -> tuple[int, dict[str, Any], str]:
    """Run ``flowtop doctor --json ARGS``; (exit code, the JSON, stderr)."""
    proc = subprocess.run([*(prefix or []), *FLOWTOP, "doctor", "--json", *args], capture_output=True, text=True,
                          timeout=240, env=env if env is not None else dict(os.environ), preexec_fn=preexec)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def doctor_started(*args: str, env: dict[str, str], prefix: list[str] | None = None) -> subprocess.Popen[str]:
    """``flowtop doctor ARGS`` started in the background (each run takes seconds, most of it its
    child interpreter's: a test that needs two runs it while the other runs)."""
    return subprocess.Popen([*(prefix or []), *FLOWTOP, "doctor", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def doctor_finished(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a :func:`doctor_started` run."""
    out, err = finished(proc, 240)
    return proc.returncode, out, err


def find(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"] == check]


def one(report: dict[str, Any], check: str) -> dict[str, Any]:
    (f,) = find(report, check)
    return f


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTOP_")}
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.slow
def test_clean_environment_passes() -> None:
    rc, report, _ = doctor("--listen", f"tcp://127.0.0.1:{free_port_pair()}", env=_clean_env())
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
def test_flowtop_disable_fails_with_its_fix() -> None:
    env = {**_clean_env(), "FLOWTOP_DISABLE": "1"}
    text = doctor_started("--listen", f"tcp://127.0.0.1:{free_port_pair()}", env=env)  # the text report, meanwhile
    try:
        rc, report, _ = doctor("--listen", f"tcp://127.0.0.1:{free_port_pair()}", env=env)
    finally:
        text_rc, text_out, text_err = doctor_finished(text)
    assert rc == 1 and not report["ok"]
    off = one(report, "disable")
    assert off["status"] == "fail" and "FLOWTOP_DISABLE=1" in off["summary"] and "unset FLOWTOP_DISABLE" in off["fix"]
    attach = one(report, "attach")
    assert attach["status"] == "fail" and "did not attach" in attach["summary"]
    assert text_rc == 1, text_err
    assert "[FAIL] disable" in text_out and "fix: unset FLOWTOP_DISABLE" in text_out
    assert "would stop monitoring: disable, attach" in text_out


@pytest.mark.slow
def test_busy_port_and_a_running_monitor() -> None:
    with socket.socket() as s:  # a program that is not a monitor holds the port
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        rc, report, _ = doctor("--listen", busy, env=_clean_env())
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


def _unprivileged() -> list[str]:
    """A prefix that makes root obey file permissions (no DAC override), or [] for other users."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: file permissions cannot be made to apply")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}", "--"]


@pytest.mark.slow
def test_no_key_directory_is_fine_on_loopback_only() -> None:
    """Beyond loopback without keys the security check fails and says what keys are for: the
    keys check adds no "fine on loopback" after it (a new user read the two as a contradiction)."""
    rc, report, _ = doctor("--listen", f"tcp://0.0.0.0:{free_port_pair()}", env=_clean_env())
    assert rc == 1 and one(report, "security")["status"] == "fail"
    assert not find(report, "keys"), find(report, "keys")
    assert key_findings(None)[0].summary.endswith("fine on loopback")  # what a loopback run says


def test_unreadable_key_directory_fails_with_its_fix(tmp_path: Path) -> None:
    d = keys.create(tmp_path / "k")  # its monitor key file unreadable
    hidden = keys.create(tmp_path / "hidden")  # the directory itself cannot be entered
    listen = f"tcp://0.0.0.0:{free_port_pair()}"
    prefix = _unprivileged()
    os.chmod(d / "server.key_secret", 0)
    os.chmod(hidden, 0)
    try:  # the two doctors run at once
        second = doctor_started("--json", "--listen", listen, "--curve-dir", str(hidden), env=_clean_env(),
                                prefix=prefix)
        try:
            rc, report, _ = doctor("--listen", listen, "--curve-dir", str(d), env=_clean_env(), prefix=prefix)
        finally:
            rc2, out2, err2 = doctor_finished(second)
    finally:
        os.chmod(d / "server.key_secret", stat.S_IRUSR | stat.S_IWUSR)
        os.chmod(hidden, stat.S_IRWXU)
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


def test_a_user_sitecustomize_is_reported_as_chained(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    env = {**_clean_env(), "PYTHONPATH": str(tmp_path)}
    rc, report, _ = doctor("--listen", f"tcp://127.0.0.1:{free_port_pair()}", env=env)
    assert rc == 0
    user = one(report, "user sitecustomize")
    assert user["details"]["file"] == str(tmp_path / "sitecustomize.py") and "chained" in user["summary"]
    assert one(report, "attach")["status"] == "ok"


def test_an_interpreter_that_ignores_pythonpath_fails(tmp_path: Path) -> None:
    wrapper = tmp_path / "python-E"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -E \"$@\"\n")
    wrapper.chmod(0o755)
    rc, report, _ = doctor("--listen", f"tcp://127.0.0.1:{free_port_pair()}", "--python", str(wrapper),
                           env=_clean_env())
    assert rc == 1
    site = one(report, "sitecustomize")
    assert site["status"] == "fail" and "ignores PYTHONPATH" in site["summary"] and "probe.attach()" in site["fix"]


def test_open_file_limit_for_the_expected_ranks() -> None:
    (ok,) = fd_findings(8)
    assert ok.status == "ok" and "enough for 8 ranks" in ok.summary

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    rc, report, _ = doctor("--listen", f"tcp://127.0.0.1:{free_port_pair()}", "--ranks", "1000", env=_clean_env(),
                           preexec=low)
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
