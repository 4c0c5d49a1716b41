"""Notices: monitor-side errors for the user (a recording that stopped, a hint rule that raised,
a port that could not be bound or was lost). No Textual.

The data side writes them here instead of printing to stderr, which the TUI owns; the data
thread hands them to the UI with its snapshots, where they become notifications (headless
commands print them on stderr). A notice repeated within :data:`REPEAT_S` is counted, not
shown again, so a failure that recurs on every frame cannot flood the screen.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Deque

#: Seconds within which the same text is not shown twice.
REPEAT_S = 30.0
#: Notices waiting to be taken at most (the oldest go first).
MAX_PENDING = 32
SEVERITIES = ("information", "warning", "error")  # Textual's notify() severities


@dataclass(frozen=True)
class Notice:
    """One message for the user."""

    severity: str  # "information" | "warning" | "error"
    text: str
    at: float  # monitor time it was raised


class Notices:
    """Notices raised on the data side, waiting for the UI (thread-confined: the data thread)."""

    def __init__(self) -> None:
        self._pending: Deque[Notice] = collections.deque(maxlen=MAX_PENDING)
        self._shown: dict[str, float] = {}
        #: Notices not shown because the same text was shown less than REPEAT_S before.
        self.repeated = 0
        #: Every notice raised, in order (the last MAX_PENDING), for ``flowtop snapshot`` and tests.
        self.history: Deque[Notice] = collections.deque(maxlen=MAX_PENDING)

    def add(self, severity: str, text: str, at: float) -> None:
        """Raise a notice at monitor time ``at``."""
        if severity not in SEVERITIES:
            raise ValueError(f"unknown severity {severity!r}")
        last = self._shown.get(text)
        if last is not None and at - last < REPEAT_S:
            self.repeated += 1
            return
        if len(self._shown) > 1000:  # distinct texts only come from distinct failures, but bound it
            self._shown.clear()
        self._shown[text] = at
        notice = Notice(severity, text, at)
        self._pending.append(notice)
        self.history.append(notice)

    def error(self, text: str, at: float) -> None:
        """Raise an error notice."""
        self.add("error", text, at)

    def warning(self, text: str, at: float) -> None:
        """Raise a warning notice."""
        self.add("warning", text, at)

    def take(self) -> tuple[Notice, ...]:
        """The notices raised since the last call, oldest first."""
        out = tuple(self._pending)
        self._pending.clear()
        return out
