"""Admission of new ranks: caps on jobs, ranks per job and new ranks per second. No Textual.

Anyone who can reach the monitor's port (loopback without CURVE) can make up rank ids; each
costs the monitor memory and snapshot time (~2.9 KB and a row each; 1 M forged ranks were
2.9 GB). A new rank key is admitted only within these limits; at a cap, the longest-silent rank
that has already ended (done or stale) makes room, else the frame is refused and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Limits:
    """The monitor's caps. Rank caps fit one 4,096-rank job with restarts and many small ones;
    the overall kernel byte rate fits about 30 ranks' windows at once (each is decoded, validated
    and built by the kernel worker's builder, a process of the live monitor's own, ~0.35 core at
    this rate), so larger jobs get some ranks' tables per aligned window, not all."""

    max_jobs: int = 256
    max_ranks_per_job: int = 16_384
    max_ranks: int = 65_536
    new_ranks_per_s: float = 1_000.0
    new_ranks_burst: int = 8_192  # a whole large job says hello within a few seconds
    #: Kernel windows are the only large frames; decoding, validating and building one costs
    #: ~0.17 s of CPU per MB (the data thread reads only its envelope, flowtop.monitor.collector):
    #: bytes of them per second, per rank and in all, with a burst of a few.
    kernel_bytes_per_s_rank: float = 1 << 20
    kernel_burst_rank: int = 10 << 20  # one frame of the largest size (8 MB) fits
    kernel_bytes_per_s: float = 2 << 20  # ≤ ~0.35 s of CPU per second on the kernel worker
    kernel_burst: int = 32 << 20


class TokenBucket:
    """A token bucket (of new rank keys, of bytes): ``burst`` at once, ``rate`` per second after."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._at: float | None = None

    def _refill(self, now: float) -> None:
        """Add what accrued at the rate since the last take (or rate change) up to ``now``."""
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate)

    def take(self, now: float, amount: float = 1.0) -> bool:
        """``amount`` at monitor time ``now``; False (nothing taken) when over the rate."""
        self._refill(now)
        self._at = now
        if self._tokens < amount:
            return False
        self._tokens -= amount
        return True

    def set_rate(self, now: float, rate: float) -> None:
        """Change the rate from monitor time ``now`` on (what accrued before it, at the old one)."""
        self._refill(now)
        if self._at is not None:
            self._at = max(self._at, now)
        self.rate = rate

    def give_back(self, amount: float) -> None:
        """Return ``amount`` taken for something that was refused elsewhere."""
        self._tokens = min(self.burst, self._tokens + amount)


class KernelBudget:
    """Admits kernels frames within per-rank and overall byte rates (a ``probe.wire.Admit``).

    ``spread``: the model's tick spread (flowtop.monitor.thinning). A monitor whose ticks crowd out
    its frames also takes kernel windows at 1/spread of the overall rate (a window costs ~4 ms of
    validation), from the instant the spread changed (:meth:`respread`, live and in a replay at the
    recorded instant: a replay refuses the same windows)."""

    def __init__(self, limits: Limits, clock: Callable[[], float], spread: Callable[[], int] = lambda: 1) -> None:
        self._limits = limits
        self._clock = clock
        self._spread = spread
        self._all = TokenBucket(limits.kernel_bytes_per_s, limits.kernel_burst)
        self._ranks: dict[object, TokenBucket] = {}

    def respread(self, now: float) -> None:
        """The model's spread changed at monitor time ``now``."""
        self._all.set_rate(now, self._limits.kernel_bytes_per_s / self._spread())

    def __call__(self, key: object, kind: str, size: int) -> str:
        if kind != "kernels":
            return ""
        now = self._clock()
        lim = self._limits
        bucket = self._ranks.get(key)
        if bucket is None:
            if len(self._ranks) >= lim.max_ranks:
                self._ranks.clear()  # forged keys must not grow this map: start afresh
            bucket = self._ranks[key] = TokenBucket(lim.kernel_bytes_per_s_rank, lim.kernel_burst_rank)
        if not bucket.take(now, size):
            return "kernel window refused: over the per-rank kernel byte rate"
        if not self._all.take(now, size):
            bucket.give_back(size)  # not spent: the rank's own allowance is given back
            return "kernel window refused: over the monitor's kernel byte rate"
        return ""
