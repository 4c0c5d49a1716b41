"""The host a rank or a node relay reports (a RankKey's host, so the monitor's node).

``FLOWTOP_HOST`` overrides the machine's name, for several simulated nodes on one machine: the
probe reads it through ``probe.config.HOST``, a relay through ``flowtop.settings.HOST``; both
take the name here, so that a rank and the relay of its node always agree on it.
"""

from __future__ import annotations

import socket

#: Longest host name (a DNS name's limit).
MAX_HOST = 255


def host_problem(name: str) -> str:
    """Why ``name`` cannot be a host name ("" when it can)."""
    if not name or not name.isprintable() or len(name) > MAX_HOST or name != name.strip():
        return f"expected a host name: printable, no surrounding spaces, 1-{MAX_HOST} characters"
    return ""


def host_name(override: str | None) -> str:
    """``override`` (FLOWTOP_HOST, already checked) where set, else the machine's name."""
    return override or socket.gethostname()
