"""The exporter's HTTP endpoint (``--prometheus HOST:PORT``). No Textual.

``/metrics`` is prometheus_client's own WSGI app over a registry holding the snapshot collector
(flowtop.export.exporter) and the process collector (``process_cpu_seconds_total``, memory, open
files): Prometheus text, or OpenMetrics when the scraper asks for it. ``/snapshot.json`` is the
same latest snapshot as the documented JSON (flowtop.monitor.snapshot_json.to_json), so a script can read
both at one moment (``flowtop_monitor_snapshot_clock_seconds`` = its ``taken_at``). The server
runs on threads of its own; a scrape only reads the newest published snapshot.

A snapshot's families and JSON are rendered once per format (flowtop.export.scrape_cache): scrapes until
the next snapshot reuse the bytes and only render the part that must be fresh — the monitor's
own CPU and frames/s and ``process_*`` — which is appended (before OpenMetrics' ``# EOF``).
A ``name[]`` filter (``/metrics?name[]=flowtop_job_mfu_ratio&name[]=...``, series names as a scrape
writes them) is prometheus_client's own, rendered per request from the registry.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.exposition import choose_encoder, gzip_accepted
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs

from flowtop.export.exporter import ExportPolicy, LoadCollector, SnapshotCollector, snapshot_families
from flowtop.export.scrape_cache import ScrapeCache
from flowtop.monitor.selfload import METER
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json

_EOF = b"# EOF\n"  # OpenMetrics' last line: once, after the fresh part


class MetricsAddressError(ValueError):
    """A ``--prometheus`` value that is not HOST:PORT, or a port that cannot be bound."""


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def url(self, path: str = "/metrics") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"


def parse_hostport(raw: str) -> HostPort:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``; PORT 0 takes a free one) → :class:`HostPort`."""
    text = raw.strip()
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 literal without brackets is ambiguous
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise MetricsAddressError(f"bad --prometheus {raw!r}: expected HOST:PORT (PORT 0-65535, "
                                  "IPv6 as [::1]:PORT), e.g. 127.0.0.1:9759 or 0.0.0.0:9759")
    return HostPort(host, int(port_text))


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went silent (REQUEST_TIMEOUT_S) or away is its own business: no
        traceback on the monitor's stderr (socketserver prints one by default); anything else
        is one line."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # timeouts, resets, broken pipes
            return
        print(f"flowtop: metrics request from {client_address[0]} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


#: Seconds a connection may stay silent before its request line and headers are in. Each
#: connection holds a thread: without a bound, clients that connect and send nothing (a port
#: scanner, a half-open load balancer probe) would pile threads up on the monitor for ever.
REQUEST_TIMEOUT_S = 10.0


class _Quiet(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # socketserver.StreamRequestHandler: settimeout on the connection

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """No access log on stderr."""


class _Families:
    """A registry-like source of one snapshot's families (what the exposition encoders read)."""

    def __init__(self, snap: MonitorSnapshot | None, policy: ExportPolicy) -> None:
        self.snap = snap
        self.policy = policy

    def collect(self) -> list[Any]:
        return snapshot_families(self.snap, self.policy)


#: Seconds a client should wait before asking /snapshot.json again when the monitor has no
#: snapshot yet: the data thread publishes one per tick (2 Hz), the first within a second of its start.
NO_SNAPSHOT_RETRY_S = 1
#: /snapshot.json's answer (503) before the first snapshot.
NO_SNAPSHOT_BODY = json.dumps({"error": "no snapshot yet: the monitor has not taken its first one",
                               "retry_after_s": NO_SNAPSHOT_RETRY_S}).encode()


class MetricsServer:
    """Serves ``/metrics`` and ``/snapshot.json`` of ``latest()`` at ``where``.

    Args:
        where: Address to bind.
        latest: Returns the newest published snapshot (a reference; called per request).
        policy: Rank cap and finished-job linger of the exporter.
        clock: The process's monotonic clock, what a snapshot's ``built_at`` reads (tests inject it).
    """

    def __init__(self, where: HostPort, latest: Callable[[], MonitorSnapshot | None],
                 policy: ExportPolicy = ExportPolicy(), clock: Callable[[], float] = time.monotonic) -> None:
        self.where = where
        self.latest = latest
        self.policy = policy
        self.clock = clock
        self.cache = ScrapeCache()
        # Everything, rendered per request: for what the cache does not serve (name[] filters,
        # methods other than GET: prometheus_client's own answers). A name[] filter
        # (restricted_registry) asks only the collectors that named the series at registration:
        # SnapshotCollector names its families in describe(); ProcessCollector has no describe(),
        # so auto_describe names its process_* series from one collect() at registration.
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(SnapshotCollector(lambda: self.latest(), policy,  # latest may be replaced
                                                 clock=lambda: self.clock()))
        ProcessCollector(registry=self.registry)
        self._metrics = make_wsgi_app(self.registry)
        # The fresh part of a cached scrape.
        self.live = CollectorRegistry()
        self.live.register(LoadCollector(lambda: self.latest(), clock=lambda: self.clock()))
        ProcessCollector(registry=self.live)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HostPort:
        """Bind and serve on a thread; returns the bound address (PORT 0 resolved).

        Raises :class:`MetricsAddressError` when the address cannot be bound."""
        try:
            family = socket.getaddrinfo(self.where.host, self.where.port, type=socket.SOCK_STREAM)[0][0]
        except socket.gaierror as exc:
            raise MetricsAddressError(f"cannot serve metrics on {self.where.host}:{self.where.port}: {exc}") from None
        server_cls = type("_FamilyServer", (_Server,), {"address_family": family})
        try:
            self._httpd = make_server(self.where.host, self.where.port, self._app, server_cls, _Quiet)
        except OSError as exc:
            raise MetricsAddressError(
                f"cannot serve metrics on {self.where.host}:{self.where.port}: {exc.strerror or exc}"
                " (is another flowtop serve running? pick another --prometheus port)") from None
        self.where = HostPort(self.where.host, self._httpd.server_address[1])
        METER.read()  # the base reading: the first scrape already has the monitor's CPU since now
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="flowtop-metrics", daemon=True)
        self._thread.start()
        return self.where

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/snapshot.json":
            snap = self.latest()
            if snap is None:
                # An object, as a snapshot is: a body of null crashed a script's json.load(...)["jobs"]
                # with a TypeError (a trial); a client that honours Retry-After asks again after a tick.
                body = NO_SNAPSHOT_BODY
                headers = [("Content-Type", "application/json"), ("Retry-After", str(NO_SNAPSHOT_RETRY_S)),
                           ("Content-Length", str(len(body)))]
                start_response("503 Service Unavailable", headers)
                return [body]
            body = self.cache.get(snap, "json", lambda: json.dumps(to_json(snap)).encode()).body
            # its real age, pauses of the monitor included (see served_age)
            age = self.served_age(snap)
            body = b'{"served_age_s": %.3f, ' % age + body[1:]
            headers = [("Content-Type", "application/json"), ("Age", str(int(age))),
                       ("Content-Length", str(len(body)))]
            start_response("200 OK", headers)
            return [body]
        if path in ("/", ""):
            body = (b"flowtop monitor: /metrics (Prometheus, OpenMetrics), /snapshot.json (the latest snapshot)\n")
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [body]
        if path != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics or /snapshot.json\n"]
        # Parsed as prometheus_client's app parses it (parse_qs drops blank values): a bare
        # ?name[]= is unfiltered in both, so it may take the cached path.
        if environ.get("REQUEST_METHOD") != "GET" or "name[]" in parse_qs(environ.get("QUERY_STRING", "")):
            return self._metrics(environ, start_response)
        return self._cached_metrics(environ, start_response)

    def served_age(self, snap: MonitorSnapshot) -> float:
        """Seconds since ``snap`` was built, on the process's clock. Its ``taken_at`` is on the
        monitor clock, which leaves the monitor's own pauses out (flowtop.monitor.clock): a request
        that came while the monitor was stopped (SIGSTOP) is answered as soon as it runs again, on
        this thread, before the data thread's next tick rebuilds the snapshot, so with the one from
        before the pause. This thread cannot build one (the model is the data thread's), and one
        built at once would know nothing newer (the frames of the pause still wait in the socket),
        so the answer says its age instead (the JSON's ``served_age_s``, the HTTP ``Age`` header,
        ``flowtop_monitor_snapshot_age_seconds``)."""
        return max(0.0, self.clock() - snap.built_at)

    def _cached_metrics(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        """/metrics: the snapshot's families rendered once per snapshot and format, then the fresh part."""
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT") or "")
        snap = self.latest()

        def render() -> bytes:
            body = encoder(_Families(snap, self.policy))
            return body[:-len(_EOF)] if body.endswith(_EOF) else body

        entry = self.cache.get(snap, content_type, render)
        tail = encoder(self.live)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or ""):
            body = entry.gzip(tail)
            headers.append(("Content-Encoding", "gzip"))
        else:
            body = entry.body + tail
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]
