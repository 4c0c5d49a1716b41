"""How often the monitor asks its ranks for kernel windows (the ``k`` key): within its share of the
wire's command bound (probe.wire.command_bound: KERNELS_TARGET_S, KERNELS_BURST, KERNELS_RATE_PER_S).
No Textual.

A held ``k`` repeats 25-30 times a second, and each "kernels_now" goes to every connection (the
XSUB sends a command to all), so every rank and relay counts every one against its bucket (BURST
32, then 4 a second). In about a second a held key emptied it: every peer then dropped commands (a
pace renewal included), left its socket alone (a relay's node telemetry waited) and the monitor
blamed a port squatter for the user's own key. Now a press for a rank asked within
KERNELS_TARGET_S is folded into that request (its window is on its way; the UI says it was already
requested), and the requests to all ranks together pass a bucket of KERNELS_BURST, then
KERNELS_RATE_PER_S (a press past it is not sent, and the UI says so).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal

from probe.wire import command_bound as _bound


@dataclass(frozen=True)
class KernelAsk:
    """What became of one request (a ``k`` press): sent to the ranks or not, and in words for the UI."""

    sent: bool
    text: str
    severity: Literal["information", "warning", "error"] = "information"  # a Textual notification's


class KernelAsks:
    """The monitor's kernel window requests, limited (one thread's: the data loop's)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens = float(_bound.KERNELS_BURST)
        self._at = clock()
        self._asked: dict[tuple[str, int], float] = {}  # (job, rank) -> when last sent

    def ask(self, job: str, rank: int) -> KernelAsk:
        """Whether a request for rank ``rank`` of ``job`` may be sent now (then counted as sent)."""
        now = self._clock()
        who = f"rank {rank} of {job}"
        last = self._asked.get((job, rank))
        if last is not None and now - last < _bound.KERNELS_TARGET_S:
            return KernelAsk(False, f"kernel window already requested from {who}")
        tokens = min(float(_bound.KERNELS_BURST), self._tokens + (now - self._at) * _bound.KERNELS_RATE_PER_S)
        self._at = now
        if tokens < 1.0:
            self._tokens = tokens
            return KernelAsk(False, f"{who} not asked: kernel windows asked for too fast (at most "
                                    f"{_bound.KERNELS_BURST} at once, then {_bound.KERNELS_RATE_PER_S:g} "
                                    "a second); press k again in a moment", "warning")
        self._tokens = tokens - 1.0
        # Only the requests within KERNELS_TARGET_S can fold a press: the older ones go (a bounded map).
        self._asked = {k: t for k, t in self._asked.items() if now - t < _bound.KERNELS_TARGET_S}
        self._asked[(job, rank)] = now
        return KernelAsk(True, f"asked {who} for a kernel window")
