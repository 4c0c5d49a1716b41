"""``flowtop run -- CMD``: run a command with the probe injected through sitecustomize.

Signals, the way a shell treats its foreground job: SIGINT and SIGQUIT (Ctrl-C,
Ctrl-\\) reach the whole foreground process group from the terminal, CMD included,
so ``flowtop run`` ignores them while CMD runs instead of forwarding a second copy;
SIGHUP (the terminal closed) also reaches the whole group, so it is ignored too and
``flowtop run`` returns CMD's status once CMD has reacted. SIGTERM, which is sent to
one process, is forwarded to CMD. To interrupt CMD from a script, signal the process
group (``kill -INT -PGID``) or send SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

import probe.wire as wire
from flowtop import settings
from flowtop.tools import peer_check
from flowtop.tools.listening import no_monitor_note
from flowtop.tools.relay_setup import client_keys

if TYPE_CHECKING:
    from flowtop.tools.relay_host import NodeRelay
    from flowtop.tools.relay_setup import PathLock

#: flowtop/tools/runner.py -> the directory holding flowtop/ and probe/ (checkout or site-packages).
BOOTSTRAP_DIR = Path(__file__).resolve().parents[2] / "probe" / "bootstrap"
#: Signals the terminal delivers to the whole foreground group: CMD gets them itself.
GROUP_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
#: Signals sent to ``flowtop run`` alone: passed on to CMD.
FORWARDED_SIGNALS = (signal.SIGTERM,)


def probe_env(
    base: Mapping[str, str], connect: str | None = None, job: str | None = None, curve_dir: str | None = None
) -> dict[str, str]:
    """The environment CMD runs in.

    PYTHONPATH becomes: the bootstrap directory (its ``sitecustomize`` must come first),
    the user's PYTHONPATH, then the directory holding the ``probe`` package (site-packages,
    or the source tree of an editable install) — last, so that a child interpreter that
    lacks ``probe`` can still import it but it never shadows the user's own modules.
    """
    env = dict(base)
    package_root = str(BOOTSTRAP_DIR.parent.parent)
    parts = [str(BOOTSTRAP_DIR)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    parts.append(package_root)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if connect:
        settings.PROBE_ADDR.put(env, connect)
    env.setdefault(settings.PROBE_ADDR.name, wire.DEFAULT_ADDR)
    if job:
        settings.PROBE_JOB.put(env, job)
    if curve_dir:
        settings.PROBE_CURVE_DIR.put(env, os.path.abspath(curve_dir))
    return env


def run(cmd: list[str], connect: str | None = None, job: str | None = None, curve_dir: str | None = None,
        relay: str = "auto") -> int:
    """Run ``cmd`` to completion and return its exit code (signals: see the module docstring).

    ``relay`` (auto/on/off): the ranks reach the monitor through the node's relay, hosted by
    whichever ``flowtop run`` of the node holds its lock (flowtop.tools.relay_host)."""
    if not cmd:
        print("flowtop run: no command given (usage: flowtop run [--connect ADDR] -- CMD ARGS...)", file=sys.stderr)
        return 2
    from flowtop.tools import relay_host

    if connect is not None and not connect.strip():  # `--connect "$MONITOR"` with the variable unset
        print("flowtop run: --connect was given an empty address (expected tcp://HOST:PORT); "
              f"leave it out for {settings.ADDR.name} or the default", file=sys.stderr)
        return 2
    bad_job = wire.job_id_problem(job) if job is not None else ""
    if bad_job:  # every frame of it would be refused: the whole training invisible
        print(f"flowtop run: --job {job!r} {bad_job}", file=sys.stderr)
        return 2
    upstream = connect or settings.ADDR.read()
    keys = curve_dir or settings.CURVE_DIR.read()
    why = bad_upstream(upstream, "--connect" if connect else settings.ADDR.name) or bad_keys(keys)
    if why:  # before CMD starts: its ranks would fall back to the default address, or send nothing
        print(f"flowtop run: {why}", file=sys.stderr)
        return 2
    node = relay_host.for_run(relay, upstream, keys)
    env = probe_env(os.environ, node.address if node else connect, job, None if node else curve_dir)
    if node is not None:
        env.pop(settings.PROBE_CURVE_DIR.name, None)  # the relay holds the keys upstream; its ranks talk over ipc
    turn = _check_turn(node)
    note = no_monitor_note(upstream, keys) if turn.mine else None
    if note:
        print(f"flowtop run: {note}", file=sys.stderr)
    # Where something listens: is it a flowtop monitor? (flowtop.tools.peer_check; said once, CMD not held up)
    end_check = _check_peer(upstream, keys, turn.lock) if turn.mine and not note else None
    try:
        return _run_child(cmd, env)
    finally:
        if end_check is not None:
            end_check()
        elif turn.lock is not None:  # held while CMD runs: the node's later runs have been spoken for
            turn.lock.release()
        if node is not None:
            node.stop()  # hand the node's relay to another flowtop run, if one still runs


@dataclass(frozen=True)
class CheckTurn:
    """Whether this ``flowtop run`` says the upstream notes (nothing listens, or not a flowtop
    monitor) and checks the peer: the one holding the node's check lock (``lock``) where the
    node's ranks share a relay, any run that connects directly."""

    mine: bool
    lock: "PathLock | None"


def _check_turn(node: "NodeRelay | None") -> CheckTurn:
    """Once per node where the node's ranks share a relay: with ``srun`` starting a ``flowtop
    run`` per rank, 4,096 checks hit the monitor at once (each a handshake, its ZAP request
    answered on the monitor's loop) to say one thing, and every run printed the same "no monitor
    listens" note (a trial: one line per rank of the node); the run holding the node's check lock
    speaks and checks for all."""
    from flowtop.tools.relay_setup import PathLock

    if node is None:
        return CheckTurn(True, None)
    lock = PathLock(node.address[len("ipc://"):] + ".check")
    try:
        if not lock.acquire(blocking=False):
            return CheckTurn(False, None)  # another flowtop run of this node speaks for it
    except OSError:
        return CheckTurn(True, None)  # no lock to share: check anyway
    return CheckTurn(True, lock)


def _check_peer(upstream: str, keys: str | None, lock: "PathLock | None") -> Callable[[], None]:
    """Start the peer check; what ends it (and releases the node's check lock, if held)."""
    end_check = peer_check.start_check(upstream, client_keys(keys))

    def end() -> None:
        end_check()
        if lock is not None:
            lock.release()

    return end


def bad_upstream(addr: str, source: str) -> str | None:
    """Why ranks cannot be sent to ``addr`` (from ``source``, a flag or a variable), or None: the
    monitor's ``tcp://HOST:PORT`` or a relay's ``ipc:///PATH``. The probe would take anything
    with a ``://`` in it and fail to connect later, or fall back to the default address."""
    from flowtop.monitor.collector import AddressError, parse_tcp

    if addr.startswith("ipc://") and len(addr) > len("ipc://"):
        path = addr[len("ipc://"):]
        folder = os.path.dirname(path) or "."
        if not path.startswith("@") and not os.path.isdir(folder):  # (@: a Linux abstract socket, no file)
            # no relay can listen there: the ranks would wait forever
            return (f"bad address {addr!r} ({source}): its directory {folder} does not exist (an ipc:// upstream "
                    "is a node relay's socket, e.g. flowtop relay --listen ipc:///tmp/flowtop-relay.sock)")
        return None
    try:
        parse_tcp(addr)
    except AddressError:
        return (f"bad address {addr!r} ({source}): expected tcp://HOST:PORT (PORT 1-65535, IPv6 as [::1]) "
                "or ipc:///PATH (a node relay)")
    return None


def bad_keys(curve_dir: str | None) -> str | None:
    """Why the CURVE keys in ``curve_dir`` cannot be used, or None (none given, or they load)."""
    from flowtop.tools.relay import RelayError, client_keys

    try:
        client_keys(curve_dir)
    except RelayError as exc:
        return str(exc)
    return None


def _run_child(cmd: list[str], env: dict[str, str]) -> int:
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        print(f"flowtop run: cannot start {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    # Installed only now: a signal ignored before the fork would stay ignored in CMD.
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in GROUP_SIGNALS}
    previous.update({s: signal.signal(s, forward) for s in FORWARDED_SIGNALS})
    try:
        code = child.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    # A child killed by a signal: report it the way a shell does.
    return code if code >= 0 else 128 - code
