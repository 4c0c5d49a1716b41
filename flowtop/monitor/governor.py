"""The collector's load governor: every RENEW_S it fits the monitor's load to its data thread, through
the pace asked of the ranks (flowtop.monitor.pacing) and how thinly large jobs' ticks are spread
(flowtop.monitor.thinning); in between, a longer pace at once when ranks joined (Pacer.ramp).

:class:`LoadGovernor` is a base of :class:`flowtop.monitor.collector.Collector`, not an object it
calls (as flowtop.monitor.collector_net.CollectorSockets is): the drain loop reaches these methods,
and the frames their meters (``busy``), through ``self`` as before. Its state is set by
``Collector.__init__`` (see there for what each holds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowtop.monitor.pacing import RENEW_S, Busy, BusyMeter, Pacer, pace_news, pace_notice
from flowtop.monitor.rankstate import STALE_AFTER_S
from flowtop.monitor.thinning import Thinner, spread_notice, spread_record

if TYPE_CHECKING:
    from flowtop.monitor.limits import KernelBudget
    from flowtop.monitor.model import Model


class LoadGovernor:
    """The pace asked of the ranks and the spread of large jobs' ticks (see the module's docstring)."""

    # Set by Collector.__init__.
    model: Model
    recorder: Any
    pacer: Pacer
    thinner: Thinner
    busy: BusyMeter
    _kernel_budget: KernelBudget
    _pace_check: float
    _ranks_at_renewal: int
    _ranks_seen: int
    _told_pace: float | None
    _told_load_bound: bool
    _told_pace_at: float

    if TYPE_CHECKING:
        def _stop_recording(self, exc: Exception) -> None: ...

        def _broadcast_pace(self, pace: float | None) -> None: ...  # CollectorSockets'

    def _govern(self, now: float) -> None:
        """Every RENEW_S, fit the monitor's load to its data thread: the pace asked of the ranks
        (flowtop.monitor.pacing) and how thinly large jobs' ticks are spread (flowtop.monitor.thinning);
        in between, a longer pace at once when ranks joined (Pacer.ramp)."""
        ranks = len(self.model.ranks)
        if ranks > self._ranks_seen:
            self._ranks_seen = ranks
            self._broadcast_pace(self.pacer.ramp(ranks - self._ranks_at_renewal))
        if now < self._pace_check:
            return
        self._pace_check = now + RENEW_S
        self._ranks_at_renewal = self._ranks_seen = ranks
        busy = self.busy.read()
        self._pace(now, busy)
        self._thin(now, busy)

    def _thin(self, now: float, busy: Busy | None) -> None:
        model = self.model
        largest = model.largest_job()
        spread = self.thinner.due(model.spread, busy, largest)
        if spread == model.spread:
            return
        model.set_spread(spread)
        self._kernel_budget.respread(now)
        if self.recorder is not None:  # a replay spreads its ticks where this monitor did
            try:
                self.recorder.write(now, spread_record(spread), received=False)
            except Exception as exc:
                self._stop_recording(exc)
        model.notices.add("information", spread_notice(spread, busy, largest, self.thinner.cpu_budget), now)

    def _pace(self, now: float, busy: Busy | None) -> None:
        """Ask every rank to send its step records less often when too many talk (flowtop.monitor.pacing)."""
        # Ranks that send: a rank's frames queued behind a backlog (the monitor or its link falling
        # behind) count at their relay's receive time, and must not stop the pace when most needed.
        lag = self.model.relays.lag_of
        live = sum(1 for st in self.model.ranks.values()
                   if st.bye is None and now - st.last_recv - lag(st.via) <= STALE_AFTER_S)
        pacer = self.pacer
        pace = pacer.due(now, live, busy, self.model.relays.behind(now))
        self._broadcast_pace(pace)
        load_bound = pacer.load_bound
        # Not at every step of a load-driven pace finding its level (pacing.pace_news).
        if pace_news(self._told_pace, self._told_load_bound, self._told_pace_at, pace, load_bound, now):
            self._told_pace, self._told_load_bound, self._told_pace_at = pace, load_bound, now
            self.model.notices.add("information", pace_notice(live, pace, load_bound, pacer.busy, pacer.behind_s,
                                                              pacer.cpu_budget), now)
