"""flowtop's probe: the guest inside each training process.

Use with zero code change through ``flowtop run -- CMD`` or explicitly::

    import probe
    probe.attach()            # idempotent; configuration from FLOWTOP_* env vars
    ...
    probe.mark_step()         # only for loops that do not use torch.optim

The probe never blocks, slows or crashes training: failures are logged once and
the probe disables itself.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

from probe._log import warn_once

__all__ = ["attach", "detach", "mark_step", "is_attached", "VERSION"]

VERSION = "0.1.0"
_probe: Any = None
_fork_hook_installed = False


def attach(
    *,
    job: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    addr: str | None = None,
    flops_per_token: float | None = None,
) -> bool:
    """Attach the probe to this process (idempotent). Returns True when active.

    Arguments override what the environment says (torchrun variables and
    ``FLOWTOP_*``); ``flops_per_token`` gives the model-FLOPs estimate per token
    when the model's structure does not reveal it.
    """
    args = _AttachArgs(job, rank, world_size, local_rank, addr, flops_per_token)
    if _probe is None and _reimporting_main_in_child():
        # A spawn/forkserver child re-runs the parent's main module, so a top-level attach()
        # runs in every DataLoader worker too, which would then say hello as a rank of its
        # own. Here attach waits for this process to build an optimizer: workers never do,
        # and an mp.spawn training rank does before its first step.
        _defer_to_first_optimizer(args)
        return False
    return _attach_now(args)


@dataclass(frozen=True)
class _AttachArgs:
    """What :func:`attach` was told (kept for a deferred attach)."""

    job: str | None = None
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    addr: str | None = None
    flops_per_token: float | None = None


def _attach_now(args: _AttachArgs = _AttachArgs()) -> bool:
    """:func:`attach` without the multiprocessing-child check (the first optimizer was built)."""
    global _probe, _fork_hook_installed
    if _probe is not None:
        if args != _AttachArgs():
            warn_once("reattach", "probe.attach(...) arguments ignored: the probe was already attached "
                      "(by flowtop run at the first optimizer); set FLOWTOP_* variables instead")
        return True
    p = None
    try:
        import zmq  # noqa: F401  (without a transport there is nothing to attach for)

        from probe import config, identity
        from probe.runtime import Probe

        cfg = config.from_env()
        if not cfg.enabled:
            return False
        if args.addr is not None:
            cfg = config.from_env({**os.environ, config.ADDR.name: args.addr})
        if not _fork_hook_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_installed = True
        ident = identity.from_env(job=args.job, rank=args.rank, world_size=args.world_size,
                                  local_rank=args.local_rank)
        p = Probe(cfg, ident, args.flops_per_token, args, detach=detach)
        _probe = p
        p.install()
        atexit.register(_at_exit)
        _watch_exit()
        if cfg.bye_on_sigterm:
            _say_bye_on_sigterm(p)
        return True
    except Exception as exc:
        warn_once("attach", f"probe disabled: {type(exc).__name__}: {exc}")
        _probe = None
        if p is not None:  # half-installed: take the hooks and the sender down again
            try:
                p.close("attach failed")
            except Exception:
                pass
        return False


def _reimporting_main_in_child() -> bool:
    try:
        import multiprocessing

        # Only while a spawn/forkserver child re-imports the parent's main module (its process
        # object says it is inheriting then): an attach() inside an mp.spawn rank's function
        # attaches at once.
        return bool(getattr(multiprocessing.current_process(), "_inheriting", False))
    except Exception:
        return False


_deferred: _AttachArgs | None = None


def _defer_to_first_optimizer(args: _AttachArgs, optimizer_cls: Any = None) -> None:
    """Attach (with ``args``) when this process builds its first torch optimizer.

    Also how ``flowtop run``'s bootstrap attaches, passing ``torch.optim.Optimizer`` while
    ``torch.optim`` is still being imported. A second call before the first optimizer only
    replaces the arguments (an explicit attach()'s win over the bootstrap's defaults)."""
    global _deferred
    first = _deferred is None
    if first or args != _AttachArgs():
        _deferred = args
    if not first:
        return
    try:
        if optimizer_cls is None:
            import torch.optim

            optimizer_cls = torch.optim.Optimizer
        cls = optimizer_cls
        original = cls.__init__

        def __init__(self: Any, *args: Any, **kw: Any) -> None:
            original(self, *args, **kw)
            if cls.__init__ is __init__:
                cls.__init__ = original
            _attach_deferred()

        cls.__init__ = __init__
    except Exception as exc:
        warn_once("attach-deferred", f"probe not attached in this child process: {exc}")


def _attach_deferred() -> None:
    global _deferred
    args, _deferred = _deferred, None
    if _probe is not None or args is None:
        return
    try:
        # A training rank (it builds an optimizer), not a worker: attach for real.
        _attach_now(args)
    except Exception as exc:
        warn_once("attach", f"probe disabled: {type(exc).__name__}: {exc}")


def mark_step() -> None:
    """Mark the end of a training step (for loops without ``torch.optim``)."""
    p = _probe
    if p is None:
        return
    try:
        p.tracker.mark()
    except Exception as exc:
        warn_once("mark_step", f"mark_step failed, probe disabled: {exc}")
        detach()


def detach(reason: str = "detached") -> None:
    """Remove all hooks, say bye to the monitor and stop the sender thread."""
    global _probe
    p, _probe = _probe, None
    if p is None:
        return
    try:
        p.close(reason)
    except Exception as exc:
        warn_once("detach", f"detach failed: {exc}")
    try:
        from probe.transport import sigterm

        sigterm.release()
    except Exception as exc:
        warn_once("detach-sigterm", f"SIGTERM handler not released: {exc}")


def is_attached() -> bool:
    """Whether the probe is active in this process."""
    return _probe is not None


def _current() -> Any:
    """The active runtime (tests and the bench use it); None when detached."""
    return _probe


def _at_exit() -> None:
    from probe import ending

    detach(ending.reason())


def _watch_exit() -> None:
    """A failing sys.exit is told in the bye (probe.ending): never into training."""
    try:
        from probe import ending

        ending.watch_exit()
    except Exception as exc:
        warn_once("watch-exit", f"a failing exit will read as a clean one: {exc}")


def _say_bye_on_sigterm(p: Any) -> None:
    """SIGTERM (torchrun tearing a job down, Slurm's scancel) ends Python without atexit, so the
    rank would only ever look stale: say bye first, then die of the signal as before (same exit
    status, as promptly), wherever the main thread is (probe.transport.sigterm). A handler of the
    user's is left alone."""
    try:
        from probe.transport import sigterm

        sigterm.install(p.on_sigterm, p.publisher.watch_fd)
    except Exception as exc:  # never into training
        warn_once("sigterm", f"no bye on SIGTERM: {exc}")


def _after_fork_in_child() -> None:
    # DataLoader workers fork the rank: an inherited ZeroMQ socket must not be used.
    global _probe
    p, _probe = _probe, None
    try:
        from probe.transport import sigterm

        sigterm.after_fork_in_child()  # before anything else: its signals are its own
    except Exception:
        pass
    if p is not None:
        try:
            p.abandon_in_child()
        except Exception:
            pass
