"""A bye on SIGTERM that never keeps a rank alive.

torchrun tearing a job down and Slurm's ``scancel`` send SIGTERM, which ends Python without
atexit: the rank would only ever look stale. A plain Python handler runs only when the main
thread is back in Python, so a rank hung inside a collective would no longer die of SIGTERM
at once. Here the signal is seen by the probe's sender thread instead, through Python's
signal wakeup fd (its poll wakes on it): it says bye, restores the default disposition (libc,
callable from any thread) and re-raises, so the process dies of SIGTERM exactly as it would
without the probe, within about 0.3 s, wherever its main thread is. A Python handler stays as the fallback for
when the sender thread cannot act.

Acts only while its handler is still the installed one: a handler set later (Lightning's
graceful stop, a user's checkpoint-on-SIGTERM) decides, even if it calls ours as the previous
one. Installed only where nobody handles SIGTERM and nobody uses the wakeup fd (asyncio does when a
loop with signal handlers runs in the main thread); a forked child (DataLoader worker) drops
the wakeup fd at once, or its signals would reach the parent's sender thread.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

from probe._log import warn_once

_state: dict[str, Any] = {}


def install(on_term: Callable[[str], None], watch_fd: Callable[[int, Callable[[bytes], None]], None]) -> bool:
    """Watch for SIGTERM (main thread only). ``on_term(reason)`` says bye and returns within
    ~0.5 s; ``watch_fd(fd, reader)`` has the sender thread call ``reader`` with what the wakeup
    pipe holds as soon as it is written (Publisher.watch_fd). True when the watch is set."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False  # the user's (or a framework's) handler decides
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    if previous != -1:  # somebody else reads signals this way: leave it to them
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        return False
    _state.update(read=r, write=w, done=threading.Lock(), on_term=on_term)
    signal.signal(signal.SIGTERM, _main_thread_handler)
    if not _state.get("fork_hooks"):
        # A child signalled before its after-fork hook ran would write into the pipe it shares
        # with us: SIGTERM stays blocked across fork until the child has dropped the pipe.
        os.register_at_fork(before=_block, after_in_parent=_unblock)
        _state["fork_hooks"] = True
    watch_fd(r, _watch)
    return True


def _no_bye(reason: str) -> None:
    """A detached probe's: it has said bye; the signal still kills as it would have."""


def release() -> None:
    """The probe detached: its handler no longer holds it (nor, through it, the user's model)."""
    if "on_term" in _state:
        _state["on_term"] = _no_bye


def after_fork_in_child() -> None:
    """A forked child must not write its signals into the parent's pipe."""
    fds = (_state.get("read"), _state.get("write"))
    if fds[0] is None:
        _unblock()
        return
    blocked = _state.get("blocked", False)
    _state.clear()
    _state["blocked"] = blocked  # the mask came over with fork: undone below
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):
        pass
    for fd in fds:
        try:
            os.close(fd)  # type: ignore[arg-type]
        except OSError:
            pass
    _unblock()  # a SIGTERM that came meanwhile is delivered now, to this child, by default


def _block() -> None:
    if _state.get("read") is not None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            _state["blocked"] = True
        except (OSError, ValueError):
            pass


def _unblock() -> None:
    if _state.pop("blocked", False):
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        except (OSError, ValueError):
            pass


def _watch(data: bytes) -> None:
    """Sender thread, with what the wakeup pipe held: a SIGTERM byte -> bye, then die of the
    signal (other signals' bytes are Python's business: their handlers run anyway)."""
    if signal.SIGTERM in data and _still_ours():
        _terminate()


def _main_thread_handler(signum: int, frame: Any) -> None:
    if _still_ours():
        _terminate()


def _still_ours() -> bool:
    """Whether SIGTERM is still ours alone. A handler installed later (Lightning's stops the
    trainer gracefully and then calls the one it found: ours) or SIG_IGN decides instead: the
    process is not dying, so neither a bye nor a kill may follow."""
    try:
        return signal.getsignal(signal.SIGTERM) is _main_thread_handler
    except Exception:  # noqa: BLE001 - when in doubt, do nothing
        return False


def _terminate() -> None:
    """Say bye once (whichever thread gets here first), then die of SIGTERM."""
    lock = _state.get("done")
    if lock is None or not lock.acquire(blocking=False):
        return
    try:
        _state["on_term"]("SIGTERM")
        # libzmq's I/O thread writes the bye after send() returns: give it a moment before the
        # process dies (a loaded machine lost the bye otherwise), well inside torchrun's grace.
        time.sleep(0.3)
    except Exception as exc:  # noqa: BLE001 - dying must not depend on the bye
        warn_once("sigterm-bye", f"no bye on SIGTERM: {exc}")
    finally:
        _die()


def _die() -> None:
    """Default disposition back, from any thread (libc), and the signal again."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(int(signal.SIGTERM), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # delivery is asynchronous
    finally:
        os._exit(128 + int(signal.SIGTERM))  # only if the signal could not end us
