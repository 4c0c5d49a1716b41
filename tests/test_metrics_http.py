"""The metrics endpoint's HTTP server against clients that are not Prometheus: connections that
send nothing (each held a thread for ever) are closed after the request timeout, quietly (no
traceback on the monitor's stderr), and scrapes go on meanwhile."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

import flowtop.export.metrics_http
from flowtop.export.metrics_http import HostPort, MetricsServer


def test_silent_clients_are_dropped_without_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    assert 0 < (flowtop.export.metrics_http._Quiet.timeout or 0) <= 30  # the default bounds a silent connection
    monkeypatch.setattr(flowtop.export.metrics_http._Quiet, "timeout", 0.5)  # REQUEST_TIMEOUT_S, shortened
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: None)
    where = server.start()
    base = threading.active_count()
    silent = [socket.create_connection(("127.0.0.1", where.port), timeout=10) for _ in range(8)]
    try:
        with urllib.request.urlopen(where.url(), timeout=10) as resp:  # served beside them
            assert b"flowtop_monitor_jobs" in resp.read()
        t0 = time.monotonic()
        for s in silent:
            assert s.recv(1) == b""  # closed by the server (a timeout here: held for ever)
        assert time.monotonic() - t0 < 8
        deadline = time.monotonic() + 5
        while threading.active_count() > base and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= base  # their threads are gone
    finally:
        for s in silent:
            s.close()
        server.stop()
    assert "Traceback" not in capfd.readouterr().err
