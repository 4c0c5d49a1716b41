"""What the command line and its subcommands share: argument types and the exit status after the
UI closed. ``flowtop.cli`` imports the subcommands; they import this, never the CLI."""

from __future__ import annotations

import argparse
import sys
from typing import Any


#: ``flowtop serve``'s ``--prometheus`` (its /metrics and /snapshot.json) by default; ``flowtop
#: top`` serves them only when given one.
SERVE_PROMETHEUS = "127.0.0.1:9759"


def positive_float(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {raw!r}")
    return value


def file_name(raw: str) -> str:
    """A file to write (``--record FILE``): not empty (``--record ''`` recorded nothing, silently)."""
    if not raw.strip():
        raise argparse.ArgumentTypeError("expected a file name, got an empty one")
    return raw


def positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {raw!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {raw!r}")
    return value


def hostport(raw: str) -> Any:
    from flowtop.export.metrics_http import MetricsAddressError, parse_hostport

    try:
        return parse_hostport(raw)
    except MetricsAddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_float(raw: str) -> float:
    return 0.0 if raw.strip() in ("0", "0.0") else positive_float(raw)


def start_failed(source: Any) -> int:
    """After the TUI closed: 2 with the reason on stderr if ``source`` never started, else 0.

    The app shows a start failure (a busy port) in the UI and stays up so it can be read;
    the exit status must still say the monitor did not run.
    """
    error = getattr(source, "start_error", "")
    if error:
        print(f"flowtop: {error}", file=sys.stderr)
        return 2
    return 0
