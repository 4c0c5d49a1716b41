"""How a training process ends, for its bye: cleanly, or failing (and of what).

The monitor shows a rank whose bye starts with probe.wire.BYE_ERROR_PREFIX as "failed", not
"done". Two ways a process ends failing are seen here:

* an exception nobody caught (a crashed rank, one whose collective failed when a peer died):
  Python keeps it in ``sys.last_value`` before it runs atexit (never one of another thread,
  which does not end the process);
* a non-zero ``sys.exit`` — where a wrapper caught the rank's exception and exits with a status
  (torch.multiprocessing.spawn's worker, Hydra's main, ``except: log; sys.exit(1)``), which
  leaves nothing in ``sys.last_value``: :func:`watch_exit` wraps ``sys.exit`` (same behaviour,
  it raises SystemExit as before) to note the status and the exception being handled.

A process's exit status itself is not known inside it: ``raise SystemExit(1)`` or ``os._exit``
go unseen (the latter says no bye at all), and a non-zero ``sys.exit`` that something caught
before a clean exit still reads as failing. Standard library only; never raises.
"""

from __future__ import annotations

import sys
from typing import Any

#: Set by the sys.exit wrapper: why a process asked to exit with a non-zero status.
_exit_failure: str | None = None
_exit_described = False  # whether _exit_failure names an exception (not a bare status)
_real_exit: Any = None


def reason() -> str:
    """The bye's reason at exit: "exit", "interrupted" (Ctrl-C), or "error: ..." (see module doc).
    An interactive session keeps its last error whatever came after: it says "exit"."""
    try:
        if hasattr(sys, "ps1") or sys.flags.interactive:
            return "exit"
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if isinstance(exc, KeyboardInterrupt):
            return "interrupted"
        if exc is not None:
            return _error(describe(exc))
        return _error(_exit_failure) if _exit_failure else "exit"
    except Exception:  # never into training's exit
        return "exit"


def describe(exc: BaseException) -> str:
    """``TYPE: message`` on one line (a table cell, a log line); the type alone when its text fails."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        text = type(exc).__name__
    return " ".join(text.split())


def _error(text: str) -> str:
    from probe.wire import BYE_ERROR_PREFIX

    return BYE_ERROR_PREFIX + text[:200]  # the wire takes 256


def watch_exit() -> None:
    """Wrap ``sys.exit`` once (see module doc)."""
    global _real_exit
    if _real_exit is not None:
        return
    real = _real_exit = sys.exit

    def exit(status: object = None) -> None:  # noqa: A001 (sys.exit's own name)
        try:
            _note_exit(status)
        except Exception:
            pass
        real(status)  # type: ignore[arg-type]  # whatever it was given, as before

    exit.__doc__ = real.__doc__
    exit.__wrapped__ = real  # type: ignore[attr-defined]
    sys.exit = exit  # type: ignore[assignment]


def _note_exit(status: object) -> None:
    """Note a failing status: the exception being handled when there is one (it wins over a bare
    status noted before), else the status, unless one was noted already — a spawned process's
    bootstrap exits again with the status its rank's wrapper exited with (the first is the why)."""
    global _exit_failure, _exit_described
    if status is None or status == 0 or status is False:
        return
    handled = sys.exc_info()[1]
    if handled is not None and not isinstance(handled, (SystemExit, KeyboardInterrupt)):
        if not _exit_described:
            _exit_failure, _exit_described = describe(handled), True
    elif _exit_failure is None:
        # sys.exit("message"): status 1, the message printed
        _exit_failure = f"exit status {status}" if isinstance(status, int) else f"exit: {status}"
