"""Admission of new ranks: caps on jobs, ranks per job and new ranks per second. No Textual.

Anyone who can reach the monitor's port (loopback without CURVE) can make up rank ids; each
costs the monitor memory and snapshot time (~2.9 KB and a row each; 1 M forged ranks were
2.9 GB). A new rank key is admitted only within these limits; at a cap, the longest-silent rank
that has already ended (done or stale) makes room, else the frame is refused and counted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """The monitor's caps (defaults fit one 4,096-rank job with restarts, and many small ones)."""

    max_jobs: int = 256
    max_ranks_per_job: int = 16_384
    max_ranks: int = 65_536
    new_ranks_per_s: float = 1_000.0
    new_ranks_burst: int = 8_192  # a whole large job says hello within a few seconds


class NewRankBucket:
    """A token bucket of new rank keys: ``burst`` at once, ``rate`` per second after."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> bool:
        """One new rank at monitor time ``now``; False when over the rate."""
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
