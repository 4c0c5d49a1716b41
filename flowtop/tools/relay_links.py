"""What a relay (flowtop.tools.relay) knows of its links, from its sockets' events. No Textual.

Upstream: whether a monitor is connected and subscribed (the relay subscribes to its ranks only
then, mirroring the monitor's presence), and CURVE handshakes the monitor refused or closed (said
once each on stderr). Downstream: which rank connections are open (its report counts them).
"""

from __future__ import annotations

import sys
from typing import Any

import zmq

from probe.wire.link import ClosedHandshakes, closed_text

#: Warnings said so far (each once a process: a relay retries a refused handshake for good).
_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Say ``message`` on stderr, the first time ``key`` is warned of only."""
    if key not in _warned:
        _warned.add(key)
        print(f"flowtop relay: {message}", file=sys.stderr, flush=True)


class Links:
    """The relay's connections, upstream and down; only its loop's thread updates them."""

    def __init__(self, upstream: str, keyed: bool) -> None:
        self.upstream = upstream
        self.keyed = keyed  # whether the relay connects upstream with CURVE keys
        self.ranks: set[int] = set()  # downstream connections (fds of accepted peers)
        self.up_conns = 0  # upstream connections with a completed handshake
        self.up_subs = 0  # the monitor's subscriptions (flowtop.tools.relay_commands reads them)
        self.link_ups = 0  # upstream connections made (1 + reconnects)
        self._closed = ClosedHandshakes()  # upstream CURVE handshakes in a row the monitor closed

    @property
    def listening(self) -> bool:
        """Whether a monitor is subscribed upstream."""
        return self.up_conns > 0 and self.up_subs > 0

    def read(self, up_events: Any, down_events: Any) -> None:
        """Take the events waiting on both monitor sockets (a bounded number of each)."""
        from zmq.utils.monitor import recv_monitor_message

        for _ in range(64):
            try:
                ev = recv_monitor_message(up_events, zmq.NOBLOCK)
            except zmq.Again:
                break
            self._upstream_event(ev["event"], ev.get("value"))
        for _ in range(256):
            try:
                ev = recv_monitor_message(down_events, zmq.NOBLOCK)
            except zmq.Again:
                break
            if ev["event"] == zmq.EVENT_ACCEPTED:
                self.ranks.add(ev["value"])
            elif ev["event"] == zmq.EVENT_DISCONNECTED:
                self.ranks.discard(ev["value"])

    def _upstream_event(self, event: int, value: Any) -> None:
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.up_conns += 1
            self.link_ups += 1
            self._closed.succeeded()
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            if self._closed.failed(value, self.keyed):
                warn_once("handshake-drop", closed_text(self.upstream, "the relay's",
                                                        "the one in the relay's key directory (--curve-dir)",
                                                        "nothing is forwarded"))
        elif event == zmq.EVENT_DISCONNECTED:
            self.up_conns = max(0, self.up_conns - 1)
            if self.up_conns == 0:
                self.up_subs = 0
        else:
            why = ("refused the relay's CURVE key: add its client.key to the monitor's clients/"
                   if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH else
                   "did not complete the handshake: CURVE keys on one side only, or mismatched ones")
            warn_once(f"handshake:{event}", f"the monitor at {self.upstream} {why}")
