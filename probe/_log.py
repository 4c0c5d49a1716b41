"""Log-once helper: the probe reports each distinct failure a single time on stderr."""

from __future__ import annotations

import sys

_seen: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Print ``message`` to stderr the first time ``key`` is seen; never raises."""
    if key in _seen:
        return
    _seen.add(key)
    try:
        sys.stderr.write(f"[flowtop probe] {message}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not hurt training
        pass
