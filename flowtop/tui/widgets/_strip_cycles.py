"""Keep Textual's strips out of reference cycles, so that a line the screen drops is freed at once.

Textual (8.2.8) caches what a strip gives for a crop or a division in the strip itself, and
``Strip.crop_extend`` / ``Strip.divide`` give the strip itself when the crop or the cut is its
whole extent. The compositor divides every line a widget renders at its region's edges, so each
line of a widget as wide as its region is "divided" into itself and holds itself in its own
cache. Each such line is cyclic garbage once replaced (~660 objects a refresh
of the rank view at 200×50: the strip, its seven caches, its segments), and the monitor freezes
its objects at each tick (flowtop.monitor.gcpolicy), so that garbage waited for the full
collection: live at 4,096 ranks 53,000-111,000 objects in 30 s, three quarters of them strips'
caches and segments (``gc.DEBUG_SAVEALL`` at the full collection, 2026-12-05).

:func:`install` wraps the two methods: when one gives back the strip itself, its cache of that
method is emptied (the answer costs nothing to find again), so no strip refers to itself. The
app installs it when it is made (FlowtopApp); it changes what is cached, never what is drawn.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from textual.strip import Strip

_INSTALLED = "_flowtop_no_self_cycles"


def _crop_extend_of(original: Callable[..., Strip]) -> Callable[..., Strip]:
    def crop_extend(self: Strip, start: int, end: int, style: Any) -> Strip:
        strip = original(self, start, end, style)
        if strip is self:
            self._crop_extend_cache.clear()
        return strip

    return crop_extend


def _divide_of(original: Callable[..., Any]) -> Callable[..., Any]:
    def divide(self: Strip, cuts: Iterable[int]) -> Any:
        strips = original(self, cuts)
        if len(strips) == 1 and strips[0] is self:
            self._divide_cache.clear()
        return strips

    return divide


def install() -> None:
    """Wrap ``Strip.crop_extend`` and ``Strip.divide`` (once per process)."""
    if getattr(Strip, _INSTALLED, False):
        return
    Strip.crop_extend = _crop_extend_of(Strip.crop_extend)  # type: ignore[method-assign]
    Strip.divide = _divide_of(Strip.divide)  # type: ignore[method-assign]
    setattr(Strip, _INSTALLED, True)
